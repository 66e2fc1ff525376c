"""A Responses-API response as it is made: its request's echo, its output items, its status
(the response object GET returns and a stream's events carry)."""

from __future__ import annotations

import time

from agent_memory.api.responses.reply import usage_dict
from agent_memory.api.responses.schemas import ResponsesRequest
from agent_memory.engine.requests import Finished, SamplingParams, Usage


class Draft:
    """One response as it is made: its request's echo, its output items, its status."""

    def __init__(self, model_id: str, body: ResponsesRequest, response_id: str, params: SamplingParams, count) -> None:
        self.model_id, self.body, self.id = model_id, body, response_id
        self.params = params  # what it samples with (the model's defaults filled in)
        self.count = count  # text -> its tokens (the reasoning's, for usage)
        self.reasoning = ""
        self.created = int(time.time())
        self.output: list[dict] = []

    def object(self, status: str, usage: Usage | None = None, reason: str | None = None) -> dict:
        body = self.body
        tools = [t.model_dump(exclude_none=True) for t in body.tools]
        choice = body.tool_choice if isinstance(body.tool_choice, str) else body.tool_choice.model_dump()
        return {
            "id": self.id,
            "object": "response",
            "created_at": self.created,
            "status": status,
            "completed_at": int(time.time()) if status in ("completed", "incomplete") else None,
            "background": False,
            "error": None,
            "incomplete_details": {"reason": "max_output_tokens"} if reason == "length" else None,
            "instructions": body.instructions,
            "max_output_tokens": body.max_output_tokens,
            "max_tool_calls": None,
            "model": self.model_id,
            "output": self.output if status != "in_progress" else [],
            "parallel_tool_calls": body.parallel_tool_calls,
            "previous_response_id": body.previous_response_id,
            "prompt_cache_key": body.prompt_cache_key,
            "reasoning": {"effort": body.reasoning.effort if body.reasoning else None, "summary": None},
            "store": body.store,
            "temperature": self.params.temperature,
            "text": {"format": body.text.format.model_dump(by_alias=True, exclude_none=True), "verbosity": "medium"},
            "tool_choice": choice,
            "tools": tools,
            "top_p": self.params.top_p,
            "top_logprobs": body.top_logprobs or 0,
            "truncation": "disabled",
            "usage": usage_dict(usage, self.reasoning_tokens(usage)) if usage is not None else None,
            "user": body.user,
            "metadata": body.metadata or {},
        }

    def reasoning_tokens(self, usage: Usage) -> int:
        """The reasoning's tokens, as the tokenizer writes its text (never more than were written)."""
        return min(self.count(self.reasoning), usage.completion_tokens) if self.reasoning else 0

    @staticmethod
    def status(finished: Finished) -> str:
        return "incomplete" if finished.reason == "length" else "completed"

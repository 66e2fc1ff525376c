"""`/v1/chat/completions` as a wire format (serving/wire.py): its body as a Conversation (tools,
`tool_choice`, `response_format`, template variables) and the engine's events as chat chunks
or one chat.completion (reply.py's ChatReply, one per sample)."""

from __future__ import annotations

import time
import uuid
from collections.abc import AsyncIterator

from fastapi import Request

from agent_memory.api.errors import APIError
from agent_memory.api.logprobs import LogprobWriter
from agent_memory.api.openai.reply import ChatReply, total_usage, usage_dict
from agent_memory.api.openai.schemas import ChatCompletionRequest, NamedToolChoice
from agent_memory.api.openai.shared import CompletionStream, finished_samples, openai_asked
from agent_memory.api.serving.prompt import Prepared, prepare_chat, reply_reader, token_counter
from agent_memory.api.serving.wire import Admitted, WireFormat
from agent_memory.api.state import ServedModel
from agent_memory.chat.conversation import (
    Conversation,
    OutputFormat,
    Tool,
    ToolCall,
    ToolChoice,
    effort_thinking,
    with_parts,
)
from agent_memory.chat.render import TemplateVariableError, check_variables
from agent_memory.engine.requests import Event, Finished


def conversation(body: ChatCompletionRequest) -> Conversation:
    messages = [
        with_parts(
            m.template_role(),
            m.parts(f"messages.{i}.content"),
            "",
            tool_calls=[ToolCall(c.id, c.function.name, c.function.arguments) for c in m.tool_calls or []],
            tool_call_id=m.tool_call_id,
            reasoning=(m.reasoning_content or m.reasoning or "") if m.role == "assistant" else "",
        )
        for i, m in enumerate(body.messages)
    ]
    tools = [Tool(t.function.name, t.function.description, t.function.parameters or {}) for t in body.tools or []]
    choice = body.tool_choice or ("auto" if tools else "none")
    if isinstance(choice, NamedToolChoice):
        choice = ToolChoice("named", choice.function.name)
    else:
        choice = ToolChoice(choice)
    fmt = body.response_format
    output = OutputFormat()
    if fmt is not None and fmt.type == "json_object":
        output = OutputFormat("json_object")
    elif fmt is not None and fmt.type == "json_schema":
        output = OutputFormat("json_schema", fmt.json_schema.schema_)
    variables = body.chat_template_kwargs or {}
    try:  # the template's variables only: never the template or its renderer's arguments
        check_variables(variables, "chat_template_kwargs")
    except TemplateVariableError as e:
        raise APIError(400, str(e), param=e.param) from e
    thinking = effort_thinking(body.reasoning_effort, variables)
    return Conversation(messages, tools, choice, body.parallel_tool_calls, output, thinking)


class ChatCompletion(WireFormat):
    def __init__(self, body: ChatCompletionRequest, request: Request) -> None:
        self.body = body
        self.asked = openai_asked(body, request)

    async def prompt(self, model: ServedModel) -> Prepared:
        return await prepare_chat(model, conversation(self.body))

    def answer(self, model: ServedModel, prepared: Prepared, admitted: Admitted) -> ChatAnswer:
        return ChatAnswer(model, prepared, self.body)


class ChatAnswer:
    """A chat completion's n choices, streamed as chunks or whole as one object."""

    def __init__(self, model: ServedModel, prepared: Prepared, body: ChatCompletionRequest) -> None:
        self.headers: dict[str, str] = {}
        self.model = model.answering(body.model)
        completion_id = "chatcmpl-" + uuid.uuid4().hex
        self.sse = CompletionStream.of(completion_id, "chat.completion.chunk", self.model, body.include_usage())
        writer = LogprobWriter(model.counter) if body.logprobs else None
        count = token_counter(model)
        self.replies = [ChatReply(reply_reader(model, prepared), count, i, writer) for i in range(body.n)]

    def returned(self) -> Message | None:
        """The reply as its client sends it back next turn, once whole: the first choice's
        (serving/settle.py; a request of n > 1 choices is not settled)."""
        return self.replies[0].returned()

    def usage(self, finished: list[Finished]) -> dict:
        reasoning = sum(self.replies[f.index].reasoning_tokens(f.usage) for f in finished)
        return usage_dict(total_usage(finished), reasoning)

    def stream(self, events: AsyncIterator[Event]) -> AsyncIterator[str]:
        first = [r.first_chunk() for r in self.replies]
        return self.sse.frames(events, first, lambda event: self.replies[event.index].feed(event), self.usage)

    def body(self, events: list[Event]) -> dict:
        finished = finished_samples(events)
        for event in events:
            self.replies[event.index].feed(event)
        return {
            "id": self.sse.completion_id,
            "object": "chat.completion",
            "created": int(time.time()),
            "model": self.model,
            "choices": [r.choice(f) for r, f in zip(self.replies, finished)],
            "usage": self.usage(finished),
        }

"""The OpenAI Responses wire format: `POST /v1/responses` (JSON or the `response.*` event
stream), `GET` and `DELETE /v1/responses/{id}`.

A stored response (`store`, true by default) keeps its whole conversation — the chain it
continues, its input, its output — and its KV under its own id (store.py), so a
follow-up that sends only `previous_response_id` and new input prefills only that input, also
after a restart. Instructions are not carried over, as OpenAI specifies.
"""

from __future__ import annotations

import logging
import time
from collections.abc import AsyncIterator

from fastapi import APIRouter, Depends, Request, Response
from fastapi.responses import JSONResponse, StreamingResponse

from agent_memory.agent_key import RESPONSE, AgentKey
from agent_memory.api import pipeline
from agent_memory.api.errors import APIError, ErrorShape
from agent_memory.api.logprobs import LogprobWriter
from agent_memory.api.responses.reply import Reply, new_id, usage_dict
from agent_memory.api.responses.schemas import ResponsesRequest, input_messages
from agent_memory.api.responses.store import ResponseStore, StoredResponse
from agent_memory.api.sealing import REASONING, Sealer, request_sealer
from agent_memory.api.state import ServedModel, ServerState, ready_state
from agent_memory.chat.conversation import Conversation, Message
from agent_memory.engine.requests import Failed, Finished, GenerationRequest, SamplingParams, Usage

router = APIRouter()
log = logging.getLogger(__name__)
IGNORED_HEADER = "x-agent-memory-ignored-tools"  # the hosted tools a request offered, left out
_IGNORED_SAID: set[str] = set()  # hosted tool types already logged
ERROR_SHAPES: dict[str, ErrorShape] = {}  # OpenAI's shape, as every route's unless claimed


def stored_responses(request: Request) -> ResponseStore:
    """The store create_app keeps the responses in."""
    return request.app.state.responses


class Draft:
    """One response as it is made: its request's echo, its output items, its status."""

    def __init__(self, model_id: str, body: ResponsesRequest, response_id: str, count) -> None:
        self.model_id, self.body, self.id = model_id, body, response_id
        self.count = count  # text -> its tokens (the reasoning's, for usage)
        self.reasoning = ""
        self.created = int(time.time())
        self.output: list[dict] = []
        self.params: SamplingParams | None = None  # what it samples with, once the request is made

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
            "temperature": self.params.temperature if self.params else body.temperature,
            "text": {"format": body.text.format.model_dump(by_alias=True, exclude_none=True), "verbosity": "medium"},
            "tool_choice": choice,
            "tools": tools,
            "top_p": self.params.top_p if self.params else body.top_p,
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


def _reply(reply: Reply) -> Message:
    """This turn's output as the next turn will render it (reasoning, text as written, calls)."""
    return Message("assistant", reply.text, list(reply.calls), reasoning="".join(reply.reasoning))


@router.post("/v1/responses")
async def create_response(
    body: ResponsesRequest,
    request: Request,
    state: ServerState = Depends(ready_state),
    store: ResponseStore = Depends(stored_responses),
    sealer: Sealer = Depends(request_sealer),
):
    tenant = pipeline.tenant(request)
    seal = sealer.for_tenant(tenant, REASONING)
    context: list[Message] = []
    if body.previous_response_id is not None:
        previous = store.get(tenant, body.previous_response_id)
        if previous is None:
            raise APIError(
                400,
                f"Previous response with id '{body.previous_response_id}' not found.",
                param="previous_response_id",
                code="previous_response_not_found",
            )
        context = list(previous.context)
    context += input_messages(body.input, seal, context)
    tools, choice, output_format = body.conversation_tools()
    system = [Message("system", body.instructions)] if body.instructions else []
    conv = Conversation(system + context, tools, choice, body.parallel_tool_calls, output_format, body.thinking())
    model = state.model_for(body.model)
    prepared = await pipeline.prepare_chat(model, conv, ("input", "tools", "text.format"))
    draft = Draft(model.id, body, new_id("resp"), pipeline.token_counter(model))
    # A stored response is the unit of memory: its own agent, named by its id.
    agent = AgentKey(draft.id, tenant, RESPONSE) if body.store else pipeline.openai_agent(body, request)
    sampling = {"temperature": body.temperature, "top_p": body.top_p, "logprobs": body.top_logprobs_asked()}
    generation = pipeline.generation_request(
        state,
        model,
        prepared.prompt,
        agent,
        body.max_output_tokens,
        sampling,
        request,
        "input",
        prepared.grammar,
        body.cache_salt,
    )
    draft.params = generation.params
    reader = pipeline.reply_reader(model, conv, prepared)
    writer = LogprobWriter(model.counter) if body.top_logprobs_asked() is not None else None
    reply = Reply(
        draft.output, reader, body.namespaced(), seal.seal if body.sealed else None, body.custom_tools(), writer
    )
    ignored = body.ignored_tools()
    headers = {IGNORED_HEADER: ", ".join(ignored)} if ignored else {}
    for kind in ignored:
        if kind not in _IGNORED_SAID:
            _IGNORED_SAID.add(kind)
            log.info("the %s tool is one this server cannot run: it is left out of what the model sees", kind)

    def keep(finished: Finished) -> dict:
        draft.reasoning = "".join(reply.reasoning)
        result = draft.object(Draft.status(finished), finished.usage, finished.reason)
        if body.store:
            store.put(StoredResponse(draft.id, tenant, context + [_reply(reply)], result))
        return result

    if body.stream:
        stream = _stream(state, model, generation, draft, reply, keep)
        return StreamingResponse(stream, media_type="text/event-stream", headers=headers)
    collected = await pipeline.collect(state, model, generation, request)
    if collected is None:
        return Response(status_code=499)
    finished = collected[-1]
    reply.feed(pipeline.merged(collected))
    reply.feed(finished)
    return JSONResponse(keep(finished), headers=headers)


async def _stream(
    state: ServerState, model: ServedModel, generation: GenerationRequest, draft: Draft, reply: Reply, keep
) -> AsyncIterator[str]:
    """The `response.*` events: created and in_progress at once, then each output item opened,
    filled (text deltas or argument deltas) and closed in turn (reply.py), then completed."""
    yield reply.event("response.created", response=draft.object("in_progress"))
    yield reply.event("response.in_progress", response=draft.object("in_progress"))
    async for engine_event in pipeline.events(state, model, generation):
        if isinstance(engine_event, Failed):
            yield reply.event("error", code=engine_event.code, message=engine_event.message, param=None)
            failed = {**draft.object("failed"), "error": {"code": "server_error", "message": engine_event.message}}
            yield reply.event("response.failed", response=failed)
            return
        for frame in reply.feed(engine_event):
            yield frame
        if isinstance(engine_event, Finished):
            result = keep(engine_event)
            yield reply.event("response.completed" if result["status"] == "completed" else "response.incomplete", response=result)


@router.get("/v1/responses/{response_id}", dependencies=[Depends(ready_state)])
async def get_response(response_id: str, request: Request, store: ResponseStore = Depends(stored_responses)) -> dict:
    stored = store.get(pipeline.tenant(request), response_id)
    if stored is None:
        raise APIError(404, f"No response with id '{response_id}'.", param="response_id", code="response_not_found")
    return stored.body


@router.delete("/v1/responses/{response_id}", dependencies=[Depends(ready_state)])
async def delete_response(response_id: str, request: Request, store: ResponseStore = Depends(stored_responses)) -> dict:
    tenant = pipeline.tenant(request)
    if not store.delete(tenant, response_id):
        raise APIError(404, f"No response with id '{response_id}'.", param="response_id", code="response_not_found")
    return {"id": response_id, "object": "response.deleted", "deleted": True}

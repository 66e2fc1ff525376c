"""`POST /v1/responses` as a wire format (serving/wire.py). A stored response (`store`, true by
default) is the unit of memory: its own agent, named by its id, and its whole conversation —
the chain it continues, its input, its output — kept under that id (store.py), so a follow-up
that sends only `previous_response_id` and new input prefills only that input, also after a
restart. The engine's events become output items (reply.py) in a Draft: the `response.*`
event stream, or the response object."""

from __future__ import annotations

import logging
from collections.abc import AsyncIterator

from fastapi import Request

from agent_memory.agent_key import RESPONSE, AgentKey
from agent_memory.api.logprobs import LogprobWriter
from agent_memory.api.responses.conversation import context, conversation
from agent_memory.api.responses.draft import Draft
from agent_memory.api.responses.reply import Reply, new_id
from agent_memory.api.responses.schemas import ResponsesRequest
from agent_memory.api.responses.store import ResponseStore, StoredResponse
from agent_memory.api.sealing import REASONING, Sealer
from agent_memory.api.serving.controls import retention
from agent_memory.api.serving.events import merged
from agent_memory.api.serving.prompt import Prepared, prepare_chat, reply_reader, token_counter
from agent_memory.api.serving.speaker import openai_agent, tenant
from agent_memory.api.serving.wire import Admitted, Asked, WireFormat
from agent_memory.api.state import ServedModel
from agent_memory.chat.conversation import Message
from agent_memory.engine.requests import Event, Failed, Finished, Sampling
from agent_memory.log_once import first_time

log = logging.getLogger(__name__)
IGNORED_HEADER = "x-agent-memory-ignored-tools"  # the hosted tools a request offered, left out


class CreateResponse(WireFormat):
    def __init__(self, body: ResponsesRequest, request: Request, store: ResponseStore, sealer: Sealer) -> None:
        self.body, self.store = body, store
        self.tenant = tenant(request)
        self.seal = sealer.for_tenant(self.tenant, REASONING)
        self.id = new_id("resp")
        agent = AgentKey(self.id, self.tenant, RESPONSE) if body.store else openai_agent(body, request)
        sampling = Sampling(temperature=body.temperature, top_p=body.top_p, logprobs=body.top_logprobs_asked())
        self.asked = Asked(
            body.model, agent, body.max_output_tokens, sampling, body.cache_salt, body.stream,
            remember=body.remember, retention=retention(body.prompt_cache_retention),
        )
        self.context: list[Message] = []  # the chain and the input, once read

    async def prompt(self, model: ServedModel) -> Prepared:
        self.context = context(self.body, self.store, self.tenant, self.seal)
        return await prepare_chat(model, conversation(self.body, self.context), ("input", "tools", "text.format"))

    def answer(self, model: ServedModel, prepared: Prepared, admitted: Admitted) -> ResponseAnswer:
        body = self.body
        draft = Draft(model.id, body, self.id, admitted.generation.params, token_counter(model))
        writer = LogprobWriter(model.counter) if body.top_logprobs_asked() is not None else None
        seal = self.seal.seal if body.sealed else None
        reply = Reply(draft.output, reply_reader(model, prepared), body.namespaced(), seal, body.custom_tools(), writer)
        return ResponseAnswer(self, draft, reply)


def _ignored(body: ResponsesRequest) -> dict[str, str]:
    """The response's header naming the hosted tools left out, each logged once."""
    ignored = body.ignored_tools()
    for kind in ignored:
        if first_time(("ignored tool", kind)):
            log.info("the %s tool is one this server cannot run: it is left out of what the model sees", kind)
    return {IGNORED_HEADER: ", ".join(ignored)} if ignored else {}


class ResponseAnswer:
    def __init__(self, wire: CreateResponse, draft: Draft, reply: Reply) -> None:
        self.wire, self.draft, self.reply = wire, draft, reply
        self.headers = _ignored(wire.body)

    def keep(self, finished: Finished) -> dict:
        """The finished response object, stored with its conversation when asked."""
        reply, wire = self.reply, self.wire
        self.draft.reasoning = "".join(reply.reasoning)
        result = self.draft.object(Draft.status(finished), finished.usage, finished.reason)
        if wire.body.store:
            wire.store.put(StoredResponse(self.draft.id, wire.tenant, wire.context + [reply.said()], result))
        return result

    def returned(self) -> Message | None:
        """The turn as the next request continues it (its stored chain, or its items sent back), once whole."""
        return self.reply.said() if self.reply.whole else None

    def body(self, events: list[Event]) -> dict:
        finished = events[-1]
        self.reply.feed(merged(events))
        self.reply.feed(finished)
        return self.keep(finished)

    async def stream(self, events: AsyncIterator[Event]) -> AsyncIterator[str]:
        """The `response.*` events: created and in_progress at once, then each output item opened,
        filled (text deltas or argument deltas) and closed in turn (reply.py), then completed."""
        reply, draft = self.reply, self.draft
        yield reply.event("response.created", response=draft.object("in_progress"))
        yield reply.event("response.in_progress", response=draft.object("in_progress"))
        async for engine_event in events:
            if isinstance(engine_event, Failed):
                yield reply.event("error", code=engine_event.code, message=engine_event.message, param=None)
                failed = {**draft.object("failed"), "error": {"code": "server_error", "message": engine_event.message}}
                yield reply.event("response.failed", response=failed)
                return
            for frame in reply.feed(engine_event):
                yield frame
            if isinstance(engine_event, Finished):
                result = self.keep(engine_event)
                done = "response.completed" if result["status"] == "completed" else "response.incomplete"
                yield reply.event(done, response=result)

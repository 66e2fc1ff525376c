"""`POST /v1/messages` as a wire format (serving/wire.py): the body's conversation and agent
(conversation.py), Anthropic's words for a prompt with no room, and the engine's events as
reply.py's content blocks: SSE events with pings while a prefill or a queue takes long, or one
Message. Usage: every prompt token a request computes is committed to the cache when it ends
(reply.usage_dict): `input_tokens`, the part never cached, is 0."""

from __future__ import annotations

from collections.abc import AsyncIterator

from fastapi import Request

from agent_memory.api.anthropic.breakpoints import positions
from agent_memory.api.anthropic.conversation import agent, conversation, prepare
from agent_memory.api.anthropic.reply import Reply, error_shape, sse
from agent_memory.api.anthropic.schemas import MessagesRequest
from agent_memory.api.keepalive import with_keepalive
from agent_memory.api.sealing import THINKING, Sealer
from agent_memory.api.serving.prompt import Prepared, reply_reader
from agent_memory.api.serving.speaker import tenant
from agent_memory.api.serving.wire import Admitted, Asked, WireFormat
from agent_memory.api.state import ServedModel
from agent_memory.chat.conversation import Message
from agent_memory.engine.requests import Event, Failed, Sampling

PING_SECONDS = 10.0  # a ping after this long without an event (Claude Code gives up after 300 s of silence)


def too_long(prompt_tokens: int, context: int) -> str:
    """Anthropic's wording, which Claude Code recognises (it offers to compact)."""
    return f"prompt is too long: {prompt_tokens} tokens > {context - 1} maximum"


class CreateMessage(WireFormat):
    def __init__(self, body: MessagesRequest, request: Request, sealer: Sealer) -> None:
        self.body = body
        self.seal = sealer.for_tenant(tenant(request), THINKING)
        stop = [s for s in body.stop_sequences or [] if s]
        sampling = Sampling(temperature=body.temperature, top_p=body.top_p, top_k=body.top_k, stop=stop)
        # Claude Code asks for 32k-64k tokens: more than the room left is the room left (as on
        # every API: serving/output_limit.py), and a reply that fills it ends with stop_reason
        # model_context_window_exceeded. 0 computes the prompt: one token, not returned.
        limit = max(1, body.max_tokens)
        speaker = agent(body, request)
        self.asked = Asked(
            body.model, speaker, limit, sampling, stream=body.stream, too_long=too_long, remember=body.remember
        )

    async def prompt(self, model: ServedModel) -> Prepared:
        prepared = await prepare(model, conversation(self.body, self.seal))
        if self.body.remember:  # cache_control breakpoints: where the engine stops and keeps (breakpoints.py)
            prepared.breakpoints = await positions(model, self.body, self.seal, prepared)
        return prepared

    def answer(self, model: ServedModel, prepared: Prepared, admitted: Admitted) -> MessageAnswer:
        clamped = admitted.output.clamped is not None
        prewarm = self.body.max_tokens == 0
        reply = Reply(self.body.model, reply_reader(model, prepared), clamped, prewarm, self.seal.seal)
        return MessageAnswer(reply)


class MessageAnswer:
    def __init__(self, reply: Reply) -> None:
        self.headers: dict[str, str] = {}
        self.reply = reply

    def returned(self) -> Message | None:
        return self.reply.returned()

    def stream(self, events: AsyncIterator[Event]) -> AsyncIterator[str]:
        return message_stream(events, self.reply)

    def body(self, events: list[Event]) -> dict:
        for event in events:
            self.reply.feed(event)
        return self.reply.message(events[-1])


async def message_stream(events: AsyncIterator[Event], reply: Reply) -> AsyncIterator[str]:
    """message_start at once; a ping whenever PING_SECONDS pass without an event (a long
    prefill, a queue); the blocks; message_delta and message_stop. A failure after the start
    is an `error` event."""
    yield sse("message_start", {"type": "message_start", "message": reply.message(None)})
    async for event in with_keepalive(events, PING_SECONDS):
        if event is None:
            yield sse("ping", {"type": "ping"})
        elif isinstance(event, Failed):
            yield sse("error", error_shape(event.status, event.message)[1])
            return
        else:
            for name, data in reply.feed(event):
                yield sse(name, data)

"""A request's engine events on the event loop: streamed as they come (`events`, leaving early
cancels its generation), or run to the end unless the client leaves first (`collect`)."""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator, Awaitable
from typing import TypeVar

from fastapi import Request

from agent_memory.api.access_log import shown_agent
from agent_memory.api.errors import failure
from agent_memory.api.state import ServedModel, ServerState
from agent_memory.engine.requests import Event, Failed, Finished, GenerationRequest, TextDelta

T = TypeVar("T")


async def events(state: ServerState, model: ServedModel, generation: GenerationRequest) -> AsyncIterator[Event]:
    """The engine's events for one request; leaving early cancels its generation."""
    loop = asyncio.get_running_loop()
    queue: asyncio.Queue[Event] = asyncio.Queue()

    def sink(event: Event) -> None:
        try:
            loop.call_soon_threadsafe(queue.put_nowait, event)
        except RuntimeError:  # the event loop has closed: nobody is listening any more
            pass

    request_id = model.engine.submit(generation, sink)
    trace = state.traces.get(generation, {})
    started = time.perf_counter()
    first: float | None = None
    done = False
    left = generation.params.n  # samples still to finish
    try:
        while not done:
            event = await queue.get()
            state.waiting.discard(generation)
            now = time.perf_counter()
            if first is None:
                first = now
                trace["ttft_ms"] = round((now - started) * 1000, 1)
            if isinstance(event, Finished):
                u = event.usage
                trace.update(cached_tokens=u.cached_tokens, hot_tokens=u.hot_tokens, warm_tokens=u.warm_tokens)
                trace.update(completion_tokens=u.completion_tokens, finish=event.reason)
                if u.agent is not None and generation.agent is None:  # it joined an unnamed conversation
                    trace["agent"] = shown_agent(u.agent, state.log_agent_ids)
                if u.miss is not None:
                    trace["miss"] = u.miss.logged()
                if u.accepted_prediction_tokens or u.rejected_prediction_tokens:
                    trace["accepted"] = (
                        f"{u.accepted_prediction_tokens}/{u.accepted_prediction_tokens + u.rejected_prediction_tokens}"
                    )
                if u.completion_tokens > 1 and now > first:
                    trace["tok_s"] = round((u.completion_tokens - 1) / (now - first), 1)
            elif isinstance(event, Failed):
                trace["finish"] = f"error ({event.code})"
            left -= isinstance(event, Finished)
            done = isinstance(event, Failed) or left == 0
            yield event
    finally:
        state.waiting.discard(generation)
        if not done:
            model.engine.cancel(request_id)


async def collect(
    state: ServerState, model: ServedModel, generation: GenerationRequest, request: Request
) -> list[Event] | None:
    """A request run to the end: its events, the last Finished (None: the client left first)."""

    async def consume() -> list[Event]:
        out = []
        async for event in events(state, model, generation):
            if isinstance(event, Failed):
                raise failure(event)
            out.append(event)
        return out

    return await unless_client_leaves(request, consume())


async def unless_client_leaves(request: Request, work: Awaitable[T]) -> T | None:
    """`work`'s result, or None once the client has left first (the work is then cancelled)."""

    async def disconnected() -> None:
        while (await request.receive())["type"] != "http.disconnect":
            pass

    task = asyncio.ensure_future(work)
    watch = asyncio.ensure_future(disconnected())
    await asyncio.wait({task, watch}, return_when=asyncio.FIRST_COMPLETED)
    if task.done():
        watch.cancel()
        return task.result()
    task.cancel()
    return None


def merged(events: list[Event], index: int = 0) -> TextDelta:
    """One sample's collected text and logprobs as one delta (a JSON reply's whole text)."""
    mine = [e for e in events if isinstance(e, TextDelta) and e.index == index]
    return TextDelta("".join(e.text for e in mine), [lp for e in mine for lp in e.logprobs or []], index)

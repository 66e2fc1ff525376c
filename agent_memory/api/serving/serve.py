"""The one path every generating route takes, whatever its wire format (as vLLM's
entrypoints/openai serving classes do over their EngineClient): the model, the prompt, the
engine's request, then the engine's events as a stream or, run to the end, as one JSON body;
a client that leaves first is a 499. A chat turn is settled (settle.py) before its last frame
or its body goes out."""

from __future__ import annotations

from fastapi import Request, Response
from fastapi.responses import JSONResponse, StreamingResponse

from agent_memory.agent_key import key_label
from agent_memory.api.serving.admit import admit
from agent_memory.api.serving.events import collect, events
from agent_memory.api.serving.settle import Settle
from agent_memory.api.serving.wire import WireFormat
from agent_memory.api.state import ServerState
from agent_memory.engine.requests import Event, Finished, GenerationRequest


async def serve(wire: WireFormat, request: Request, state: ServerState) -> Response:
    model = state.model_for(wire.asked.model)
    prepared = await wire.prompt(model)
    admitted = admit(state, model, request, prepared, wire.asked)
    answer = wire.answer(model, prepared, admitted)
    settle = Settle(model, prepared, admitted.generation, answer)
    if wire.asked.stream:
        frames = answer.stream(settle.events(events(state, model, admitted.generation)))
        return StreamingResponse(settle.frames(frames), media_type="text/event-stream", headers=answer.headers)
    collected = await collect(state, model, admitted.generation, request)
    if collected is None:
        return Response(status_code=499)
    body = answer.body(collected)
    await settle.after(next((e for e in reversed(collected) if isinstance(e, Finished)), None))
    return JSONResponse(body, headers={**answer.headers, **joined(admitted.generation, collected)})


def joined(generation: GenerationRequest, collected: list[Event]) -> dict[str, str]:
    """`X-Agent-Id` naming the unnamed conversation a request that named no agent joined
    (memory/index/conversations.py), marked `~`: the id /v1/agents shows it by."""
    agents = [e.usage.agent for e in collected if isinstance(e, Finished) and e.usage.agent is not None]
    if generation.agent is not None or not agents:
        return {}
    return {"X-Agent-Id": key_label(agents[0])}

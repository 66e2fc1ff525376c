"""Agent lifecycle over HTTP: list agents, show one, end one (frees what it alone holds), over
every served model's engine."""

from __future__ import annotations

import asyncio

from fastapi import APIRouter, Depends, Request

from agent_memory.agent_key import AgentKey
from agent_memory.api.errors import APIError
from agent_memory.api.pipeline import tenant
from agent_memory.api.state import ServerState, ready_state
from agent_memory.engine.protocol import AgentInfo, EngineClient

router = APIRouter()


def agent_dict(info: AgentInfo) -> dict:
    return {
        "id": info.id,
        "object": "agent",
        "tokens": info.tokens,
        "blocks": info.blocks,
        "snapshots": info.snapshots,
        "bytes": {
            "hot": info.hot_bytes,
            "hot_exact": info.exact_bytes,
            "hot_quantized": info.hot_bytes - info.exact_bytes - info.snapshot_bytes,
            "hot_snapshots": info.snapshot_bytes,
            "disk": info.disk_bytes,
        },
        "last_used": round(info.last_used, 3),
    }


@router.get("/v1/agents")
async def list_agents(request: Request, state: ServerState = Depends(ready_state)) -> dict:
    """The caller's tenant's agents (with one key or none: every agent)."""
    own = tenant(request)
    engines = _engines(state)
    agents = [info for engine in engines for info in await asyncio.to_thread(engine.agents, own)]
    # The server's totals are the shared namespace's to see, not a tenant's.
    totals = await asyncio.to_thread(_totals, engines) if not own else {}
    return {"object": "list", "data": [agent_dict(a) for a in agents], **totals}


@router.get("/v1/agents/{agent_id:path}")
async def get_agent(agent_id: str, request: Request, state: ServerState = Depends(ready_state)) -> dict:
    key = AgentKey(agent_id, tenant(request))
    found = [await asyncio.to_thread(engine.agent, key) for engine in _engines(state)]
    info = next((i for i in found if i is not None), None)
    if info is None:
        raise APIError(404, f"no agent '{agent_id}'", param="agent_id", code="agent_not_found")
    return agent_dict(info)


@router.delete("/v1/agents/{agent_id:path}")
async def delete_agent(agent_id: str, request: Request, state: ServerState = Depends(ready_state)) -> dict:
    # Freeing KV arrays is MLX work: each engine does it on its own thread.
    key = AgentKey(agent_id, tenant(request))
    ended = [await asyncio.wrap_future(engine.end_agent(key)) for engine in _engines(state)]
    if not any(ended):
        raise APIError(404, f"no agent '{agent_id}'", param="agent_id", code="agent_not_found")
    return {"id": agent_id, "object": "agent.deleted", "deleted": True}


def _engines(state: ServerState) -> list[EngineClient]:
    return [model.engine for model in state.models.values()]


def _totals(engines: list[EngineClient]) -> dict[str, int]:
    """The memory's figures, added up over the engines."""
    totals: dict[str, int] = {}
    for engine in engines:
        for name, value in engine.totals().items():
            totals[name] = totals.get(name, 0) + value
    return totals

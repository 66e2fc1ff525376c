"""Agent lifecycle over HTTP: list agents, show one, end one (frees what it alone holds)."""

from __future__ import annotations

import asyncio

from fastapi import APIRouter, Depends, Request

from agent_memory.agent_key import AgentKey
from agent_memory.api.errors import APIError
from agent_memory.api.pipeline import tenant
from agent_memory.api.state import ServerState, ready_state
from agent_memory.engine.protocol import AgentInfo

router = APIRouter()


def agent_dict(info: AgentInfo) -> dict:
    return {
        "id": info.id,
        "object": "agent",
        "tokens": info.tokens,
        "blocks": info.blocks,
        "bytes": {
            "hot": info.hot_bytes,
            "hot_exact": info.exact_bytes,
            "hot_quantized": info.hot_bytes - info.exact_bytes,
            "disk": info.disk_bytes,
        },
        "last_used": round(info.last_used, 3),
    }


@router.get("/v1/agents")
async def list_agents(request: Request, state: ServerState = Depends(ready_state)) -> dict:
    """The caller's tenant's agents (with one key or none: every agent)."""
    store = state.engine.store
    own = tenant(request)
    agents = await asyncio.to_thread(store.all_agents, own)
    # The server's totals are the shared namespace's to see, not a tenant's.
    totals = await asyncio.to_thread(store.totals) if not own else {}
    return {"object": "list", "data": [agent_dict(a) for a in agents], **totals}


@router.get("/v1/agents/{agent_id:path}")
async def get_agent(agent_id: str, request: Request, state: ServerState = Depends(ready_state)) -> dict:
    info = await asyncio.to_thread(state.engine.store.agent_info, AgentKey(agent_id, tenant(request)))
    if info is None:
        raise APIError(404, f"no agent '{agent_id}'", param="agent_id", code="agent_not_found")
    return agent_dict(info)


@router.delete("/v1/agents/{agent_id:path}")
async def delete_agent(agent_id: str, request: Request, state: ServerState = Depends(ready_state)) -> dict:
    # Freeing KV arrays is MLX work: it happens on the engine thread.
    ended = await asyncio.wrap_future(state.engine.end_agent(AgentKey(agent_id, tenant(request))))
    if not ended:
        raise APIError(404, f"no agent '{agent_id}'", param="agent_id", code="agent_not_found")
    return {"id": agent_id, "object": "agent.deleted", "deleted": True}

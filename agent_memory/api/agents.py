"""Agent lifecycle over HTTP: list agents, show one, end one (frees what it alone holds), over
every served model's engine. Unnamed conversations (memory/index/conversations.py) are agents
of kind "unnamed", listed with a `~` before their id and named by it with or without."""

from __future__ import annotations

import asyncio
import time

from fastapi import APIRouter, Depends, Request
from starlette.convertors import PathConvertor, register_url_convertor

from agent_memory.agent_key import UNNAMED, UNNAMED_MARK, AgentKey, shown_id
from agent_memory.api.agent_ids import refusal
from agent_memory.api.errors import APIError
from agent_memory.api.serving.speaker import tenant
from agent_memory.api.state import ServedModel, ServerState, ready_state
from agent_memory.cache_miss import Miss
from agent_memory.engine.protocol import AgentInfo

router = APIRouter()


class AgentIdConvertor(PathConvertor):
    """The rest of the path, line breaks included (`path`'s `.*` stops at one, so an id holding
    one, from an older version, met the router's bare 404 and could not be deleted)."""

    regex = "(?s:.*)"


register_url_convertor("agent_id", AgentIdConvertor())


def agent_dict(info: AgentInfo, model: str) -> dict:
    """An agent as listed: its memory, and its latest miss (reason, position, tokens lost, when)."""
    last = info.misses[-1] if info.misses else None
    return {
        "id": info.id,
        # What people see: escaped where it would hide a character; an unnamed conversation's marked.
        "display_id": UNNAMED_MARK + info.id if info.kind == UNNAMED else shown_id(info.id),
        "object": "agent",
        "kind": info.kind,  # "agent" (named by its requests) or "unnamed" (recognised by its content)
        "turns": info.turns,
        "model": model,  # the served model whose memory it is: an agent of two models is two
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
        "pinned": info.pinned,  # kept against eviction (docs/usage.md, "Pinning")
        # Kept with priority until (prompt_cache_retention: docs/usage.md, "Controls"), or null.
        "kept_until": _until(info.keep_until),
        "kept_on_disk_until": _until(info.keep_on_disk_until),
        "last_miss": _miss(last, with_detail=False) if last is not None else None,
    }


def _until(when: float) -> float | None:
    return round(when, 3) if when > time.time() else None


async def heads_of(state: ServerState, own: str) -> list[dict]:
    """A tenant's shared heads in every served model, as listed (here and /v1/heads: api/heads.py)."""
    return [
        {**agent_dict(info, model.id), "object": "head"}
        for model in state.models.values()
        for info in await asyncio.to_thread(model.engine.heads, own)
    ]


def _miss(miss: Miss, with_detail: bool = True) -> dict:
    return {**miss.as_dict(with_detail), "time": round(miss.time, 3)}


@router.get("/v1/agents")
async def list_agents(request: Request, state: ServerState = Depends(ready_state)) -> dict:
    """The caller's tenant's agents (with one key or none: every agent), and the totals the
    caller may see: the operator's (tenant "") the server's, a tenant's its own (its bytes and
    blocks against the budgets it shares fairly with the other tenants)."""
    own = tenant(request)
    data = [
        agent_dict(info, model.id)
        for model in state.models.values()
        for info in await asyncio.to_thread(model.engine.agents, own)
    ]
    per_model = {model.id: await asyncio.to_thread(model.engine.totals, own or None) for model in state.models.values()}
    loaded = {model.id: model.engine.health().loaded for model in state.models.values()}
    models = [{"id": model_id, "loaded": loaded[model_id], **totals} for model_id, totals in per_model.items()]
    heads = await heads_of(state, own)  # shared heads (api/heads.py): docs/usage.md, "Warm prompts"
    return {"object": "list", "data": data, "heads": heads, **_added(per_model.values()), "models": models}


@router.get("/v1/agents/{agent_id:agent_id}")
async def get_agent(
    agent_id: str, request: Request, model: str | None = None, state: ServerState = Depends(ready_state)
) -> dict:
    """`?model=`: the agent of that model (an agent of two models is two); else the first found.
    With its latest misses, oldest first (docs/usage.md, "Why a request missed")."""
    for model in models_named(state, model):
        for key in _keys(agent_id, tenant(request)):
            info = await asyncio.to_thread(model.engine.agent, key)
            if info is not None:  # the caller's tenant's own agent: its misses' text too
                return {**agent_dict(info, model.id), "misses": [_miss(m) for m in info.misses]}
    raise _not_found(agent_id)


@router.delete("/v1/agents/{agent_id:agent_id}")
async def delete_agent(
    agent_id: str, request: Request, model: str | None = None, state: ServerState = Depends(ready_state)
) -> dict:
    """Ends the agent in every model, or in the one `?model=` names."""
    # Freeing KV arrays is MLX work: each engine does it on its own thread.
    ended = [await _end_first(m, _keys(agent_id, tenant(request))) for m in models_named(state, model)]
    if not any(ended):
        raise _not_found(agent_id)
    return {"id": agent_id, "object": "agent.deleted", "deleted": True}


async def _end_first(model: ServedModel, keys: list[AgentKey]) -> bool:
    """End the first of `keys` the model holds: a named agent before an unnamed one of that id."""
    for key in keys:
        if await asyncio.wrap_future(model.engine.end_agent(key)):
            return True
    return False


def _keys(agent_id: str, own: str) -> list[AgentKey]:
    """The agents an id in a path may name: a named agent's, then an unnamed conversation's
    (its id with or without its mark)."""
    unnamed = AgentKey(agent_id.removeprefix(UNNAMED_MARK), own, UNNAMED)
    return [unnamed] if agent_id.startswith(UNNAMED_MARK) else [AgentKey(agent_id, own), unnamed]


def _not_found(agent_id: str) -> APIError:
    """A 404; a 400 for an id no request may name any more (one an older version stored is
    still shown and deleted by its id)."""
    error = refusal(agent_id, "agent_id")
    return error or APIError(404, f"no agent '{shown_id(agent_id)}'", param="agent_id", code="agent_not_found")


def models_named(state: ServerState, named: str | None) -> list[ServedModel]:
    """Every served model, or the one a `model` query names (a 404 for a name none answers to)."""
    if named is None:
        return list(state.models.values())
    found = [m for m in state.models.values() if named in m.ids]
    if not found:
        raise APIError(404, f"The model '{named}' does not exist", param="model", code="model_not_found")
    return found


def _added(per_model) -> dict[str, int]:
    """The memory's figures, added up over the models."""
    totals: dict[str, int] = {}
    for figures in per_model:
        for name, value in figures.items():
            totals[name] = totals.get(name, 0) + value
    return totals

"""Shared heads and pins over HTTP (docs/usage.md, "Warm prompts" and "Pinning").

A head is a system prompt and tool set computed once, by a prefill-only request, and kept as a
record of kind HEAD (pinned, listed, on disk, restored at start like an agent), so that the first
request of every agent that starts with them already reuses them. Its tokens end exactly where
an agent's first user content begins: the conversation is rendered with a probe user message and
cut where the probe's text starts, less one token (the boundary may tokenize otherwise once the
real content follows). Heads come from `--warm-prompts` (one body a line, read at start) or
`POST /v1/heads`; per tenant, as /v1/agents: a head is in its tenant's namespace, for its agents.

Pins keep an agent or head against eviction within the budget (memory/index/pins.py); over it,
a 409 `pin_over_budget` with the numbers."""

from __future__ import annotations

import asyncio
import hashlib
import json
import logging
from dataclasses import replace
from pathlib import Path

from fastapi import APIRouter, Depends, Request
from pydantic import ValidationError

from agent_memory.agent_key import AGENT, HEAD, AgentKey, shown_id
from agent_memory.api.agent_ids import check_agent_id, refusal
from agent_memory.api.agents import heads_of, models_named
from agent_memory.api.errors import APIError
from agent_memory.api.openai.chat import conversation
from agent_memory.api.openai.schemas import ChatCompletionRequest
from agent_memory.api.serving.speaker import tenant
from agent_memory.api.state import ServedModel, ServerState, ready_state
from agent_memory.chat.conversation import Conversation, Message
from agent_memory.chat.render import RenderError, render_prompt
from agent_memory.config import ConfigError
from agent_memory.engine.requests import Failed, Finished, GenerationRequest, SamplingParams
from agent_memory.memory.index.prefix import common_prefix

log = logging.getLogger(__name__)
router = APIRouter()

PROBE = "agent-memory-probe-7f3a9c"  # the probe user message's text: where an agent's first content begins


class HeadRequest(ChatCompletionRequest):
    """A chat completions body without its final user turn; `name`: the head's id (default:
    `head_` and a hash of its tokens)."""

    name: str | None = None


# -- pins (declared before the routes whose ids take the rest of the path) ---------------


@router.post("/v1/agents/{agent_id:path}/pin")
async def pin_agent(agent_id: str, request: Request, model: str | None = None, state=Depends(ready_state)) -> dict:
    return await pinned(state, AgentKey(agent_id, tenant(request), AGENT), model, True)


@router.delete("/v1/agents/{agent_id:path}/pin")
async def unpin_agent(agent_id: str, request: Request, model: str | None = None, state=Depends(ready_state)) -> dict:
    return await pinned(state, AgentKey(agent_id, tenant(request), AGENT), model, False)


@router.post("/v1/heads/{head_id:path}/pin")
async def pin_head(head_id: str, request: Request, model: str | None = None, state=Depends(ready_state)) -> dict:
    return await pinned(state, AgentKey(head_id, tenant(request), HEAD), model, True)


@router.delete("/v1/heads/{head_id:path}/pin")
async def unpin_head(head_id: str, request: Request, model: str | None = None, state=Depends(ready_state)) -> dict:
    return await pinned(state, AgentKey(head_id, tenant(request), HEAD), model, False)


# -- heads -------------------------------------------------------------------------------


@router.post("/v1/heads")
async def create_head(body: HeadRequest, request: Request, state: ServerState = Depends(ready_state)) -> dict:
    """Compute a head now (the answer comes once it is in memory) and pin it."""
    return await make_head(state.model_for(body.model), body, tenant(request))


@router.get("/v1/heads")
async def list_heads(request: Request, state: ServerState = Depends(ready_state)) -> dict:
    return {"object": "list", "data": await heads_of(state, tenant(request))}


@router.delete("/v1/heads/{head_id:agent_id}")
async def delete_head(
    head_id: str, request: Request, model: str | None = None, state: ServerState = Depends(ready_state)
) -> dict:
    """Ends the head in every model, or in the one `?model=` names; agents that reuse it keep their blocks."""
    key = AgentKey(head_id, tenant(request), HEAD)
    if not any([await asyncio.wrap_future(m.engine.end_agent(key)) for m in models_named(state, model)]):
        raise not_found(key)
    return {"id": head_id, "object": "head.deleted", "deleted": True}


# -- the work behind them ----------------------------------------------------------------


async def pinned(state: ServerState, key: AgentKey, named: str | None, on: bool) -> dict:
    """Pin or unpin the agent (or head) in every model that holds it, or in the one named."""
    found = []
    for model in models_named(state, named):
        result = await asyncio.to_thread(model.engine.pin, key, on)
        if result.refused is not None:
            raise APIError(409, result.refused, param=f"{key.kind}_id", code="pin_over_budget")
        if result.found:
            found.append(model.id)
    if not found:
        raise not_found(key)
    return {"id": key.id, "object": key.kind, "pinned": on, "models": found}


def not_found(key: AgentKey) -> APIError:
    """A 404 naming the agent or head (a 400 for an id no request may name)."""
    param = f"{key.kind}_id"
    error = refusal(key.id, param)
    return error or APIError(404, f"no {key.kind} '{shown_id(key.id)}'", param=param, code=f"{key.kind}_not_found")


async def make_head(model: ServedModel, body: HeadRequest, own: str) -> dict:
    """The head's tokens (head_tokens), computed for a record of kind HEAD by a prefill-only
    request in the tenant's namespace, then pinned (a pin over the budget leaves it unpinned,
    and says why)."""
    tokens = await head_tokens(model, conversation(body))
    digest = hashlib.blake2b(json.dumps(tokens).encode(), digest_size=6).hexdigest()
    head_id = body.name or f"head_{digest}"
    check_agent_id(head_id, "name")
    key = AgentKey(head_id, own, HEAD)
    params = SamplingParams(max_tokens=0, temperature=0.0)
    await prefill(model, GenerationRequest(tokens, params, agent=key, tenant=own, prefill_only=True))
    result = await asyncio.to_thread(model.engine.pin, key, True)
    refused = {"pin_refused": result.refused} if result.refused else {}
    return {"id": head_id, "object": "head", "model": model.id, "tokens": len(tokens), "pinned": result.pinned, **refused}


async def head_tokens(model: ServedModel, chat: Conversation) -> list[int]:
    """The prompt's tokens up to where a first user message's content begins, less one."""
    probed = replace(chat, messages=[*chat.messages, Message("user", PROBE)])
    try:
        text = await model.render(lambda tok: render_prompt(tok, probed, model.reply_format))
    except RenderError as e:
        raise APIError(400, str(e), param="messages") from e
    cut = text.rfind(PROBE)
    if cut <= 0:
        raise APIError(400, "the chat template shows nothing before a user message's text", param="messages")

    def tokenize(tokenizer) -> list[int]:
        head = tokenizer.encode(text[:cut], add_special_tokens=False)
        whole = tokenizer.encode(text, add_special_tokens=False)
        return whole[: min(common_prefix(head, whole), len(head) - 1)]

    tokens = await model.tokenize(tokenize)
    if not tokens:
        raise APIError(400, "the head holds no token before a user message's text", param="messages")
    return tokens


async def prefill(model: ServedModel, request: GenerationRequest) -> None:
    """Run a prefill-only request to its end (a 503 if the engine could not)."""
    loop = asyncio.get_running_loop()
    ended: asyncio.Future = loop.create_future()

    def sink(event) -> None:
        if isinstance(event, Finished | Failed):
            loop.call_soon_threadsafe(lambda: ended.done() or ended.set_result(event))

    model.engine.submit(request, sink)
    event = await ended
    if isinstance(event, Failed):
        raise APIError(event.status, event.message, code=event.code)
    if event.reason != "follow-up":  # how a prefill-only request ends once computed (engine/core.py)
        raise APIError(503, f"the head was not computed: {event.reason}", code="head_not_computed")


# -- warm prompts ------------------------------------------------------------------------


def read_warm_prompts(path: Path) -> list[HeadRequest]:
    """--warm-prompts: one head's body a line (blank lines skipped); a line that is not one is
    refused at start, naming it."""
    try:
        lines = path.read_text(encoding="utf-8").splitlines()
    except (OSError, UnicodeDecodeError) as e:
        raise ConfigError(f"--warm-prompts {path}: cannot be read: {e}") from e
    bodies = []
    for n, line in enumerate(lines, 1):
        if not line.strip():
            continue
        try:
            bodies.append(HeadRequest.model_validate(json.loads(line)))
        except (ValueError, ValidationError) as e:
            raise ConfigError(f"--warm-prompts {path}, line {n}: not a chat completions body: {e}") from e
        if bodies[-1].name is not None and (why := refusal(bodies[-1].name, "name")) is not None:
            raise ConfigError(f"--warm-prompts {path}, line {n}: {why.message}")
    return bodies


async def warm(state: ServerState, bodies: list[HeadRequest]) -> None:
    """Compute the --warm-prompts heads (the operator's: tenant "") once their models load."""
    for model in state.models.values():
        if await asyncio.to_thread(model.engine.wait_loaded) is not None:
            return  # said by the load's watcher
    for body in bodies:
        try:
            head = await make_head(state.model_for(body.model), body, "")
        except APIError as e:
            log.error("warm prompt %s: %s", body.name or "(unnamed)", e.message)
            continue
        log.info("warm prompt %s: head %s of %d tokens%s", body.name or "(unnamed)", head["id"], head["tokens"],
                 ", pinned" if head["pinned"] else f", not pinned: {head['pin_refused']}")

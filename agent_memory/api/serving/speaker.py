"""Who a request speaks for: its tenant (from the API key) and the agent its wire format names."""

from __future__ import annotations

from typing import Any

from fastapi import Request

from agent_memory.agent_key import AgentKey
from agent_memory.api.agent_ids import check_agent_id
from agent_memory.api.errors import APIError


def utf8_header(request: Request, name: str) -> str | None:
    """A header's value read as UTF-8 (HTTP hands us bytes; Starlette decodes Latin-1)."""
    value = request.headers.get(name)
    if value is None:
        return None
    try:
        return value.encode("latin-1").decode("utf-8")
    except UnicodeError as e:
        raise APIError(400, f"{name} is not valid UTF-8", param=name, code="invalid_unicode") from e


def tenant(request: Request) -> str:
    """The tenant of the request's API key; "" when keys are not per tenant."""
    return request.scope.get("state", {}).get("tenant", "")


def agent_key(request: Request, candidates: list[tuple[str, object]]) -> AgentKey | None:
    """The agent a request speaks for, in its tenant: the first non-empty string of (param,
    value) candidates, in the wire format's order; None when it names none."""
    for param, value in candidates:
        if isinstance(value, str) and value:
            check_agent_id(value, param)
            return AgentKey(value, tenant(request))
    return None


def openai_agent(body: Any, request: Request) -> AgentKey | None:
    """Where the OpenAI formats (chat, completions, Responses) name their agent, in order."""
    return agent_key(
        request,
        [
            ("prompt_cache_key", body.prompt_cache_key),
            # The AI SDK's name for it, which its openai-compatible provider sends as it is (opencode's sessions)
            ("promptCacheKey", (body.model_extra or {}).get("promptCacheKey")),
            ("X-Agent-Id", utf8_header(request, "X-Agent-Id")),
            ("user", body.user),
            ("metadata.user_id", (body.metadata or {}).get("user_id")),
        ],
    )

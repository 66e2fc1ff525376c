"""What a request asks of the memory besides reuse: not to be remembered (`remember: false` in
any API's body, or the header `Cache-Control: no-store`, RFC 9111's "must not store any part of
this request or its response"), and OpenAI's `prompt_cache_retention`, its agent's memory kept
with priority (memory/index/keep.py). docs/usage.md, "Controls"."""

from __future__ import annotations

from typing import Literal

from fastapi import Request

from agent_memory.engine.requests import Retention

# OpenAI's values (the openai SDK's Literal), and the spelling its guide once used.
RetentionName = Literal["in_memory", "in-memory", "24h"]
RETENTIONS: dict[str, Retention] = {
    "in_memory": Retention(3600.0, disk=False),  # an hour, in memory
    "in-memory": Retention(3600.0, disk=False),
    "24h": Retention(86400.0, disk=True),  # a day, in memory and on disk
}


def retention(name: RetentionName | None) -> Retention | None:
    return RETENTIONS[name] if name is not None else None


def no_store(request: Request) -> bool:
    """Whether a Cache-Control header of the request says no-store (directives are
    comma-separated and case-insensitive)."""
    directives = ",".join(request.headers.getlist("cache-control")).lower().split(",")
    return any(d.strip().partition("=")[0].strip() == "no-store" for d in directives)

"""What a launched program is pointed at: the server's base URL, the served model's id, its
context window and output limit, read from the server's own `/v1/models`, and the API key."""

from __future__ import annotations

from dataclasses import dataclass

import httpx

TIMEOUT_S = 10.0
# When the server names no output limit: a quarter of the context, at most what the programs
# ask for by default (Claude Code's 32k), so a long answer still leaves room for the prompt.
OUTPUT_SHARE = 4
OUTPUT_CAP = 32_000


class TargetError(Exception):
    """The server does not answer as an agent-memory server, or lacks the model asked for."""


@dataclass(frozen=True)
class Target:
    base_url: str  # http://host:port, no /v1
    model: str  # the id the program names in its requests
    context: int  # tokens: prompt and output together
    output: int  # tokens a reply may take
    api_key: str | None  # the server's key, if it wants one

    @property
    def openai_url(self) -> str:
        return self.base_url + "/v1"

    @property
    def key_or_placeholder(self) -> str:
        """Programs that insist on a key get one; a keyless server ignores it."""
        return self.api_key or "unused"


def read_target(base_url: str, api_key: str | None, model: str | None = None) -> Target:
    """The model `model` (an id the server lists; None: its first) as the server describes it."""
    headers = {"Authorization": f"Bearer {api_key}"} if api_key else {}
    try:
        response = httpx.get(base_url + "/v1/models", headers=headers, timeout=TIMEOUT_S)
    except httpx.HTTPError as e:
        raise TargetError(f"no server answers at {base_url} ({type(e).__name__}: {e})") from None
    if response.status_code == 401:
        raise TargetError(f"the server at {base_url} wants an API key: pass --api-key or set AGENT_MEMORY_API_KEY")
    try:
        response.raise_for_status()
        listed = [m for m in response.json()["data"] if isinstance(m, dict) and isinstance(m.get("id"), str)]
    except (httpx.HTTPError, ValueError, KeyError, TypeError) as e:
        raise TargetError(f"the server at {base_url} sent no model list ({e})") from None
    chosen = [m for m in listed if m["id"] == model or model is None and m.get("kind", "chat") == "chat"][:1]
    if not chosen:
        ids = ", ".join(m["id"] for m in listed) or "none"
        raise TargetError(f"the server at {base_url} serves no model {model!r} (it serves: {ids})")
    found = chosen[0]
    context = found.get("max_model_len")
    if not isinstance(context, int) or context <= 0:
        raise TargetError(f"the server at {base_url} does not say model {found['id']!r}'s context (max_model_len)")
    output = (found.get("sampling_defaults") or {}).get("max_tokens")  # the server's --default-max-tokens
    if not isinstance(output, int) or output <= 0:
        output = min(context // OUTPUT_SHARE, OUTPUT_CAP)
    return Target(base_url, found["id"], context, output, api_key)

"""`encrypted_content` of a reasoning item: what a client that keeps no server-side state
(`store: false`, Codex) sends back to give the model its earlier reasoning. OpenAI encrypts
it; here it is the reasoning text itself, encoded and checksummed — the client has the same
text in the item's `content` anyway — so that the server can read it back on any later
request, after a restart or on another server, and tell a damaged one from a good one."""

from __future__ import annotations

import base64
import hashlib
import json

PREFIX = "am1."  # this encoding's version


def seal(text: str) -> str:
    payload = json.dumps({"reasoning": text, "sha256": hashlib.sha256(text.encode()).hexdigest()})
    return PREFIX + base64.urlsafe_b64encode(payload.encode()).decode()


def unseal(value: object) -> str | None:
    """The reasoning text a sealed value holds, or None for one this server did not make (or
    that was damaged on the way)."""
    if not isinstance(value, str) or not value.startswith(PREFIX):
        return None
    try:
        data = json.loads(base64.urlsafe_b64decode(value[len(PREFIX) :].encode()))
        text = data["reasoning"]
    except (ValueError, KeyError, TypeError):
        return None
    if not isinstance(text, str) or hashlib.sha256(text.encode()).hexdigest() != data.get("sha256"):
        return None
    return text

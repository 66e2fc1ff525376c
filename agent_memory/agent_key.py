"""Who a request speaks for: one value made once from the request (api/serving/speaker.py) and carried
whole through the engine to the store, the agent's manifest and the name it is stored under
(`agent_file_stem`: the warm tier's manifests and the stored responses alike), and what an id
may hold (`refused_char`) and how one is shown (`shown_id`)."""

from __future__ import annotations

import hashlib
import json
import re
from typing import NamedTuple

AGENT = "agent"
RESPONSE = "response"  # a stored Responses-API response: agent-like, its id the response id
HEAD = "head"  # a shared head (api/heads.py): a system prompt and tools computed once, for every agent to start from
# A conversation no request named, recognised by its content (memory/index/conversations.py):
# its id is a hash of its first prompt, shown with UNNAMED_MARK before it.
UNNAMED = "unnamed"
KINDS = (AGENT, RESPONSE, HEAD, UNNAMED)
UNNAMED_MARK = "~"

# What no new agent id may hold: C0 and C1 controls, DEL, and the bidirectional-text controls
# (an id that shows as another, or cannot be named in a URL). Ids of older versions may.
REFUSED = re.compile("[\x00-\x1f\x7f-\x9f\u061c\u200e\u200f\u202a-\u202e\u2066-\u2069]")


class AgentKey(NamedTuple):
    """An agent: its id within its tenant (an API key's name; "" with one key or none) and its
    kind. Agents of different tenants or kinds never meet, whatever their ids."""

    id: str
    tenant: str = ""
    kind: str = AGENT


def _key(key: AgentKey | str) -> AgentKey:
    return AgentKey(key) if isinstance(key, str) else key


def _hashed(raw: bytes) -> str:
    return hashlib.blake2b(raw, digest_size=16).hexdigest()


def agent_file_stem(key: AgentKey | str) -> str:
    """The name an agent's records are stored under: a hash of `tenant NUL id NUL kind`, so ids
    never become file names. One for every key: a tenant name holds no NUL
    (keys_file.TENANT_NAME), the kind is one of KINDS, so the first and last NUL split the three apart
    even for an id of an older version that holds a NUL."""
    key = _key(key)
    # surrogatepass: total over every Python string, though the API admits only valid Unicode.
    parts = [key.tenant.encode("utf-8", "surrogatepass"), key.id.encode("utf-8", "surrogatepass"), key.kind.encode()]
    return _hashed(b"\0".join(parts))


def legacy_file_stem(key: AgentKey | str) -> str | None:
    """The name versions before this one stored a shared-namespace agent under (a hash of the
    bare id, which another key's three fields could spell), or None where it is the same name
    as agent_file_stem's. Read only to move such a record to its name (memory/warm/stems.py)."""
    key = _key(key)
    if key.tenant or key.kind != AGENT:
        return None
    return _hashed(key.id.encode("utf-8", "surrogatepass"))


def refused_char(agent_id: str) -> str | None:
    """The first character no new agent id may hold (REFUSED), or None."""
    found = REFUSED.search(agent_id)
    return found.group() if found else None


def key_label(key: AgentKey) -> str:
    """An agent's id as listings and logs show it: an unnamed conversation's with its mark."""
    return UNNAMED_MARK + key.id if key.kind == UNNAMED else key.id


def shown_id(agent_id: str) -> str:
    """An id as people see it (the dashboard, `cache` commands, error messages): itself when
    every character prints as itself, else a JSON string literal, every such one escaped
    (`\\n`, `\\u202e`), so that no id hides a character or passes for another."""
    return agent_id if agent_id.isprintable() else json.dumps(agent_id)

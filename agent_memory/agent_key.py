"""Who a request speaks for: one value made once from the request (api/pipeline.py) and carried
whole through the engine to the store, the agent's manifest and the name it is stored under
(`agent_file_stem`: the warm tier's manifests and the stored responses alike)."""

from __future__ import annotations

import hashlib
from typing import NamedTuple

AGENT = "agent"
RESPONSE = "response"  # a stored Responses-API response: agent-like, its id the response id
KINDS = (AGENT, RESPONSE)


class AgentKey(NamedTuple):
    """An agent: its id within its tenant (an API key's name; "" with one key or none) and its
    kind. Agents of different tenants or kinds never meet, whatever their ids."""

    id: str
    tenant: str = ""
    kind: str = AGENT


def agent_file_stem(key: AgentKey | str) -> str:
    """The name an agent's records are stored under: a hash, so ids never become file names."""
    key = AgentKey(key) if isinstance(key, str) else key
    # surrogatepass: total over every Python string, though the API admits only valid Unicode.
    raw = key.id.encode("utf-8", "surrogatepass")
    if key.tenant or key.kind != AGENT:
        raw = b"\0".join([key.tenant.encode("utf-8", "surrogatepass"), raw, key.kind.encode()])
    return hashlib.blake2b(raw, digest_size=16).hexdigest()

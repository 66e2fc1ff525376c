"""Who a request speaks for: one value made once from the request (api/pipeline.py) and carried
whole through the engine to the store, the agent's manifest and the name it is stored under."""

from __future__ import annotations

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

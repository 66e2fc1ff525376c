"""What an agent id read from a request may hold: no control characters and no
bidirectional-text controls (agent_key.REFUSED), wherever the id comes from (a body field, a
header, the /v1/agents path). Such an id cannot be named in a URL the dashboard sends, or shows
as another; a 400 names the field, in the wire format's own error shape."""

from __future__ import annotations

from agent_memory.agent_key import refused_char
from agent_memory.api.errors import APIError

MAX_AGENT_ID = 256


def refusal(agent_id: str, param: str) -> APIError | None:
    """The 400 for an id holding a refused character, naming `param` and the character."""
    char = refused_char(agent_id)
    if char is None:
        return None
    return APIError(
        400,
        f"{param}: an agent id may not hold control characters or bidirectional-text controls "
        f"(it holds U+{ord(char):04X} at position {agent_id.index(char)})",
        param=param,
        code="invalid_agent_id",
    )


def check_agent_id(agent_id: str, param: str) -> None:
    """Raise a 400 for an id over MAX_AGENT_ID characters, or refusal's for one that holds a
    refused character."""
    if len(agent_id) > MAX_AGENT_ID:
        raise APIError(400, f"agent ids are at most {MAX_AGENT_ID} characters", param=param)
    if (error := refusal(agent_id, param)) is not None:
        raise error

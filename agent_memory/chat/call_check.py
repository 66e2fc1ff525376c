"""Every finished tool call checked against its tool's whole schema. Constrained decoding enforces
what llguidance can; what it cannot (a keyword chat/loosen.py dropped under `auto`:
`propertyNames`, `if`/`then`, `not`, an unknown `format`, a `oneOf` enforced as `anyOf`; or a
family whose calls are read but not constrained) is checked here once the call is whole. A call
that fails is returned as the model wrote it, and said in the log once per tool and keyword:
the client validates its tools' input itself and tells the model (Claude Code and Codex send
the error back as the tool's result), which is what the model needs to correct it; returning it
as text instead would end an agent's turn on a call it asked for."""

from __future__ import annotations

import json
import logging

import jsonschema
import referencing.exceptions

from agent_memory.chat.conversation import Tool, ToolCall
from agent_memory.log_once import first_time

log = logging.getLogger(__name__)

class CheckedReader:
    """A reply reader (chat/reader.py, or harmony's) whose calls are checked at the reply's end."""

    def __init__(self, reader, tools: list[Tool]) -> None:
        self.reader = reader
        self.schemas = {t.name: t.parameters for t in tools if t.parameters}

    @property
    def calls(self) -> list[ToolCall]:
        return self.reader.calls

    def read(self, text: str | None):
        out = self.reader.read(text)
        if text is None:
            for call in self.reader.calls:
                check_call(call, self.schemas.get(call.name))
        return out


def check_call(call: ToolCall, schema: dict | None) -> str | None:
    """Why `call`'s arguments do not follow `schema` (None: they do, or there is no schema)."""
    if not schema:
        return None
    try:
        arguments = json.loads(call.arguments or "{}")
        error = jsonschema.exceptions.best_match(
            jsonschema.validators.validator_for(schema)(schema).iter_errors(arguments)
        )
    except (ValueError, jsonschema.exceptions.SchemaError, referencing.exceptions.Unresolvable):
        return None  # not JSON (a cut-off call, said where it is read) or a schema already refused
    if error is None:
        return None
    where = "/".join(str(p) for p in error.absolute_path) or "(the arguments)"
    if first_time(("call off its schema", call.name, str(error.validator))):
        log.warning(
            "tool %r: a call does not follow its schema (%s at %s: %s); returned as written, for the client to answer",
            call.name,
            error.validator,
            where,
            error.message[:200],
        )
    return f"{error.validator} at {where}"

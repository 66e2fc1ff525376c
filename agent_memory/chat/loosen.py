"""The nearest schema constrained decoding can enforce: a tool schema with keywords llguidance
does not implement (`propertyNames`, `not`, `if`/`then`, an unknown string `format`) loses
them, and only them, so that a request whose `tool_choice` is `auto` is served with its calls
constrained by everything else instead of refused (Claude Code's TaskCreate describes its
`metadata` with `propertyNames`). A call the model writes then follows the looser schema; the
whole schema is checked once the call is finished (call_check.py)."""

from __future__ import annotations

import json
from collections.abc import Callable

# Keywords whose values map names to schemas: their keys are names, never keywords to drop.
NAMED_SCHEMAS = ("properties", "patternProperties", "$defs", "definitions", "dependentSchemas")
DATA = ("enum", "const", "default", "examples")  # values, not schemas: kept as they are
UNIMPLEMENTED = "Unimplemented keys: "
UNKNOWN_FORMAT = "Unknown format: "
MAX_ROUNDS = 8  # llguidance names what it lacks a few keywords at a time


def loosen(schema: dict, refusal: Callable[[dict], str | None]) -> tuple[dict, list[str]] | None:
    """(the schema without what `refusal` names, the keywords dropped), or None when what it
    refuses is not a keyword that can be dropped (a broken `$ref`, say). `refusal(schema)`:
    llguidance's reason for refusing it, None once it compiles."""
    dropped: list[str] = []
    for _ in range(MAX_ROUNDS):
        reason = refusal(schema)
        if reason is None:
            return schema, dropped
        first = reason.strip().splitlines()[0] if reason.strip() else ""
        if first.startswith(UNIMPLEMENTED):
            keys = set(json.loads(first.removeprefix(UNIMPLEMENTED)))
            schema = _without(schema, lambda key, value: key in keys)
            dropped += sorted(keys)
        elif first.startswith(UNKNOWN_FORMAT):
            name = first.removeprefix(UNKNOWN_FORMAT)
            schema = _without(schema, lambda key, value: key == "format" and value == name)
            dropped.append(f"format {name}")
        else:
            return None
    return None


def _without(schema, drop: Callable[[str, object], bool]):
    """The schema with every keyword `drop(key, value)` names removed, at any depth."""
    if isinstance(schema, list):
        return [_without(s, drop) for s in schema]
    if not isinstance(schema, dict):
        return schema
    out = {}
    for key, value in schema.items():
        if drop(key, value):
            continue
        if key in DATA:
            out[key] = value
        elif key in NAMED_SCHEMAS and isinstance(value, dict):
            out[key] = {name: _without(s, drop) for name, s in value.items()}
        else:
            out[key] = _without(value, drop)
    return out

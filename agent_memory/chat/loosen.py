"""The nearest schema constrained decoding can enforce: a tool schema with keywords llguidance
does not implement (`propertyNames`, `not`, `if`/`then`, an unknown string `format`) loses
them, and only them, and a `oneOf` whose alternatives llguidance cannot prove disjoint is
enforced as `anyOf` (a value may then match more than one), so that a request whose
`tool_choice` is `auto` is served with its calls constrained by everything else instead of
refused (Claude Code's TaskCreate describes its `metadata` with `propertyNames`; Qwen Code's
`agent` tool its `fork_turns` with `oneOf`). A call the model writes then follows the looser
schema; the whole schema is checked once the call is finished (call_check.py).

`oneOf` becomes `anyOf` in the schema rather than through llguidance's `coerce_one_of` option,
which compiles each `oneOf` as its `anyOf` (the same grammar): the loosened schema stays a plain
JSON schema that travels alone into the reply format's Lark grammar (whose `x-guidance` is the
JSON style the template writes back, never a client's), and the refusal check compiles exactly
what the grammar will."""

from __future__ import annotations

import json
from collections.abc import Callable

# Keywords whose values map names to schemas: their keys are names, never keywords to drop.
NAMED_SCHEMAS = ("properties", "patternProperties", "$defs", "definitions", "dependentSchemas")
DATA = ("enum", "const", "default", "examples")  # values, not schemas: kept as they are
UNIMPLEMENTED = "Unimplemented keys: "
UNKNOWN_FORMAT = "Unknown format: "
ONE_OF = "oneOf constraints are not supported"  # llguidance's words for a oneOf it cannot prove disjoint
AS_ANY_OF = "oneOf as anyOf"  # what `loosen` reports for it among the keywords dropped
MAX_ROUNDS = 8  # llguidance names what it lacks a few keywords at a time


def loosen(schema: dict, refusal: Callable[[dict], str | None]) -> tuple[dict, list[str]] | None:
    """(the schema without what `refusal` names, the keywords dropped and AS_ANY_OF where its
    `oneOf`s became `anyOf`s), or None when what it refuses is not a keyword that can be
    dropped or relaxed (a broken `$ref`, say). `refusal(schema)`: llguidance's reason for
    refusing it, None once it compiles."""
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
        elif first.startswith(ONE_OF):
            schema = _one_of_as_any_of(schema)
            dropped.append(AS_ANY_OF)
        else:
            return None
    return None


def _one_of_as_any_of(schema):
    """The schema with every `oneOf` an `anyOf`, at any depth (merged into an `anyOf` beside it:
    a value must then match one of each)."""
    if isinstance(schema, list):
        return [_one_of_as_any_of(s) for s in schema]
    if not isinstance(schema, dict):
        return schema
    out = {}
    for key, value in schema.items():
        if key in DATA:
            out[key] = value
        elif key in NAMED_SCHEMAS and isinstance(value, dict):
            out[key] = {name: _one_of_as_any_of(s) for name, s in value.items()}
        else:
            out[key] = _one_of_as_any_of(value)
    if "oneOf" in out:
        alternatives = out.pop("oneOf")
        if "anyOf" in out:  # both must hold: keep the anyOf, and the alternatives under allOf
            out["allOf"] = [*out.get("allOf", []), {"anyOf": alternatives}]
        else:
            out["anyOf"] = alternatives
    return out


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

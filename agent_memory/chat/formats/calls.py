"""How a family writes a tool call: the grammar rules that make the model write one exactly
as its template writes it back on the next turn (so the agent's cache covers the whole turn),
and how one is read back into a name and arguments. One class per layout; the JSON one here is
Hermes/Qwen3's, which is also the built-in format for templates without tools (render.py).
"""

from __future__ import annotations

import json

from agent_memory.chat.conversation import Tool
from agent_memory.chat.formats.markup import Markup
from agent_memory.chat.render import ARGUMENTS_KEY, CALL_END, CALL_PREFIX, CALL_SEPARATOR, CALL_START, CALL_SUFFIX

# How JSON is written: as json.dumps (and the templates' tojson) writes it.
JSON_STYLE = {"item_separator": ", ", "key_separator": ": ", "whitespace_flexible": False}
ANY_OBJECT = {"type": "object"}


def json_rule(name: str, schema: dict | None) -> str:
    """A Lark rule for a JSON value of `schema`, written in JSON_STYLE."""
    return f"{name}: %json {json.dumps({**(schema or ANY_OBJECT), 'x-guidance': JSON_STYLE})}"


class CallSyntax:
    """One layout of tool calls. `opener` starts a call (where free text may turn into calls);
    `end` closes one ("" where the reply's end does); `separator` goes between two; `streams`:
    whether a call's arguments stream as they are written (else a call is read whole)."""

    name = ""
    opener = ""
    end = ""
    separator = ""
    streams = False
    closers: tuple[str, ...] = ()  # what ends a free-text value inside a call (finish.py)
    inner: tuple[str, ...] = ()  # markers inside a call, besides its opener and end

    def rules(self, i: int, tool: Tool, m: Markup) -> list[str]:
        """Lark rules defining `tool_{i}`: a call of `tool` after its opener, through its end."""
        raise NotImplementedError

    def parse(self, body: str, tools: list[Tool]) -> list[dict]:
        """The calls in `body` (the text between opener and end) as [{"name", "arguments"}]."""
        raise NotImplementedError


class HermesJson(CallSyntax):
    """`<tool_call>\\n{"name": "f", "arguments": {…}}\\n</tool_call>`, calls one per line."""

    name = "hermes"
    opener = CALL_START
    end = CALL_END
    separator = CALL_SEPARATOR
    streams = True

    def rules(self, i: int, tool: Tool, m: Markup) -> list[str]:
        head = CALL_PREFIX[len(CALL_START) :] + json.dumps(tool.name, ensure_ascii=False) + ARGUMENTS_KEY
        return [f"tool_{i}: {m.lit(head)} args_{i} {m.lit(CALL_SUFFIX)}", json_rule(f"args_{i}", tool.parameters)]

    def parse(self, body: str, tools: list[Tool]) -> list[dict]:
        return [json.loads(body)]

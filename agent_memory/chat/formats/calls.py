"""How a family writes a tool call: the grammar rules that make the model write one exactly
as its template writes it back on the next turn (so the agent's cache covers the whole turn),
and how one is read back into a name and arguments. One class per layout; the JSON one here is
Hermes/Qwen3's, which is also the built-in format for templates without tools (render.py).
"""

from __future__ import annotations

import json
from dataclasses import dataclass

from agent_memory.chat.conversation import Tool
from agent_memory.chat.formats.markup import Markup
from agent_memory.chat.render import ARGUMENTS_KEY, CALL_END, CALL_PREFIX, CALL_SEPARATOR, CALL_START, CALL_SUFFIX

# How JSON is written: as json.dumps (and the templates' tojson) writes it.
JSON_STYLE = {"item_separator": ", ", "key_separator": ": ", "whitespace_flexible": False}
ANY_OBJECT = {"type": "object"}


@dataclass(frozen=True)
class Wanted:
    """What a reply must be, as a format's grammar takes it: the tools it may call and how
    (`mode`: auto, required, named, none; `parallel`), the JSON answer's schema, thinking on or
    off (None: the template's default), and whether the prompt opened the reasoning (True),
    closed it (False) or left it to the model (None)."""

    tools: list[Tool]
    mode: str
    parallel: bool
    answer: dict | None
    thinking: bool | None = None
    started: bool | None = None

    @property
    def calls(self) -> list[Tool]:
        """The tools the reply may call."""
        return self.tools if self.mode != "none" else []


def json_rule(name: str, schema: dict | None) -> str:
    """A Lark rule for a JSON value of `schema`, written in JSON_STYLE."""
    return f"{name}: %json {json.dumps({**(schema or ANY_OBJECT), 'x-guidance': JSON_STYLE})}"


class CallSyntax:
    """One layout of tool calls. `opener` starts the calls (where free text may turn into
    calls), `next_opener` each call after the first, `separator` goes between two, `closer`
    after the last; `end` closes what the parser reads at once (a call, or all of them; ""
    where the reply's end does). `streams`: a call's arguments stream as they are written (else
    calls are read whole). `alone`: calls are the whole reply, no text before them; `single`:
    one call per turn (the template takes no more); `indexed`: a call's text holds its index."""

    name = ""
    opener = ""
    next_opener: str | None = None  # None: the opener again
    separator = ""
    closer = ""
    end = ""
    streams = False
    alone = single = indexed = False
    closers: tuple[str, ...] = ()  # what ends a free-text value inside a call (finish.py)
    inner: tuple[str, ...] = ()  # markers inside a call, besides its openers and end

    def rules(self, name: str, tool: Tool, m: Markup, k: int = 0) -> list[str]:
        """Lark rules defining `name`: the `k`-th call of the turn, of `tool`, after its opener
        through its end (`k` matters only where the syntax is `indexed`)."""
        raise NotImplementedError

    def parse(self, body: str, tools: list[Tool]) -> list[dict]:
        """The calls in `body` (the text between opener and end) as [{"name", "arguments"}]."""
        raise NotImplementedError

    def describe(self, tools: list[Tool]) -> str | None:
        """The tools as the system turn describes them where the template writes calls but not
        the tools (None: this layout has no description of its own)."""
        return None


class HermesJson(CallSyntax):
    """`<tool_call>\\n{"name": "f", "arguments": {…}}\\n</tool_call>`, calls one per line."""

    name = "hermes"
    opener = CALL_START
    end = CALL_END
    separator = CALL_SEPARATOR
    streams = True

    def rules(self, name: str, tool: Tool, m: Markup, k: int = 0) -> list[str]:
        head = CALL_PREFIX[len(CALL_START) :] + json.dumps(tool.name, ensure_ascii=False) + ARGUMENTS_KEY
        return [f"{name}: {m.lit(head)} {name}_args {m.lit(CALL_SUFFIX)}", json_rule(f"{name}_args", tool.parameters)]

    def parse(self, body: str, tools: list[Tool]) -> list[dict]:
        return [json.loads(body)]

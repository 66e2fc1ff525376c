"""Custom (freeform) tools: a call's input is raw text, not JSON arguments (Codex's
`apply_patch`). Every family's template knows only function tools, so the model sees a
function of one string, `input`, and its call's `input` is the custom call's input. A grammar
the request gives constrains that string: a regex as the schema's `pattern`, a Lark grammar
turned into one (lark_regex.py) where it has no recursion; otherwise the grammar is shown to
the model in the tool's description and not enforced, said once per tool."""

from __future__ import annotations

import json
import logging

from agent_memory.chat.conversation import Tool
from agent_memory.chat.lark_regex import lark_regex
from agent_memory.log_once import first_time

log = logging.getLogger(__name__)

INPUT = "input"


def freeform_tool(name: str, description: str, syntax: str | None, definition: str | None) -> Tool:
    """The function tool the model sees for a custom tool (`syntax`: "lark", "regex" or None
    for plain text)."""
    text: dict = {"type": "string"}
    pattern = None
    if syntax == "regex" and definition:
        pattern = definition
    elif syntax == "lark" and definition:
        pattern = lark_regex(definition)
        if pattern is None:
            description = f"{description}\n\nThe input follows this Lark grammar:\n{definition}".strip()
            if first_time(("unenforced grammar", name)):
                log.info("custom tool %r: its Lark grammar recurses or uses what a regex cannot: not enforced", name)
    if pattern is not None:
        text["pattern"] = f"^(?:{pattern})$"
    schema = {"type": "object", "properties": {INPUT: text}, "required": [INPUT], "additionalProperties": False}
    return Tool(name, description, schema)


def freeform_input(arguments: str) -> str:
    """A call's input from the JSON arguments the model wrote: its `input`; "" for a call cut
    off before it (read as `{}`); text that is not JSON, as it is."""
    try:
        value = json.loads(arguments)
    except ValueError:
        return arguments
    if isinstance(value, dict):
        return value[INPUT] if isinstance(value.get(INPUT), str) else ""
    return arguments


def freeform_arguments(text: str) -> str:
    """A custom call's input as the arguments the model wrote it with (history sent back)."""
    return json.dumps({INPUT: text}, ensure_ascii=False)

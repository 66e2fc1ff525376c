"""Calls whose arguments are written one parameter at a time between tags, not as JSON:
Qwen3-Coder and Qwen3.5's `<function=f>\\n<parameter=p>\\nvalue\\n</parameter>\\n</function>`,
GLM-4.5+'s `f\\n<arg_key>p</arg_key>\\n<arg_value>value</arg_value>`. A string is written
raw; other values as their template writes them back (Qwen3-Coder: Python's str() for
booleans and numbers, JSON for objects and arrays; GLM: JSON). Parameters come in the schema's
order, the required ones always. mlx-lm's parsers read them back, typed by the schema.
"""

from __future__ import annotations

import json
import re

import agent_memory.blas  # noqa: F401  (before MLX, see its docstring)
from mlx_lm.tool_parsers import glm47, qwen3_coder

from agent_memory.chat.conversation import Tool
from agent_memory.chat.formats.calls import CallSyntax, json_rule
from agent_memory.chat.formats.markup import Markup
from agent_memory.chat.render import tool_json


class TaggedParams(CallSyntax):
    head = ""  # before the name
    after_name = ""  # after it
    tail = ""  # after the parameters, through the call's end
    key_open = key_close = value_close = ""  # around each parameter (its value between)
    booleans = ("true", "false")

    @property
    def closers(self) -> tuple[str, ...]:
        return (self.value_close,)

    def rules(self, name: str, tool: Tool, m: Markup, k: int = 0) -> list[str]:
        schema = tool.parameters or {}
        properties = schema.get("properties") or {}
        required = set(schema.get("required") or [])
        text_rules, text = m.until(f"{name}_text", "(?s:.*)", self.value_close)  # a raw string and its close
        rules, parts = list(text_rules), []
        for n, (key, prop) in enumerate(properties.items()):
            value = f"{name}_v{n}"
            prop = prop if isinstance(prop, dict) else {}
            if self._raw(prop) and "pattern" in prop:  # a freeform tool's grammar (chat/freeform.py)
                pattern_rules, pattern_text = m.until(f"{value}_text", _regex_body(prop["pattern"]), self.value_close)
                rules += [*pattern_rules, f"{value}: {pattern_text}"]
            elif self._raw(prop):
                rules.append(f"{value}: {text}")
            else:
                expression = self._value(value, prop, m)
                if expression.endswith("_json"):
                    rules.append(json_rule(expression, prop))
                rules.append(f"{value}: {expression} {m.lit(self.value_close)}")
            rules.append(f"{name}_p{n}: {m.lit(self.key_open + key + self.key_close)} {value}")
            parts.append(f"{name}_p{n}" + ("" if key in required else "?"))
        if not properties and schema.get("additionalProperties", True) is not False:
            key = m.lit(self.key_open) + " /[A-Za-z_][A-Za-z0-9_.-]*/ " + m.lit(self.key_close)
            rules.append(f"{name}_free: {key} {text}")
            parts.append(f"{name}_free*")
        params = " ".join(parts) or '""'
        rules.insert(0, f"{name}: {m.lit(self.head + tool.name + self.after_name)} {params} {m.lit(self.tail)}")
        return rules

    @staticmethod
    def _raw(prop: dict) -> bool:
        """A string written as it is (an enum of strings is its values, exactly)."""
        return prop.get("type") == "string" and "enum" not in prop

    def _value(self, name: str, prop: dict, m: Markup) -> str:
        """The Lark expression of a value that is not a raw string (a JSON one gets a rule)."""
        if "enum" in prop and all(isinstance(v, str) for v in prop["enum"]):
            return "(" + " | ".join(m.lit(v) for v in prop["enum"]) + ")"
        if prop.get("type") == "boolean":
            return "(" + " | ".join(json.dumps(b) for b in self.booleans) + ")"
        return f"{name}_json"

    def parse(self, body: str, tools: list[Tool]) -> list[dict]:
        return [self.parser(body, [tool_json(t) for t in tools])]

    @staticmethod
    def parser(text: str, tools: list[dict]) -> dict:
        raise NotImplementedError


class Qwen3Coder(TaggedParams):
    name = "qwen3_coder"
    opener, end, separator = "<tool_call>", "</tool_call>", "\n"
    head, after_name = "\n<function=", ">\n"
    tail = "</function>\n</tool_call>"
    key_open, key_close, value_close = "<parameter=", ">\n", "\n</parameter>\n"
    booleans = ("True", "False")

    @staticmethod
    def parser(text: str, tools: list[dict]) -> dict:
        return qwen3_coder.parse_tool_call(text, tools)


class Glm(TaggedParams):
    name = "glm47"
    opener, end, separator = "<tool_call>", "</tool_call>", "\n"
    head, after_name = "", ""
    tail = "\n</tool_call>"
    key_open, key_close, value_close = "\n<arg_key>", "</arg_key>\n<arg_value>", "</arg_value>"

    @staticmethod
    def parser(text: str, tools: list[dict]) -> dict:
        return glm47.parse_tool_call(text, tools)


def _regex_body(pattern: str) -> str:
    """A JSON schema `pattern` as the body of a Lark regex for the whole value: an anchored one
    as it is, an unanchored one (found anywhere, as JSON schema reads it) between any text."""
    body = pattern[1:-1] if pattern.startswith("^") and pattern.endswith("$") else f"(?s:.*)(?:{pattern})(?s:.*)"
    return re.sub(r"(?<!\\)/", r"\/", body)

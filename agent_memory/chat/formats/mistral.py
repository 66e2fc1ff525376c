"""Mistral's calls (Devstral, Mistral Small 3.2, Ministral 3, Magistral): `[TOOL_CALLS]f[ARGS]{…}`,
one after another with nothing between and no end marker (the turn's end closes them).
mlx-lm's parser reads them back."""

from __future__ import annotations

import agent_memory.blas  # noqa: F401  (before MLX, see its docstring)
from mlx_lm.tool_parsers import mistral

from agent_memory.chat.conversation import Tool
from agent_memory.chat.formats.calls import CallSyntax, json_rule
from agent_memory.chat.formats.markup import Markup

ARGS = "[ARGS]"


class Mistral(CallSyntax):
    name = "mistral"
    opener = "[TOOL_CALLS]"
    inner = (ARGS,)

    def rules(self, name: str, tool: Tool, m: Markup, k: int = 0) -> list[str]:
        return [f"{name}: {m.lit(tool.name + ARGS)} {name}_args", json_rule(f"{name}_args", tool.parameters)]

    def parse(self, body: str, tools: list[Tool]) -> list[dict]:
        parsed = mistral.parse_tool_call(body.replace(self.opener, " "))
        return parsed if isinstance(parsed, list) else [parsed]

"""Calls inside a section of special tokens, their arguments JSON: DeepSeek-V3.1's
`<｜tool▁calls▁begin｜><｜tool▁call▁begin｜>f<｜tool▁sep｜>{…}<｜tool▁call▁end｜>…<｜tool▁calls▁end｜>`
and Kimi K2's `<|tool_calls_section_begin|><|tool_call_begin|>functions.f:0<|tool_call_argument_begin|>{…}
<|tool_call_end|>…<|tool_calls_section_end|>` (each call numbered in its turn, as its template
numbers it back)."""

from __future__ import annotations

import json
import re

import agent_memory.blas  # noqa: F401  (before MLX, see its docstring)
from mlx_lm.tool_parsers import kimi_k2

from agent_memory.chat.conversation import Tool
from agent_memory.chat.formats.calls import CallSyntax, json_rule
from agent_memory.chat.formats.markup import Markup

CALL_BEGIN, SEP, CALL_END = "<｜tool▁call▁begin｜>", "<｜tool▁sep｜>", "<｜tool▁call▁end｜>"
DEEPSEEK_CALL = re.compile(
    re.escape(CALL_BEGIN) + r"(.*?)" + re.escape(SEP) + r"(.*?)" + re.escape(CALL_END), re.DOTALL
)


DEEPSEEK_TOOLS = """## Tools
You have access to the following tools:
{tools}
IMPORTANT: ALWAYS adhere to this exact format for tool use:
<｜tool▁calls▁begin｜><｜tool▁call▁begin｜>tool_call_name<｜tool▁sep｜>tool_call_arguments<｜tool▁call▁end｜>{{additional_tool_calls}}<｜tool▁calls▁end｜>

Where:
- `tool_call_name` must be an exact match to one of the available tools
- `tool_call_arguments` must be valid JSON that strictly follows the tool's Parameters Schema
- For multiple tool calls, chain them directly without separators or spaces"""


class DeepSeek(CallSyntax):
    """DeepSeek's templates write calls but not the tools: the system turn describes them as
    DeepSeek-V3.1's model card does."""

    name = "deepseek_v3"
    opener, next_opener = "<｜tool▁calls▁begin｜>", ""
    closer = end = "<｜tool▁calls▁end｜>"
    inner = (CALL_BEGIN, SEP, CALL_END)

    def rules(self, name: str, tool: Tool, m: Markup, k: int = 0) -> list[str]:
        head = m.lit(CALL_BEGIN + tool.name + SEP)
        return [f"{name}: {head} {name}_args {m.lit(CALL_END)}", json_rule(f"{name}_args", tool.parameters)]

    def describe(self, tools: list[Tool]) -> str:
        described = "".join(
            f"\n### {t.name}\nDescription: {t.description}\n\nParameters: {json.dumps(t.parameters, ensure_ascii=False)}\n"
            for t in tools
        )
        return DEEPSEEK_TOOLS.format(tools=described)

    def parse(self, body: str, tools: list[Tool]) -> list[dict]:
        calls = [{"name": n.strip(), "arguments": json.loads(a)} for n, a in DEEPSEEK_CALL.findall(body)]
        if not calls:
            raise ValueError("no call in the section")
        return calls


class Kimi(CallSyntax):
    name = "kimi_k2"
    opener, next_opener = "<|tool_calls_section_begin|>", ""
    closer = end = "<|tool_calls_section_end|>"
    inner = ("<|tool_call_begin|>", "<|tool_call_argument_begin|>", "<|tool_call_end|>")
    indexed = True

    def rules(self, name: str, tool: Tool, m: Markup, k: int = 0) -> list[str]:
        head = m.lit(f"<|tool_call_begin|>functions.{tool.name}:{k}<|tool_call_argument_begin|>")
        return [f"{name}: {head} {name}_args {m.lit('<|tool_call_end|>')}", json_rule(f"{name}_args", tool.parameters)]

    def parse(self, body: str, tools: list[Tool]) -> list[dict]:
        return kimi_k2.parse_tool_call(body)

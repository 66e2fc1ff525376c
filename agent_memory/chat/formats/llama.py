"""Llama 3.1-3.3's calls: the whole reply is one JSON object, `{"name": "f", "parameters": {…}}`
(their templates take one call per turn and write no text beside it)."""

from __future__ import annotations

import json

from agent_memory.chat.conversation import Tool
from agent_memory.chat.formats.calls import CallSyntax, json_rule
from agent_memory.chat.formats.markup import Markup

OPENER = '{"name": "'


class LlamaJson(CallSyntax):
    name = "llama3_json"
    opener = OPENER
    alone = single = True

    def rules(self, name: str, tool: Tool, m: Markup, k: int = 0) -> list[str]:
        head = m.lit(tool.name + '", "parameters": ')
        return [f"{name}: {head} {name}_args {m.lit('}')}", json_rule(f"{name}_args", tool.parameters)]

    def parse(self, body: str, tools: list[Tool]) -> list[dict]:
        call = json.loads(OPENER + body)
        return [{"name": call["name"], "arguments": call.get("parameters", {})}]

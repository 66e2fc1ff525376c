"""A conversation as the chat template's input.

Models whose template knows tools get them natively (`tools=` and OpenAI-shaped tool calls,
as mlx-lm's tokenizer wrapper passes them to transformers). For templates without tool support
(the demo and tiny models among them) there is a built-in format, the one Hermes and Qwen
models are trained on: the tools are described in the system turn, a call is written as
`<tool_call>\\n{"name": …, "arguments": …}\\n</tool_call>` and a result comes back in a user
turn as `<tool_response>…</tool_response>`. A call is rendered from the arguments text the
model wrote, never re-serialized, so the next turn's prompt extends this turn's prompt and
reply token for token and the agent's cache covers it (docs/usage.md, "Tools").
"""

from __future__ import annotations

import json
from agent_memory.chat.conversation import Conversation, Message, Tool, ToolCall

CALL_START = "<tool_call>"
CALL_END = "</tool_call>"
CALL_PREFIX = CALL_START + '\n{"name": '  # then the name as a JSON string
ARGUMENTS_KEY = ', "arguments": '
CALL_SUFFIX = "}\n" + CALL_END
CALL_SEPARATOR = "\n"

BUILTIN_INSTRUCTIONS = """# Tools

You may call one or more functions to assist with the user query.

You are provided with function signatures within <tools></tools> XML tags:
<tools>
{tools}
</tools>

For each function call, return a json object with function name and arguments within <tool_call></tool_call> XML tags:
<tool_call>
{{"name": <function-name>, "arguments": <args-json-object>}}
</tool_call>"""


def call_text(call: ToolCall) -> str:
    """How a call is written in the built-in format (what constrained decoding produces)."""
    return f"{CALL_PREFIX}{json.dumps(call.name, ensure_ascii=False)}{ARGUMENTS_KEY}{call.arguments}{CALL_SUFFIX}"


def tool_json(tool: Tool) -> dict:
    return {"type": "function", "function": {"name": tool.name, "description": tool.description, "parameters": tool.parameters}}


def template_input(conversation: Conversation, native: bool, history_key: str) -> tuple[list[dict], list[dict] | None]:
    """(messages, tools) for apply_chat_template: natively, or in the built-in format.
    `history_key`: the message field the template reads an earlier turn's reasoning from."""
    if native:
        tools = [tool_json(t) for t in conversation.tools] or None
        return [native_message(m, history_key) for m in conversation.messages], tools
    return builtin_messages(conversation), None


def native_message(m: Message, history_key: str = "reasoning_content") -> dict:
    out: dict = {"role": m.role, "content": m.content}
    if m.reasoning:
        out[history_key] = m.reasoning
    if m.tool_calls:
        out["tool_calls"] = [
            {"id": c.id, "type": "function", "function": {"name": c.name, "arguments": _loads(c.arguments)}}
            for c in m.tool_calls
        ]
    if m.tool_call_id is not None:
        out["tool_call_id"] = m.tool_call_id
    return out


def _loads(arguments: str):
    try:
        return json.loads(arguments)
    except ValueError:
        return arguments


def builtin_messages(conversation: Conversation) -> list[dict]:
    out = []
    if conversation.tools:
        described = BUILTIN_INSTRUCTIONS.format(
            tools="\n".join(json.dumps(tool_json(t), ensure_ascii=False) for t in conversation.tools)
        )
        first = conversation.messages[0] if conversation.messages else None
        if first is not None and first.role == "system":
            out.append({"role": "system", "content": f"{first.content}\n\n{described}"})
        else:
            out.append({"role": "system", "content": described})
    for i, m in enumerate(conversation.messages):
        if i == 0 and conversation.tools and m.role == "system":
            continue
        if m.role == "assistant" and m.tool_calls:
            calls = CALL_SEPARATOR.join(call_text(c) for c in m.tool_calls)
            out.append({"role": "assistant", "content": m.content + calls})
        elif m.role == "tool":
            out.append({"role": "user", "content": f"<tool_response>\n{m.content}\n</tool_response>"})
        else:
            out.append({"role": m.role, "content": m.content})
    return out

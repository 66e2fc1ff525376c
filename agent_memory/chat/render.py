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
from collections.abc import Callable

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


def template_input(
    conversation: Conversation, native: bool, describe: Callable[[list[Tool]], str] | None, history_key: str
) -> tuple[list[dict], list[dict] | None]:
    """(messages, tools) for apply_chat_template: natively, or in the built-in format.
    `describe`: for a template that writes calls but not the tools (DeepSeek's), the tools'
    description for the system turn; `history_key`: the message field the template reads an
    earlier turn's reasoning from."""
    if not native:
        return builtin_messages(conversation), None
    messages = [native_message(m, history_key) for m in conversation.messages]
    if describe is None:
        return messages, [tool_json(t) for t in conversation.tools] or None
    return (_with_system(messages, describe(conversation.tools)) if conversation.tools else messages), None


def _with_system(messages: list[dict], text: str) -> list[dict]:
    """`text` at the end of the system turn (one made for it if there is none)."""
    if messages and messages[0]["role"] == "system":
        return [{**messages[0], "content": f"{messages[0]['content']}\n\n{text}"}, *messages[1:]]
    return [{"role": "system", "content": text}, *messages]


def described_tools(tools: list[Tool]) -> str:
    """The built-in format's description of the tools (Hermes's)."""
    return BUILTIN_INSTRUCTIONS.format(tools="\n".join(json.dumps(tool_json(t), ensure_ascii=False) for t in tools))


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
    for m in conversation.messages:
        if m.role == "assistant" and m.tool_calls:
            calls = CALL_SEPARATOR.join(call_text(c) for c in m.tool_calls)
            out.append({"role": "assistant", "content": m.content + calls})
        elif m.role == "tool":
            out.append({"role": "user", "content": f"<tool_response>\n{m.content}\n</tool_response>"})
        else:
            out.append({"role": m.role, "content": m.content})
    return _with_system(out, described_tools(conversation.tools)) if conversation.tools else out

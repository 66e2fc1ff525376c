"""A conversation as the chat template's input, and rendered through it.

Models whose template knows tools get them natively (`tools=` and OpenAI-shaped tool calls,
as mlx-lm's tokenizer wrapper passes them to transformers). For templates without tool support
(the demo and tiny models among them) there is a built-in format, the one Hermes and Qwen
models are trained on: the tools are described in the system turn, a call is written as
`<tool_call>\\n{"name": …, "arguments": …}\\n</tool_call>` and a result comes back in a user
turn as `<tool_response>…</tool_response>`. A call is rendered from the arguments text the
model wrote, never re-serialized, so the next turn's prompt extends this turn's prompt and
reply token for token and the agent's cache covers it (docs/usage.md, "Tools").

A request's template variables (`chat_template_kwargs`) are only that: never an argument of the
renderer itself (the template, `add_generation_prompt`, ...), and small (`check_variables`).
`render_prompt` renders; a failure is a `RenderError` whose message is the template's own
(`raise_exception`) and never a library's internals.
"""

from __future__ import annotations

import inspect
import json
from collections.abc import Callable

import jinja2
from transformers import PreTrainedTokenizerBase
from transformers.utils.chat_template_utils import render_jinja_template

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


def _named(fn: Callable) -> set[str]:
    """A function's parameters that have a name (not *args, **kwargs, self)."""
    named = (p for p in inspect.signature(fn).parameters.values() if p.kind not in (p.VAR_KEYWORD, p.VAR_POSITIONAL))
    return {p.name for p in named} - {"self"}


# What the renderer takes itself, read from the installed transformers (so a new argument is
# covered by an upgrade): apply_chat_template's and render_jinja_template's named parameters,
# `messages` (the template's name for the conversation) and the tokenizer's special tokens,
# which a variable of the same name would replace. None of these is a request's to set.
RENDERER_ARGUMENTS = frozenset(
    _named(PreTrainedTokenizerBase.apply_chat_template)
    | _named(render_jinja_template)
    | {"messages", *PreTrainedTokenizerBase.SPECIAL_TOKENS_ATTRIBUTES}
)
MAX_VARIABLES_CHARS = 16_384  # all of a request's template variables, as JSON
MAX_VARIABLE_DEPTH = 8  # lists and objects within a variable's value


class TemplateVariableError(ValueError):
    """A request's template variable that is no variable, or too large: a 400 naming `param`."""

    def __init__(self, message: str, param: str) -> None:
        super().__init__(message)
        self.param = param


class RenderError(ValueError):
    """The chat template could not render a request's messages (the message says why)."""


def check_variables(variables: dict, param: str) -> None:
    """Refuse what the template must not get as a variable: one of the renderer's own
    arguments, a value nested deeper than MAX_VARIABLE_DEPTH, or more than
    MAX_VARIABLES_CHARS in all (the template may loop over a value, and its time is bounded)."""
    for name, value in variables.items():
        if name in RENDERER_ARGUMENTS:
            raise TemplateVariableError(
                f"'{name}' is not a chat template variable: the server sets the template and its "
                f"renderer's arguments; {param} passes only variables the template reads",
                f"{param}.{name}",
            )
        if _too_deep(value):
            raise TemplateVariableError(
                f"'{name}' nests lists or objects more than {MAX_VARIABLE_DEPTH} deep", f"{param}.{name}"
            )
    size = len(json.dumps(variables, ensure_ascii=False))
    if size > MAX_VARIABLES_CHARS:
        raise TemplateVariableError(
            f"chat template variables are at most {MAX_VARIABLES_CHARS} characters as JSON, not {size}", param
        )


def _too_deep(value: object) -> bool:
    """Whether lists and objects nest more than MAX_VARIABLE_DEPTH deep (found without recursion)."""
    stack = [(value, 0)]
    while stack:
        item, depth = stack.pop()
        if isinstance(item, (list, dict)):
            if depth == MAX_VARIABLE_DEPTH:
                return True
            stack.extend((x, depth + 1) for x in (item.values() if isinstance(item, dict) else item))
    return False


def render_prompt(tokenizer, conversation: Conversation, fmt) -> str:
    """The prompt's text: the conversation (template_input, as the reply format `fmt` has the
    tools and earlier reasoning written) through the model's chat template, with the generation
    prompt and the request's template variables (Thinking.kwargs)."""
    messages, tools = template_input(conversation, fmt.native, fmt.describe, fmt.history_key)
    try:
        return tokenizer.apply_chat_template(
            messages, tools=tools, add_generation_prompt=True, tokenize=False, **conversation.thinking.kwargs()
        )
    except jinja2.TemplateError as e:  # the template's own refusal (raise_exception) or its mistake
        raise RenderError(f"the chat template cannot render these messages: {e}") from e
    except Exception as e:  # a library's error: its text names its internals, not the request's
        raise RenderError(f"the chat template cannot render these messages ({type(e).__name__})") from e


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


def template_content(m: Message, before: str = "", after: str = "") -> str | list[dict]:
    """A message's content as the template reads it: its text, or, with images, a list of
    parts — `{"type": "text", "text": …}` and `{"type": "image"}` in order, as Hugging Face
    processors' chat templates take them and write the model's image placeholder for."""
    if not m.parts:
        return before + m.content + after
    parts = [p for p in (before, *m.parts, after) if not isinstance(p, str) or p]
    return [{"type": "text", "text": p} if isinstance(p, str) else {"type": "image"} for p in parts]


def native_message(m: Message, history_key: str = "reasoning_content") -> dict:
    out: dict = {"role": m.role, "content": template_content(m)}
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
            out.append({"role": "user", "content": template_content(m, "<tool_response>\n", "\n</tool_response>")})
        else:
            out.append({"role": m.role, "content": template_content(m)})
    return _with_system(out, described_tools(conversation.tools)) if conversation.tools else out

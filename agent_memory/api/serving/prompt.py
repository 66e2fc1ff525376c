"""A conversation made a prompt: rendered through the chat template on a render thread, bounded
in time, then tokenized with the grammar its reply must follow on the model's tokenizer
thread; and how the reply's text will be read back."""

from __future__ import annotations

from dataclasses import dataclass

from agent_memory.api.errors import APIError
from agent_memory.api.state import ServedModel
from agent_memory.chat.call_check import CheckedReader
from agent_memory.chat.conversation import Conversation
from agent_memory.chat.finish import ConstrainedOutput
from agent_memory.chat.grammar import GrammarError
from agent_memory.chat.images import load
from agent_memory.chat.render import RenderError, render_prompt
from agent_memory.engine.requests import Breakpoint
from agent_memory.vision.prompt import VisionInputs, VisionPromptError

CHAT_PARAMS = ("messages", "tools", "response_format")  # chat completions' names for them


@dataclass
class Prepared:
    """What the engine is asked to continue, and what the reply is read against."""

    prompt: list[int]
    grammar: ConstrainedOutput | None  # None: free text
    started: bool | None = None  # the prompt opened the reply's reasoning, closed it (False), or neither
    conversation: Conversation | None = None  # None: a raw prompt (text completions)
    param: str = "messages"  # where the prompt is in the body, for errors
    text: str = ""  # the rendered prompt the tokens encode (a chat's)
    breakpoints: tuple[Breakpoint, ...] = ()  # a client's cache breakpoints (api/anthropic/breakpoints.py)
    vision: VisionInputs | None = None  # its images' pixels and spans (a vision model's); None: text only


async def prepare_chat(
    model: ServedModel,
    conversation: Conversation,
    params: tuple[str, str, str] = CHAT_PARAMS,
    constrained: bool = True,
) -> Prepared:
    """The conversation rendered through the chat template (tools natively or in the built-in
    format) on a render thread, then tokenized, and the grammar its output must follow, on the
    tokenizer worker.
    `params`: the wire format's names of the messages, the tools and the output format;
    `constrained` False: only the prompt (counting tokens compiles no grammar)."""
    messages_param, tools_param, format_param = params
    chars = sum(len(m.content) + sum(len(c.arguments) for c in m.tool_calls) for m in conversation.messages)
    check_length(model, chars, messages_param)
    await load_images(model, conversation)

    fmt = model.reply_format
    try:  # on a render thread, bounded in time: a slow template holds up no other request
        text = await model.render(lambda tok: render_prompt(tok, conversation, fmt))
    except RenderError as e:
        raise APIError(400, str(e), param=messages_param) from e

    def prepare(tokenizer) -> Prepared:
        started = fmt.started_by(text)
        grammar = output_grammar(model, conversation, tools_param, format_param, started) if constrained else None
        tokens, vision = encode_prompt(model, tokenizer, text, conversation.images(), messages_param)
        return Prepared(tokens, grammar, started, conversation, messages_param, text, vision=vision)

    return await model.tokenize(prepare)


async def load_images(model: ServedModel, conversation: Conversation) -> None:
    """The conversation's images decoded and checked (chat/images.py: a bad one is a 400 naming
    its part, whatever the model), then refused with the first one named if the model takes none."""
    sources = conversation.images()
    if not sources:
        return
    conversation.put_images(await load(sources, model.images))
    if not model.facts.takes_images:
        raise APIError(
            400,
            f"{sources[0].where}: the model '{model.id}' takes no images (a text-only model)",
            param=sources[0].where,
            code="images_not_supported",
        )


def encode_prompt(
    model: ServedModel, tokenizer, text: str, images: list, param: str
) -> tuple[list[int], VisionInputs | None]:
    """The rendered prompt's tokens, and with images (ChatImages, in the prompt's order) the
    vision model's processor's: each placeholder expanded to its image's tokens, the images'
    inputs and keys (vision/prompt.py). On the tokenizer worker."""
    if not images:
        return tokenizer.encode(text, add_special_tokens=False), None
    try:
        return model.facts.vision.prepare(text, images)
    except VisionPromptError as e:
        raise APIError(400, str(e), param=param) from e


def output_grammar(
    model: ServedModel, conversation: Conversation, tools_param: str, format_param: str, started: bool | None
) -> ConstrainedOutput | None:
    """What the reply must follow (None: free text); a 400 when the request asks for what
    cannot be enforced. On the tokenizer worker: it compiles, and finds the shortest finish."""
    fmt = model.reply_format
    if conversation.calls_tools and not fmt.constrained:
        if conversation.tool_choice.mode != "auto":
            raise APIError(
                400,
                f"tool_choice '{conversation.tool_choice.mode}' cannot be enforced: this model's template writes "
                f"calls in mlx-lm's {fmt.name} format, which is parsed but not constrained here",
                param="tool_choice",
            )
        return None
    try:
        text_grammar = model.grammars.grammar(conversation, tools_param, format_param, started)
        return model.grammars.output(text_grammar, conversation.calls_tools) if text_grammar else None
    except GrammarError as e:
        raise APIError(400, str(e), param=e.param, code="invalid_schema") from e


def reply_reader(model: ServedModel, prepared: Prepared):
    """How a reply's text turns into reasoning, content and calls (chat/reader.py)."""
    conversation = prepared.conversation
    tools = conversation.tools if conversation is not None and conversation.calls_tools else []
    reader = model.reply_format.reader(tools, prepared.started)
    return CheckedReader(reader, tools) if tools else reader


def token_counter(model: ServedModel):
    """text -> how many tokens it is (a reply's reasoning, for usage), on the event loop with
    the model's counting tokenizer (never the tokenizer worker's)."""
    return lambda text: len(model.counter.encode(text, add_special_tokens=False).ids)


def check_length(model: ServedModel, chars: int, param: str) -> None:
    """Refuse a prompt that cannot fit before tokenizing it: n characters are at least
    n / (the longest token's characters) tokens. A 10 MB message costs nothing this way."""
    at_least = -(-chars // model.facts.max_token_chars)
    if at_least >= model.context_length:
        raise APIError(
            400,
            f"This model's maximum context length is {model.context_length} tokens, but the prompt "
            f"is at least {at_least} tokens ({chars} characters).",
            param=param,
            code="context_length_exceeded",
        )

"""Anthropic `cache_control` breakpoints as prompt positions: each marked block (a tool, a
system block, a message's content block; the body's own `cache_control` marks the last) says
the client will come back to the prompt up to and including it. The body cut after the block
is rendered; where its text stops matching the prompt's (the marked block's end, or the chat
template's end of that turn) is mapped to a token index with one tokenization's offsets, one
token short of the boundary (the text after it may tokenize the boundary otherwise). The engine
stops its prefill there to offer it (a snapshot on window and recurrent layers) and keeps the
blocks up to it with priority for the breakpoint's ttl (engine/requests.py `Breakpoint`)."""

from __future__ import annotations

from dataclasses import dataclass

from agent_memory.api.anthropic.conversation import as_conversation
from agent_memory.api.anthropic.schemas import CacheControl, MessagesRequest
from agent_memory.api.sealing import TenantSeal
from agent_memory.api.serving.prompt import Prepared
from agent_memory.api.state import ServedModel
from agent_memory.chat.render import RenderError, render_prompt
from agent_memory.engine.requests import Breakpoint

TTL_SECONDS = {"5m": 300.0, "1h": 3600.0}


@dataclass
class Marked:
    """A breakpoint: the body cut after its block (None: the whole prompt), and its ttl."""

    cut: MessagesRequest | None
    control: CacheControl


def marked(body: MessagesRequest) -> list[Marked]:
    """The body's breakpoints, in Anthropic's order: tools, system, messages, the body's own."""
    out = []
    empty = {"system": None, "messages": []}
    for i, tool in enumerate(body.tools or []):
        if tool.cache_control is not None:
            cut = body.model_copy(update={**empty, "tools": body.tools[: i + 1]})
            out.append(Marked(cut, tool.cache_control))
    for i, block in enumerate(body.system or []):
        if block.cache_control is not None:
            cut = body.model_copy(update={**empty, "system": body.system[: i + 1]})
            out.append(Marked(cut, block.cache_control))
    for i, message in enumerate(body.messages):
        for j, block in enumerate(message.content):
            if block.cache_control is not None:
                last = message.model_copy(update={"content": message.content[: j + 1]})
                cut = body.model_copy(update={"messages": [*body.messages[:i], last]})
                out.append(Marked(cut, block.cache_control))
    if body.cache_control is not None:
        out.append(Marked(None, body.cache_control))
    return out


async def positions(
    model: ServedModel, body: MessagesRequest, seal: TenantSeal, prepared: Prepared
) -> tuple[Breakpoint, ...]:
    """Each breakpoint's prompt position, ascending (one a template cannot render alone, or
    that keeps nothing, is left out: a priority, never an error)."""
    points = marked(body)
    if not points:
        return ()
    text, prompt = prepared.text, prepared.prompt
    encoding = await model.tokenize(lambda _: model.counter.encode(text, add_special_tokens=False))
    if encoding.ids != prompt:  # the counting tokenizer reads this prompt otherwise: no positions
        return ()
    ends = [end for _, end in encoding.offsets]
    found: dict[int, float] = {}
    for point in points:
        if point.cut is None:
            position = len(prompt) - 1  # the last block: all the engine prefills
        else:
            conversation = as_conversation(point.cut, seal)
            try:
                cut = await model.render(lambda tok, c=conversation: render_prompt(tok, c, model.reply_format))
            except RenderError:  # a template that needs a user message, say
                continue
            shared = next((i for i, (a, b) in enumerate(zip(cut, text)) if a != b), min(len(cut), len(text)))
            position = sum(1 for end in ends if end <= shared) - 1
        if position > 0:
            found[position] = max(found.get(position, 0.0), TTL_SECONDS[point.control.ttl])
    return tuple(Breakpoint(p, ttl) for p, ttl in sorted(found.items()))

"""A chat turn's settle: after the engine's last event and before the reply's last frame
reaches its client, the history as the chat template will write it back (chat/continuation.py)
goes to the engine as a prefill-only request for the turn's agent. So the next request, which a
tool loop sends within milliseconds, finds it queued first and waits for it (engine/scheduler.py
`blocked`), and reuses the whole turn; the engine queues no canonical follow-up of its own
(GenerationRequest.settles). One render and one tokenize per turn, on the model's render and
tokenizer threads."""

from __future__ import annotations

import logging
from collections.abc import AsyncIterator
from dataclasses import replace

from agent_memory.api.errors import APIError
from agent_memory.api.serving.prompt import Prepared, encode_prompt
from agent_memory.api.serving.wire import Answer
from agent_memory.api.state import ServedModel
from agent_memory.chat.continuation import settled_history, settled_tokens
from agent_memory.chat.render import RenderError
from agent_memory.vision.prompt import VisionInputs
from agent_memory.engine.requests import Event, Finished, GenerationRequest, SamplingParams

log = logging.getLogger(__name__)


class Settle:
    """One request's settle: it sees the engine's events go by (`events`), and once the
    answer's reply is whole, before the frame that follows (`frames`) or the JSON body
    (`after`), sends the settled history to the engine, once."""

    def __init__(self, model: ServedModel, prepared: Prepared, generation: GenerationRequest, answer: Answer) -> None:
        self.model, self.prepared, self.generation, self.answer = model, prepared, generation, answer
        self.finished: Finished | None = None
        self.done = not generation.settles

    async def events(self, source: AsyncIterator[Event]) -> AsyncIterator[Event]:
        """`source`'s events, its last Finished noted (whose usage names the turn's agent)."""
        try:
            async for event in source:
                if isinstance(event, Finished):
                    self.finished = event
                yield event
        finally:
            await source.aclose()

    async def frames(self, source: AsyncIterator[str]) -> AsyncIterator[str]:
        """`source`'s frames, the settle sent before the first one its whole reply makes."""
        try:
            async for frame in source:
                await self.after(self.finished)
                yield frame
        finally:
            await source.aclose()

    async def after(self, finished: Finished | None) -> None:
        """Send the settle, if this turn has one and its reply is whole."""
        if self.done or finished is None or (reply := self.answer.returned()) is None:
            return
        self.done = True
        agent, conversation = finished.usage.agent, self.prepared.conversation
        if agent is None or finished.reason not in ("stop", "length") or conversation is None:
            return
        model, fmt = self.model, self.model.reply_format
        try:
            text = await model.render(lambda tok: settled_history(tok, conversation, reply, fmt))
        except RenderError as e:
            log.warning("no settle for request %s: %s", self.generation.request_id, e)
            return
        if text is None:
            return
        try:
            tokens, vision = await model.tokenize(lambda tok: settled_prompt(model, tok, text, conversation.images()))
        except APIError as e:  # the processor disagrees with the history's images: the engine's follow-up stands
            log.warning("no settle for request %s: %s", self.generation.request_id, e.message)
            return
        params = SamplingParams(max_tokens=0, temperature=0.0)
        keys = vision.keys if vision is not None else ()
        settle = replace(
            self.generation, prompt=tokens, params=params, agent=agent, grammar=None, settles=False, prefill_only=True,
            extra_keys=keys, vision=vision,
        )
        model.engine.submit(settle, lambda event: None)


def settled_prompt(model: ServedModel, tokenizer, text: str, images: list) -> tuple[list[int], VisionInputs | None]:
    """The settled history's tokens less the last (it may merge with what follows it), and
    with images the processor's: each image's tokens expanded and keyed as its request's were,
    so a turn with images is kept whole too. On the tokenizer worker."""
    if not images:
        return settled_tokens(tokenizer, text), None
    tokens, vision = encode_prompt(model, tokenizer, text, images, "messages")
    return tokens[:-1], vision

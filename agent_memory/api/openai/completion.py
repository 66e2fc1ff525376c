"""`/v1/completions` as a wire format (serving/wire.py): a raw prompt (text, or the model's token
ids) continued as it is, its text and legacy logprobs streamed or whole."""

from __future__ import annotations

import time
import uuid
from collections.abc import AsyncIterator

from fastapi import Request

from agent_memory.api.errors import APIError
from agent_memory.api.logprobs import LogprobWriter
from agent_memory.api.openai.reply import text_choice, total_usage, usage_dict
from agent_memory.api.openai.schemas import CompletionRequest
from agent_memory.api.openai.shared import CompletionStream, finished_samples, openai_asked
from agent_memory.api.serving.events import merged
from agent_memory.api.serving.prompt import Prepared, check_length
from agent_memory.api.serving.wire import Admitted, WireFormat
from agent_memory.api.state import ServedModel
from agent_memory.engine.requests import Event, Finished, TextDelta


class TextCompletion(WireFormat):
    def __init__(self, body: CompletionRequest, request: Request) -> None:
        self.body = body
        self.asked = openai_asked(body, request)

    async def prompt(self, model: ServedModel) -> Prepared:
        if isinstance(self.body.prompt, str):
            text = self.body.prompt
            check_length(model, len(text), "prompt")
            tokens = await model.tokenize(lambda tok: tok.encode(text))
        else:
            tokens = list(self.body.prompt)
            if any(t < 0 or t >= model.vocabulary for t in tokens):
                raise APIError(400, f"prompt token ids must be in [0, {model.vocabulary})", param="prompt")
        return Prepared(tokens, None, param="prompt")

    def answer(self, model: ServedModel, prepared: Prepared, admitted: Admitted) -> CompletionAnswer:
        return CompletionAnswer(model, self.body)


class CompletionAnswer:
    """A text completion's n choices, streamed as chunks or whole as one object."""

    def __init__(self, model: ServedModel, body: CompletionRequest) -> None:
        self.headers: dict[str, str] = {}
        self.model = model.answering(body.model)
        self.sse = CompletionStream.of("cmpl-" + uuid.uuid4().hex, "text_completion", self.model, body.include_usage())
        self.asked_logprobs = body.logprobs is not None
        self.writers = [LogprobWriter(model.counter) for _ in range(body.n)]

    def returned(self) -> None:
        """No conversation continues a text completion: its agent keeps the canonical reply."""
        return None

    def logprobs(self, event: TextDelta) -> dict | None:
        return self.writers[event.index].legacy(event.logprobs or []) if self.asked_logprobs else None

    @staticmethod
    def usage(finished: list[Finished]) -> dict:
        return usage_dict(total_usage(finished))

    def chunks(self, event: TextDelta | Finished) -> list[dict]:
        if isinstance(event, TextDelta):
            return [{"choices": [text_choice(event.text, None, event.index, self.logprobs(event))]}]
        return [{"choices": [text_choice("", event.reason, event.index)]}]

    def stream(self, events: AsyncIterator[Event]) -> AsyncIterator[str]:
        return self.sse.frames(events, [], self.chunks, self.usage)

    def body(self, events: list[Event]) -> dict:
        finished = finished_samples(events)
        choices = []
        for f in finished:
            text = merged(events, f.index)
            choices.append(text_choice(text.text, f.reason, f.index, self.logprobs(text)))
        return {
            "id": self.sse.completion_id,
            "object": "text_completion",
            "created": int(time.time()),
            "model": self.model,
            "choices": choices,
            "usage": self.usage(finished),
        }

"""What chat and text completions share: what a body asks (`openai_asked`) and a completion's
SSE frames (`CompletionStream`)."""

from __future__ import annotations

import json
import time
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass

from fastapi import Request

from agent_memory.api.errors import error_body
from agent_memory.api.openai.schemas import SamplingFields
from agent_memory.api.serving.controls import retention
from agent_memory.api.serving.speaker import openai_agent
from agent_memory.api.serving.wire import Asked
from agent_memory.engine.requests import Event, Failed, Finished, TextDelta


def openai_asked(body: SamplingFields, request: Request) -> Asked:
    agent = openai_agent(body, request)
    return Asked(
        body.model, agent, body.token_limit(), body.sampling(), body.cache_salt, body.stream,
        remember=body.remember, retention=retention(body.prompt_cache_retention),
    )


def finished_samples(events: list[Event]) -> list[Finished]:
    """Each sample's Finished event, in index order."""
    return sorted((e for e in events if isinstance(e, Finished)), key=lambda e: e.index)


@dataclass(frozen=True)
class CompletionStream:
    """One completion's SSE stream: every chunk carries its id, object name, creation time and model."""

    completion_id: str
    object_name: str  # "chat.completion.chunk" or "text_completion"
    model: str  # the name the request used
    include_usage: bool
    created: int

    @classmethod
    def of(cls, completion_id: str, object_name: str, model: str, include_usage: bool) -> CompletionStream:
        return cls(completion_id, object_name, model, include_usage, int(time.time()))

    def frame(self, payload: dict) -> str:
        head = {"id": self.completion_id, "object": self.object_name, "created": self.created, "model": self.model}
        payload = {**head, **payload}
        if self.include_usage:
            payload.setdefault("usage", None)
        return f"data: {json.dumps(payload)}\n\n"

    async def frames(
        self,
        events: AsyncIterator[Event],
        first: list[dict],
        chunks: Callable[[TextDelta | Finished], list[dict]],
        usage: Callable[[list[Finished]], dict],
    ) -> AsyncIterator[str]:
        """`first`, the chunks of each engine event, once every choice has finished the usage
        chunk when asked, then [DONE]; a failure is an error frame."""
        for payload in first:
            yield self.frame(payload)
        finished: list[Finished] = []
        async for event in events:
            if isinstance(event, Failed):
                yield f"data: {json.dumps(error_body(event.status, event.message, code=event.code))}\n\n"
                finished = []  # no usage after a failure
                break
            for payload in chunks(event):
                yield self.frame(payload)
            if isinstance(event, Finished):
                finished.append(event)
        if self.include_usage and finished:
            yield self.frame({"choices": [], "usage": usage(sorted(finished, key=lambda e: e.index))})
        yield "data: [DONE]\n\n"

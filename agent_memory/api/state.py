"""What the HTTP handlers share: settings, the engine and the tokenizer worker."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Any, TypeVar

from fastapi import Request

from agent_memory.api.errors import APIError
from agent_memory.engine.loop import BatchEngine

T = TypeVar("T")


@dataclass
class ServerState:
    engine: BatchEngine
    model_name: str
    started: int = field(default_factory=lambda: int(time.time()))
    # Tokenizing a long prompt is CPU work: one worker keeps it off the event loop and
    # never runs the tokenizer from two threads at once.
    tokenizer_pool: ThreadPoolExecutor = field(
        default_factory=lambda: ThreadPoolExecutor(1, thread_name_prefix="tokenizer")
    )

    @property
    def context_length(self) -> int:
        return self.engine.loaded.context_length

    @property
    def vocab_size(self) -> int:
        return len(self.engine.loaded.tokenizer)

    async def tokenize(self, fn: Callable[[Any], T]) -> T:
        tokenizer = self.engine.loaded.tokenizer
        return await asyncio.get_running_loop().run_in_executor(self.tokenizer_pool, fn, tokenizer)


def ready_state(request: Request) -> ServerState:
    """The server state, once the model is loaded (503 before)."""
    state: ServerState = request.app.state.server
    if not state.engine.ready.is_set() or state.engine.loaded is None:
        raise APIError(503, "the model is still loading; retry shortly", code="model_loading")
    return state

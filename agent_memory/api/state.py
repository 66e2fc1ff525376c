"""What the HTTP handlers share: settings, the engine and the tokenizer worker."""

from __future__ import annotations

import asyncio
import time
import weakref
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from functools import cached_property
from typing import Any, TypeVar

from fastapi import Request

from agent_memory.api.errors import APIError
from agent_memory.api.responses.store import ResponseStore
from agent_memory.chat.grammar import GrammarCompiler
from agent_memory.chat.render import ToolFormat
from agent_memory.engine.loop import BatchEngine

T = TypeVar("T")


@dataclass
class ServerState:
    engine: BatchEngine
    model_name: str
    responses: ResponseStore
    max_waiting: int = 128  # requests waiting for their first token before 503s begin
    # Requests admitted and not yet answering, as weak references: one that is dropped before
    # it reaches the engine (its client left first) leaves the count by itself.
    waiting: weakref.WeakSet = field(default_factory=weakref.WeakSet)
    # Each request's log fields (access_log.py), filled in as its events arrive.
    traces: weakref.WeakKeyDictionary = field(default_factory=weakref.WeakKeyDictionary)
    log_agent_ids: bool = False
    started: int = field(default_factory=lambda: int(time.time()))
    # Tokenizing a long prompt is CPU work: one worker keeps it off the event loop and
    # never runs the tokenizer from two threads at once.
    tokenizer_pool: ThreadPoolExecutor = field(
        default_factory=lambda: ThreadPoolExecutor(1, thread_name_prefix="tokenizer")
    )

    @cached_property
    def tool_format(self) -> ToolFormat:
        return ToolFormat.of(self.engine.loaded.tokenizer)

    @cached_property
    def grammars(self) -> GrammarCompiler:
        """Built on first use, on the tokenizer worker (about a second on a large vocabulary)."""
        return GrammarCompiler(self.engine.loaded.tokenizer, self.engine.loaded.vocab_size)

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

"""What the HTTP handlers share: the served models, each an engine seen through EngineClient
alone, and the server's own settings and counts."""

from __future__ import annotations

import asyncio
import ctypes
import threading
import time
import weakref
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from functools import cached_property
from typing import Any, TypeVar

from fastapi import Request
from tokenizers import Tokenizer

from agent_memory.api.errors import APIError
from agent_memory.chat.grammar import GrammarCompiler
from agent_memory.chat.images import ImageLimits
from agent_memory.chat.render import RenderError
from agent_memory.engine.protocol import EngineClient, ModelFacts

T = TypeVar("T")

# A chat template is a program, run on variables and messages a client chose: each render gets
# RENDER_SECONDS (a real one takes milliseconds, thousands of messages well under a second) and
# runs on one of RENDER_THREADS per model, so a slow one holds one thread for at most that long
# while the other renders everyone else's requests, and other models have threads of their own.
# Two, not more: renders hold the GIL, so more threads add no speed, and each slow one running
# slows the rest of the server (the event loop, the engine thread) until its deadline. Threads
# rather than processes: the tokenizer and its template stay in one place, nothing to restart.
RENDER_THREADS = 2
RENDER_SECONDS = 5
_raise_in_thread = ctypes.pythonapi.PyThreadState_SetAsyncExc


class RenderTimeout(BaseException):
    """Raised inside a render that ran past its deadline; not an Exception, so that no library's
    `except Exception` on the way out swallows it."""


class _Deadline:
    """One render's deadline. Python cannot stop a thread, but it can make one raise: once the
    deadline passes, RenderTimeout is raised in the thread running the render (at its next
    bytecode, a pure template loop included). The lock keeps it within the render: one that
    comes as the render ends is withdrawn before the thread goes back to the pool."""

    def __init__(self, loop: asyncio.AbstractEventLoop, seconds: float) -> None:
        self.loop, self.seconds = loop, seconds
        self.lock = threading.Lock()
        self.thread: int | None = None  # while the render runs
        self.raised = False

    def run(self, fn: Callable[[Any], T], arg: Any) -> T:
        """fn(arg), on the render thread, the deadline counted from now (not from the queue)."""
        with self.lock:
            self.thread = threading.get_ident()
        self.loop.call_soon_threadsafe(self.loop.call_later, self.seconds, self._interrupt)
        try:
            return fn(arg)
        finally:
            with self.lock:
                self.thread = None
                if self.raised:  # NULL: withdraw it if it has not been raised yet
                    _raise_in_thread(ctypes.c_ulong(threading.get_ident()), None)

    def _interrupt(self) -> None:
        with self.lock:
            if self.thread is not None:
                self.raised = True
                _raise_in_thread(ctypes.c_ulong(self.thread), ctypes.py_object(RenderTimeout))


@dataclass(eq=False)
class ServedModel:
    """One served model as the API sees it: its engine, and what the API derives from the
    model's facts once it is loaded (its reply format, its grammar compiler)."""

    id: str  # the id it is served under: known before it loads, answered when a name is unknown
    engine: EngineClient
    images: ImageLimits = field(default_factory=ImageLimits)  # the operator's limits on a request's images
    # Tokenizing a long prompt is CPU work: one worker keeps it off the event loop and
    # never runs the model's tokenizer from two threads at once.
    tokenizer_pool: ThreadPoolExecutor = field(
        default_factory=lambda: ThreadPoolExecutor(1, thread_name_prefix="tokenizer")
    )
    # Rendering the chat template reads the tokenizer's template and special tokens, never its
    # encoder: two at once, each bounded (RENDER_SECONDS), so none waits behind a slow one.
    render_pool: ThreadPoolExecutor = field(
        default_factory=lambda: ThreadPoolExecutor(RENDER_THREADS, thread_name_prefix="render")
    )

    @property
    def facts(self) -> ModelFacts:
        """The loaded model's facts (a route runs once every model is loaded: ready_state)."""
        return self.engine.model

    @property
    def ids(self) -> tuple[str, ...]:
        """Every id it answers to: the one it is served under, then the others (its folder's
        name under `--model NAME=…`, `demo`'s aliases; known once it is loaded)."""
        facts = self.engine.model
        return (self.id, *(i for i in facts.ids if i != self.id)) if facts is not None else (self.id,)

    def answering(self, requested: str | None) -> str:
        """The model id a reply names: the one asked for when it is one of this model's ids
        (clients such as AutoGen check), else the model's own."""
        return requested if requested in self.ids else self.id

    @property
    def reply_format(self):
        """How the model writes calls and reasoning (chat/formats/reply.py), found at load."""
        return self.facts.reply_format

    @cached_property
    def grammars(self) -> GrammarCompiler:
        """Built on first use, on the tokenizer worker (about a second on a large vocabulary)."""
        return GrammarCompiler(self.facts.tokenizer, self.facts.vocab_size, self.reply_format)

    @cached_property
    def counter(self) -> Tokenizer:
        """A copy of the tokenizer for the event loop's counting (a reply's reasoning tokens):
        the model's own is the tokenizer worker's alone."""
        return Tokenizer.from_str(self.facts.tokenizer.backend_tokenizer.to_str())

    @property
    def context_length(self) -> int:
        return self.facts.context_length

    @property
    def vocabulary(self) -> int:
        """How many token ids the tokenizer knows: those a request may name."""
        return len(self.facts.tokenizer)

    async def tokenize(self, fn: Callable[[Any], T]) -> T:
        """fn(tokenizer), on the tokenizer worker."""
        return await asyncio.get_running_loop().run_in_executor(self.tokenizer_pool, fn, self.facts.tokenizer)

    async def render(self, fn: Callable[[Any], T]) -> T:
        """fn(tokenizer) on a render thread, stopped once past RENDER_SECONDS (a RenderError)."""
        loop = asyncio.get_running_loop()
        deadline = _Deadline(loop, RENDER_SECONDS)
        try:
            return await loop.run_in_executor(self.render_pool, deadline.run, fn, self.facts.tokenizer)
        except RenderTimeout:
            message = f"the chat template took longer than {RENDER_SECONDS} s to render these messages"
            raise RenderError(message) from None


@dataclass
class ServerState:
    models: dict[str, ServedModel]  # by the id each is served under; the first answers unknown names
    max_waiting: int = 128  # requests waiting for their first token before 503s begin
    # Requests admitted and not yet answering, as weak references: one that is dropped before
    # it reaches the engine (its client left first) leaves the count by itself.
    waiting: weakref.WeakSet = field(default_factory=weakref.WeakSet)
    # Each request's log fields (access_log.py), filled in as its events arrive.
    traces: weakref.WeakKeyDictionary = field(default_factory=weakref.WeakKeyDictionary)
    log_agent_ids: bool = False
    started: int = field(default_factory=lambda: int(time.time()))

    def model_for(self, requested: str | None, kind: str = "chat") -> ServedModel:
        """The model a request's `model` names, of the kind its route serves ("chat" or
        "embedding"): a model of the other kind is a 400 naming it and what it serves. A server
        of one model of the kind answers every other name with it (clients send their own names:
        Claude Code's, Codex's, LangChain's); with several, a request without a name gets the
        first and an unknown name is a 404 that lists the served ones."""
        models = list(self.models.values())
        found = next((m for m in models if requested in m.ids), None)
        if found is not None and found.facts.kind != kind:
            raise APIError(400, wrong_kind(requested, found.facts.kind), param="model", code="model_not_supported")
        same = [m for m in models if m.facts.kind == kind]
        if found is not None or (same and (len(same) == 1 or not requested)):
            return found or same[0]
        if not same:
            raise APIError(400, f"this server serves no {kind} model", param="model", code="model_not_supported")
        served = ", ".join(i for m in same for i in m.ids)
        raise APIError(
            404,
            f"The model '{requested}' does not exist; this server serves {served}",
            param="model",
            code="model_not_found",
        )

    @property
    def loaded(self) -> bool:
        return all(m.engine.model is not None for m in self.models.values())


def wrong_kind(name: str, kind: str) -> str:
    """Why a model of `kind` cannot answer a request of the other kind."""
    if kind == "embedding":
        serves = "it serves /v1/embeddings, not chat, completions, messages or responses"
        return f"the model '{name}' is an embedding model: {serves}"
    serves = "it serves chat, completions, messages and responses, not /v1/embeddings"
    return f"the model '{name}' is a chat model: {serves}"


def ready_state(request: Request) -> ServerState:
    """The server state, once every model is loaded (503 before)."""
    state: ServerState = request.app.state.server
    if not state.loaded:
        raise APIError(503, "the model is still loading; retry shortly", code="model_loading")
    return state

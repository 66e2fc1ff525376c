"""A served model's weights in and out of memory: the one lifecycle that chat and embedding
engines share (BatchEngine and EmbeddingEngine each hold a `Weights`). They load at start or
for the first request that asks, and unload when idle or to make room for another model: a
`Weights` is what the residency (residency.py) counts and asks (`residency.Resident`). What a
load builds and an unload drops is the model's own (`Loadable`: engine/chat_model.py's
`ChatModel`, embeddings/engine.py's `Embedder`). It runs on its engine's thread but for
`idle_since`, `unload`, `set_budgets`, `unavailable` and the arrival count, which only read or
post to that thread."""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable
from concurrent.futures import Future
from typing import Protocol

import agent_memory.blas  # noqa: F401
import mlx.core as mx
from prometheus_client import Counter, Gauge

from agent_memory.engine.loading.budget import describe_split, give_back_memory, tell_mlx
from agent_memory.engine.loading.residency import NoRoom, Residency
from agent_memory.engine.requests import MODEL_UNAVAILABLE, Failed

log = logging.getLogger(__name__)


class Loadable(Protocol):
    """What loading makes and unloading drops, for one kind of model (on its engine's thread
    but `damage` and `busy`)."""

    def damage(self) -> str | None:
        """Why its files cannot be loaded now (checked each time: a finished download mends it)."""

    def room_bytes(self) -> int:
        """What its weights take, read from their files: the room a load asks for."""

    def load(self, hot_bytes: int, working_bytes: int | None) -> int:
        """Put the weights in, with this share of the limit: their bytes in memory."""

    def unload(self) -> None:
        """Drop the weights and what computes with them."""

    def busy(self) -> bool:
        """Whether requests are running on it now."""

    def set_budgets(self, hot_bytes: int, working_bytes: int | None) -> None:
        """Apply a new share of the limit while loaded."""


class LoadCounts(Protocol):
    """The Prometheus families of a model's residency (both engines' metrics export them)."""

    loaded: Gauge
    loads: Counter
    unloads: Counter


class Weights:
    def __init__(
        self,
        name: str,
        pinned: bool,
        keeps_kv: bool,
        model: Loadable,
        residency: Residency,
        limit_bytes: int | None,
        post: Callable[[Callable[[], None]], None],
        counts: LoadCounts,
    ) -> None:
        """`post`: runs a call on the engine's thread; `limit_bytes`: the memory limit told to MLX."""
        self.name = name
        self.pinned = pinned
        self.keeps_kv = keeps_kv  # False for an embedding model: no share of the hot KV budget
        self.loaded = False  # whether the weights are in now (the engine thread's to change)
        self._model = model
        self._residency = residency
        self._limit_bytes = limit_bytes
        self._post = post
        self._counts = counts
        self._failure: str | None = None  # a load that failed for good: the server must restart
        self._pending = 0  # requests taken by the engine and not yet running on its thread
        self._pending_lock = threading.Lock()
        self._last_used = time.monotonic()

    # -- any thread ---------------------------------------------------------------------

    def arriving(self) -> None:
        """A request is on its way to the engine thread: the model is not idle."""
        with self._pending_lock:
            self._pending += 1

    def arrived(self) -> None:
        """That request runs on the engine thread now (or was answered)."""
        with self._pending_lock:
            self._pending -= 1

    def unavailable(self) -> str | None:
        """Why the weights cannot be loaded, a failure no retry mends, or None: a load that
        failed (the server must restart once the files are replaced), or weights files found
        damaged while not loaded (checked again each time: a finished download mends it)."""
        if self._failure is not None or self.loaded:
            return self._failure
        return self._model.damage()

    def idle_since(self) -> float | None:
        """When it last took a request, if none is running or arriving (residency.Resident)."""
        if not self.loaded or self._pending or self._model.busy():
            return None
        return self._last_used

    def unload(self) -> Future:
        """Unload if still idle when the engine thread gets to it: a Future of whether it did."""
        done: Future = Future()

        def run() -> None:
            try:
                done.set_result(self._unload())
            except Exception as e:  # handed to the residency, which waits for it
                done.set_exception(e)

        self._post(run)
        return done

    def set_budgets(self, hot_bytes: int, working_bytes: int | None) -> None:
        """This model's share of the memory limit, applied on the engine thread."""
        self._post(lambda: self.loaded and self._model.set_budgets(hot_bytes, working_bytes))

    # -- the engine thread --------------------------------------------------------------

    def load_at_start(self) -> None:
        """A pinned model must fit; the first model, beside pinned ones that fill the limit,
        waits for a request instead (its load then says why it cannot)."""
        try:
            self._load()
        except NoRoom as e:
            if self.pinned:
                raise
            log.warning("%s is not loaded at start: %s", self.name, e)

    def take(self) -> Failed | None:
        """A request starts: the weights, loaded now if they are out (others wait meanwhile).
        None, or the request's failure: a 503 while other models' requests hold the memory,
        else `unavailable` (500 model_unavailable), for this request and every later one."""
        self.used()
        if self.loaded:
            return None
        if why := self.unavailable():
            return Failed(f"the model {self.name} cannot be loaded: {why}", 500, MODEL_UNAVAILABLE)
        t0 = time.perf_counter()
        log.info("loading %s for a request", self.name)
        try:
            self._load()
        except NoRoom as e:
            log.warning("could not load %s: %s", self.name, e)
            return Failed(f"the model {self.name} could not be loaded: {e}", 503, "model_not_loaded")
        except Exception as e:
            self._failure = str(e)
            log.exception("%s cannot be loaded; its requests fail until the server restarts", self.name)
            return Failed(f"the model {self.name} cannot be loaded: {e}", 500, MODEL_UNAVAILABLE)
        log.info("loaded %s on demand in %.1f s", self.name, time.perf_counter() - t0)
        return None

    def used(self) -> None:
        """It did work just now: its idle time starts again."""
        self._last_used = time.monotonic()

    def _load(self) -> None:
        """The weights, within the memory limit shared with the other served models (which
        may unload one of them first)."""
        self._residency.make_room(self, self._model.room_bytes())
        try:
            tell_mlx(self._limit_bytes)
            weights = self._model.load(*self._residency.share())
        except BaseException:
            self._residency.unloaded(self)
            raise
        self.loaded = True
        self._residency.loaded_as(self, weights)
        if self.keeps_kv:  # an embedding model has no hot KV nor running requests' caches to split for
            describe_split(self.name, self._limit_bytes, weights, *self._residency.share())
        self._counts.loaded.set(1)
        self._counts.loads.inc()

    def _unload(self) -> bool:
        if not self.loaded or self._pending or self._model.busy():
            return False
        self._model.unload()
        self.loaded = False
        self._counts.loaded.set(0)
        self._counts.unloads.inc()
        mx.clear_cache()
        give_back_memory()
        return True

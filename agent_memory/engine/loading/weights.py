"""Loading and unloading a model's weights, the engine's half that residency.py drives
(BatchEngine mixes it in; it runs on the engine thread but for `idle_since`, `unload` and
`set_budgets`, which only read or post to the inbox). The first load builds everything
(parts.build); an unload drops the weights and what computes with them after cooling the hot
KV out of memory (every block was written through to the warm tier), and keeps the store and
the warm tier, so the model's agents stay listed and deletable and return warm; a reload puts
the weights back."""

from __future__ import annotations

import logging
import time
from concurrent.futures import Future

import agent_memory.blas  # noqa: F401
import mlx.core as mx

from agent_memory.engine.loading.budget import describe_split, give_back_memory, tell_mlx, weights_bytes
from agent_memory.engine.core import EngineCore
from agent_memory.engine.loading.loader import weights_damage, weights_file_bytes
from agent_memory.engine.loading.parts import build, reload_weights, unload_weights
from agent_memory.engine.requests import MODEL_UNAVAILABLE, Failed, GenerationRequest, Sink
from agent_memory.engine.loading.residency import NoRoom

log = logging.getLogger(__name__)


class Loading:
    """Needs BatchEngine's config, name, pinned, residency, _described, _parts, _core,
    _weights_in, _load_failure, _arriving (and its lock), _last_used, _url, _metrics, _trace, _ids, _inbox,
    `call` and `announce`."""

    def _admit(self, seq_id: int, request: GenerationRequest, sink: Sink, submitted: float) -> None:
        with self._arriving_lock:
            self._arriving -= 1
        self._last_used = time.monotonic()
        if not self._weights_in and (failed := self._load_on_demand()):
            sink(failed)
            return
        self._core.admit(seq_id, request, sink, submitted)

    def unavailable(self) -> str | None:
        """Why the weights cannot be loaded, a failure no retry mends, or None (from any thread):
        a load that failed (the server must restart once the files are replaced), or weights
        files found damaged while not loaded (checked again each time: a finished download mends it)."""
        if self._load_failure is not None or self._weights_in or self._described is None:
            return self._load_failure
        return weights_damage(self._described.path)

    def _load_at_start(self) -> None:
        """A pinned model must fit; the first model, beside pinned ones that fill the limit,
        waits for a request instead (its load then says why it cannot)."""
        try:
            self._load()
        except NoRoom as e:
            if self.pinned:
                raise
            log.warning("%s is not loaded at start: %s", self.name, e)

    def _load_on_demand(self) -> Failed | None:
        """Load for a request that asks for this model (others wait in the inbox meanwhile):
        None, or the request's failure: a 503 while other models' requests hold the memory,
        else `unavailable` (500 model_unavailable), for this request and every later one."""
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
            self._load_failure = str(e)
            log.exception("%s cannot be loaded; its requests fail until the server restarts", self.name)
            return Failed(f"the model {self.name} cannot be loaded: {e}", 500, MODEL_UNAVAILABLE)
        log.info("loaded %s on demand in %.1f s", self.name, time.perf_counter() - t0)
        return None

    def _load(self) -> None:
        """The weights, within the memory limit shared with the other served models (which
        may unload one of them first): built whole the first time, the weights alone after."""
        files = [self._described.path, self.config.draft_path]
        self.residency.make_room(self, sum(weights_file_bytes(f) for f in files if f is not None))
        try:
            tell_mlx(self.config.memory_limit_bytes)
            hot, working = self.residency.share()
            if self._parts is None:
                self._build(hot, working)
            else:
                reload_weights(self._parts, self.config, self._described, working)
                self._parts.store.set_hot_budget(hot)
        except BaseException:
            self.residency.unloaded(self)
            raise
        self._weights_in = True
        weights = sum(weights_bytes(m) for m in (self._parts.loaded.model, self._parts.draft) if m is not None)
        self.residency.loaded_as(self, weights)
        describe_split(self.name, self.config.memory_limit_bytes, weights, *self.residency.share())
        self._metrics.loaded.set(1)
        self._metrics.loads.inc()
        if self._url is not None:
            self.announce(self._url)

    def _build(self, hot: int, working: int | None) -> None:
        parts = self._parts = build(self.config, self._described, self._trace, hot, working)
        if parts.warm is not None:
            parts.warm.on_written = self._trace.job
        self._core = EngineCore(parts, self.config, self._metrics, self._trace, self._ids, self._inbox.put)
        self._metrics.watch(parts.store, self._core.count, warm_on=parts.warm is not None)

    def idle_since(self) -> float | None:
        """When it last took a request, if none is running or arriving (residency.Resident)."""
        if not self._weights_in or self._arriving or (self._core is not None and self._core.seqs):
            return None
        return self._last_used

    def unload(self) -> Future:
        """Unload the weights if still idle when the engine thread gets to it: its hot KV cools
        first (written through to the warm tier as it was made), so its agents return warm."""
        return self.call(self._unload)

    def _unload(self) -> bool:
        if not self._weights_in or self._arriving or self._core.seqs:
            return False
        self._parts.store.set_hot_budget(0)
        unload_weights(self._parts)
        self._weights_in = False
        self._metrics.loaded.set(0)
        self._metrics.unloads.inc()
        mx.clear_cache()
        give_back_memory()
        return True

    def set_budgets(self, hot_bytes: int, working_bytes: int | None) -> None:
        """This model's share of the memory limit, applied on the engine thread."""

        def apply() -> None:
            if self._weights_in:
                self._parts.store.set_hot_budget(hot_bytes)
                self._parts.working_budget = working_bytes

        self._inbox.put(apply)

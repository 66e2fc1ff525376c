"""BatchEngine: one served model's engine, as the API sees it (protocol.EngineClient).

It owns the engine thread, the only one that touches MLX: work arrives on an inbox (submit,
cancel, end an agent, any call) and between two steps the thread drains it, so a new request
joins at once; the steps themselves are EngineCore's (core.py). Everything here may be called
from any thread; reads of the store take its lock.
"""

from __future__ import annotations

import itertools
import logging
import queue
import threading
import time
from collections.abc import Callable
from concurrent.futures import Future
from typing import Any

import agent_memory.blas  # noqa: F401
import mlx.core as mx
from prometheus_client import CollectorRegistry

from agent_memory import blas
from agent_memory.agent_key import AgentKey
from agent_memory.engine.budget import give_back_memory
from agent_memory.engine.config import EngineConfig
from agent_memory.engine.core import EngineCore
from agent_memory.engine.loader import UnsupportedModelError
from agent_memory.engine.metrics import Metrics
from agent_memory.engine.parts import Parts, build
from agent_memory.engine.protocol import AgentInfo, EngineClient, Health, ModelFacts
from agent_memory.engine.requests import GenerationRequest, Sink
from agent_memory.engine.trace import NO_TRACE, Trace
from agent_memory.memory.warm.health import warm_health

log = logging.getLogger(__name__)


class BatchEngine(EngineClient):
    def __init__(self, config: EngineConfig) -> None:
        self.config = config
        self._metrics = Metrics()
        self._trace = Trace(config.trace_path) if config.trace_path else NO_TRACE
        self._loaded = threading.Event()
        self._load_error: str | None = None
        self._parts: Parts | None = None
        self._facts: ModelFacts | None = None
        self._core: EngineCore | None = None
        self._inbox: queue.SimpleQueue[Callable[[], None] | None] = queue.SimpleQueue()
        self._ids = itertools.count()
        self._thread = threading.Thread(target=self._run, name="engine", daemon=True)

    # -- lifetime -----------------------------------------------------------------------

    def start(self) -> None:
        self._thread.start()

    def wait_loaded(self) -> str | None:
        self._loaded.wait()
        return self._load_error

    def announce(self, url: str) -> None:
        warm = self._parts.warm if self._parts is not None else None
        if warm is not None and warm.folder is not None:  # a shared store records no server
            try:
                warm.folder.write_server_json(url)
            except OSError as e:
                where = warm.folder.server_json
                log.warning("could not write %s (%s): `agent-memory cache` will not know this server", where, e)

    def stop(self) -> None:
        if self._thread.is_alive():
            self._inbox.put(None)
            self._thread.join()
        warm = self._parts.warm if self._parts is not None else None
        if warm is not None and warm.folder is not None:  # only now: the writer has flushed
            try:
                warm.folder.remove_server_json()
            except OSError as e:
                log.warning("could not remove %s: %s", warm.folder.server_json, e)

    # -- the model ----------------------------------------------------------------------

    @property
    def model(self) -> ModelFacts | None:
        return self._facts

    @property
    def max_batch(self) -> int:
        return self.config.max_batch

    # -- requests -----------------------------------------------------------------------

    def submit(self, request: GenerationRequest, sink: Sink) -> int:
        seq_id = next(self._ids)
        submitted = time.perf_counter()
        self._inbox.put(lambda: self._core.admit(seq_id, request, sink, submitted))
        return seq_id

    def cancel(self, request_id: int) -> None:
        self._inbox.put(lambda: self._core.cancel(request_id))

    def call(self, fn: Callable[[], Any]) -> Future:
        """Run fn on the engine thread (anything that frees or makes MLX arrays)."""
        future: Future = Future()

        def run() -> None:
            try:
                future.set_result(fn())
            except Exception as e:  # handed to the caller
                future.set_exception(e)

        self._inbox.put(run)
        return future

    # -- agents -------------------------------------------------------------------------

    def agents(self, tenant: str | None) -> list[AgentInfo]:
        return self._parts.store.all_agents(tenant)

    def agent(self, key: AgentKey) -> AgentInfo | None:
        return self._parts.store.agent_info(key)

    def totals(self) -> dict[str, int]:
        return self._parts.store.totals()

    def end_agent(self, key: AgentKey) -> Future:
        """Its running requests finish for their clients but no longer join its memory: a
        delete wins over a turn in flight. With a shared warm tier, the tier's answer counts."""
        ended: Future = Future()

        def settle(step: Future) -> None:
            if step.exception() is not None:
                ended.set_exception(step.exception())
            elif isinstance(step.result(), Future):  # the shared tier is asked: wait for its answer
                step.result().add_done_callback(settle)
            else:
                ended.set_result(step.result())

        self.call(lambda: self._core.end_agent(key)).add_done_callback(settle)
        return ended

    # -- the operator's view ------------------------------------------------------------

    def health(self) -> Health:
        if not self._loaded.is_set():
            return Health("loading")
        if self._load_error:
            return Health("error", self._load_error)
        if not self._thread.is_alive():
            return Health("error", "the engine thread has stopped")
        p = self._parts
        if p.warm is not None and not p.warm.alive:
            return Health("error", "the warm tier's writer thread has stopped")
        kv = {"hot": p.precisions.hot.tag, "working": p.precisions.working.tag, "disk": p.precisions.disk.tag}
        return Health("ok", kv=kv, warm_tier=warm_health(p.warm, p.warm_error, p.store.disk_budget_bytes))

    def summary(self) -> str:
        p = self._parts
        loaded, precisions, store = p.loaded, p.precisions, p.store
        hot = precisions.hot.tag
        kv = f"KV exact while hot, {hot} once cooled" if precisions.exact_while_hot else f"KV {hot}"
        counts = store.counts()
        held = f"{counts['agents']} agents, {counts['stored_responses']} stored responses"
        warm = (
            f"warm tier {p.warm.location} ({held}, {store.pool.disk_bytes >> 20} MiB "
            f"of {store.disk_budget_bytes >> 20} MiB at {precisions.disk.tag})"
            if p.warm is not None
            else f"no warm tier ({p.warm_error or 'disk budget 0'})"
        )
        return (
            f"model {loaded.name} ({loaded.num_layers} layers, context {loaded.context_length}); {kv}; "
            f"hot budget {store.hot_budget_bytes >> 20} MiB; {warm}; batch up to {self.config.max_batch}; "
            f"BLAS {'OpenBLAS' if blas.OPENBLAS_LOADED else 'MLX reference (slow on CPU)'}"
        )

    @property
    def metrics(self) -> CollectorRegistry:
        return self._metrics.registry

    # -- the engine thread --------------------------------------------------------------

    def _run(self) -> None:
        try:
            self._load()
        except UnsupportedModelError as e:  # said in one line by whoever waits for the load
            self._load_error = str(e)
            self._loaded.set()
            return
        except Exception as e:
            log.exception("could not load %s", self.config.model_path)
            self._load_error = str(e)
            self._loaded.set()
            return
        self._loaded.set()
        core = self._core
        while self._drain(block=not core.busy()):
            core.step()
        core.shutdown()
        if self._parts.warm is not None:
            log.info("flushing the warm tier")
            self._parts.warm.close()
        # MLX's per-thread streams must be cleared by the thread that used them, or the
        # process can abort at exit (ml-explore/mlx#4327).
        mx.synchronize()
        mx.clear_streams()

    def _load(self) -> None:
        parts = self._parts = build(self.config, self._trace)
        if parts.warm is not None:
            parts.warm.on_written = self._trace.job
        self._core = EngineCore(parts, self.config, self._metrics, self._trace, self._ids, self._inbox.put)
        self._metrics.watch(parts.store, self._core.count, warm_on=parts.warm is not None)
        loaded = parts.loaded
        self._facts = ModelFacts(
            name=loaded.name,
            ids=(loaded.name, *self.config.model_aliases),
            tokenizer=loaded.tokenizer,
            context_length=loaded.context_length,
            vocab_size=loaded.vocab_size,
            max_token_chars=loaded.max_token_chars,
            reply_format=loaded.reply_format,
            sampling_defaults=loaded.sampling_defaults,
        )

    def _drain(self, block: bool) -> bool:
        """Run queued calls; False once stop was asked. Before waiting with no sequence left,
        the memory of a burst goes back to the system (not while a sequence only waits for its
        disk reads: each read wakes the loop)."""
        if block and not self._core.seqs:
            give_back_memory()
        try:
            item = self._inbox.get(block=block)
        except queue.Empty:
            return True
        while True:
            if item is None:
                return False
            try:
                item()
            except Exception:  # one bad piece of work must not stop the engine
                log.exception("engine call failed")
            try:
                item = self._inbox.get_nowait()
            except queue.Empty:
                return True

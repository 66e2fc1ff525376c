"""BatchEngine: one served model's engine, as the API sees it (protocol.EngineClient).

It owns the engine thread, the only one that touches MLX: work arrives on an inbox (submit,
cancel, end an agent, any call) and between two steps the thread drains it, so a new request
joins at once; the steps themselves are EngineCore's (core.py). Everything here may be called
from any thread; reads of the store take its lock.

The thread first reads the model's tokenizer and layers (what the API needs), then loads the
weights at start or when a request first asks for the model; with other models served it may
later unload them when idle, keeping the store and warm tier, and load them again for the next
request: its `Weights` (loading/weights.py) does that, over its `ChatModel` (chat_model.py),
which holds what a load built (the Parts, the EngineCore).
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

from agent_memory.agent_key import HEAD, AgentKey
from agent_memory.engine.chat_model import ChatModel
from agent_memory.engine.config import EngineConfig
from agent_memory.engine.distributed.faults import GroupFault
from agent_memory.engine.loading.budget import give_back_memory
from agent_memory.engine.loading.loader import UnsupportedModelError
from agent_memory.engine.loading.residency import NoRoom, Residency
from agent_memory.engine.loading.weights import Weights
from agent_memory.engine.observability.metrics import Metrics
from agent_memory.engine.observability.trace import NO_TRACE, Trace
from agent_memory.engine.protocol import AgentInfo, EngineClient, Health, ModelFacts, PinResult
from agent_memory.engine.report import parts_health, summary
from agent_memory.engine.requests import Failed, GenerationRequest, Sink

log = logging.getLogger(__name__)


class BatchEngine(EngineClient):
    def __init__(
        self, config: EngineConfig, residency: Residency | None = None, on_group_lost: Callable[[], None] | None = None
    ) -> None:
        """`residency`: the memory limit this engine shares with other served models' engines
        (None: its own, for a server of one model). `on_group_lost`: rank 0 of a split model
        (config.split): the server stops and exits with 75 once a rank is lost (faults.py)."""
        self.config = config
        self.name = config.served_as or config.model_name or config.model_path.name
        self._metrics = Metrics()
        self._trace = Trace(config.trace_path) if config.trace_path else NO_TRACE
        self._loaded = threading.Event()
        self._load_error: str | None = None  # why the start failed
        self._facts: ModelFacts | None = None
        self._inbox: queue.SimpleQueue[Callable[[], None] | None] = queue.SimpleQueue()
        self._ids = itertools.count()
        self._model = ChatModel(config, self._metrics, self._trace, self._ids, self._inbox.put)
        self._weights = Weights(
            self.name,
            config.pinned,
            True,  # keeps KV: its share of the hot budget
            self._model,
            residency or Residency(config.memory_limit_bytes, config.hot_budget_bytes),
            config.memory_limit_bytes,
            self._inbox.put,
            self._metrics,
        )
        self._thread = threading.Thread(target=self._run, name="engine", daemon=True)
        self._fault: GroupFault | None = None  # split over processes: what it does when a rank is lost
        self._arriving: dict[int, Sink] = {}  # split: submitted, not admitted yet (told too if the engine is stuck)
        if config.split is not None:
            self._fault = GroupFault(on_group_lost or (lambda: None))
            config.split.group.watchdog.before_exit = self._stuck

    # -- lifetime -----------------------------------------------------------------------

    def start(self) -> None:
        self._thread.start()

    def wait_loaded(self) -> str | None:
        self._loaded.wait()
        return self._load_error

    def announce(self, url: str) -> None:
        self._model.announce(url)  # a model loaded on demand announces itself when it loads

    def stop(self) -> None:
        if self._thread.is_alive():
            self._inbox.put(None)
            self._thread.join()
        self._model.remove_server_json()

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
        self._weights.arriving()
        if self._fault is not None:
            self._arriving[seq_id] = sink
        self._inbox.put(lambda: self._admit(seq_id, request, sink, submitted))
        return seq_id

    def _admit(self, seq_id: int, request: GenerationRequest, sink: Sink, submitted: float) -> None:
        self._weights.arrived()
        self._arriving.pop(seq_id, None)
        if failed := self._refusal() or self._weights.take():
            sink(failed)
            return
        self._model.core.admit(seq_id, request, sink, submitted)

    def cancel(self, request_id: int) -> None:
        self._inbox.put(lambda: self._model.core is not None and self._model.core.cancel(request_id))

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
        return self._model.parts.store.all_agents(tenant) if self._model.parts is not None else []

    def agent(self, key: AgentKey) -> AgentInfo | None:
        return self._model.parts.store.agent_info(key) if self._model.parts is not None else None

    def totals(self, tenant: str | None = None) -> dict[str, int]:
        return self._model.parts.store.totals(tenant) if self._model.parts is not None else {}

    def heads(self, tenant: str | None) -> list[AgentInfo]:
        return self._model.parts.store.all_agents(tenant, (HEAD,)) if self._model.parts is not None else []

    def pin(self, key: AgentKey, on: bool) -> PinResult:
        return self._model.parts.store.pin(key, on) if self._model.parts is not None else PinResult(False, False)

    def end_agent(self, key: AgentKey) -> Future:
        """Its running requests finish for their clients but no longer join its memory: a
        delete wins over a turn in flight. With a shared warm tier, the tier's answer counts."""
        ended: Future = Future()
        if self._model.parts is None:  # never loaded here: its memory is not open (the `cache` commands reach it)
            ended.set_result(False)
            return ended

        def settle(step: Future) -> None:
            if step.exception() is not None:
                ended.set_exception(step.exception())
            elif isinstance(step.result(), Future):  # the shared tier is asked: wait for its answer
                step.result().add_done_callback(settle)
            else:
                ended.set_result(step.result())

        self.call(lambda: self._model.core.end_agent(key)).add_done_callback(settle)
        return ended

    # -- the operator's view ------------------------------------------------------------

    def health(self) -> Health:
        if not self._loaded.is_set():
            return Health("loading")
        if self._load_error:
            return Health("error", self._load_error)
        if (refusal := self._refusal()) is not None:
            return Health("error", refusal.message, refusal.code)
        if not self._thread.is_alive():
            return Health("error", "the engine thread has stopped")
        if (why := self._weights.unavailable()) is not None:
            return Health("unavailable", why, loaded=False)
        if self._model.parts is None:
            return Health("ok", loaded=False)
        return parts_health(self._model.parts, self._weights.loaded)

    def summary(self) -> str:
        return summary(self._model.parts, self._facts, self.config.max_batch)

    @property
    def metrics(self) -> CollectorRegistry:
        return self._metrics.registry

    # -- the engine thread --------------------------------------------------------------

    def _run(self) -> None:
        try:
            described = self._model.describe()
            if self.config.load_at_start:
                self._weights.load_at_start()
        except (UnsupportedModelError, NoRoom) as e:  # said in one line by whoever waits for the load
            self._load_error = str(e)
            self._loaded.set()
            return
        except Exception as e:
            log.exception("could not load %s", self.config.model_path)
            self._load_error = str(e)
            self._loaded.set()
            return
        self._facts = described.facts(self.config.model_aliases, self.config.default_max_tokens)
        self._loaded.set()
        try:
            while self._drain(block=not self._busy()):
                if self._busy():  # the inbox may have unloaded the weights
                    with self._model.core.recorder.watching():  # distributed: no step waits for ever
                        self._model.core.step()
        except Exception as e:  # split over processes, a step or exchange failed: the group is lost
            if self._fault is None:  # one process: a step fails only its own requests (EngineCore._guard)
                raise
            self._fault.failed(str(e), self._model.core, self._model.parts.warm if self._model.parts else None)
            while (item := self._inbox.get()) is not None:  # until the server stops: requests refused
                item()
            return  # nothing more of MLX: a collective of the lost group may still be pending
        if self._model.core is not None:
            self._model.core.shutdown()
            self._model.core.recorder.stop()  # distributed: the other ranks stop after it
        if self._model.parts is not None and self._model.parts.warm is not None:
            log.info("flushing the warm tier")
            self._model.parts.warm.close()
        # MLX's per-thread streams must be cleared by the thread that used them, or the
        # process can abort at exit (ml-explore/mlx#4327).
        mx.synchronize()
        mx.clear_streams()

    def _stuck(self, why: str) -> None:
        """The watchdog's thread: the engine thread waits in a collective for good (faults.py)."""
        self._fault.stuck(why, self._model.core, list(self._arriving.values()))

    def _refusal(self) -> Failed | None:
        return self._fault.refusal if self._fault is not None else None

    def _busy(self) -> bool:
        return self._weights.loaded and self._model.core.busy()

    def _drain(self, block: bool) -> bool:
        """Run queued calls; False once stop was asked. Before waiting with no sequence left,
        the memory of a burst goes back to the system (not while a sequence only waits for its
        disk reads: each read wakes the loop)."""
        if block and not self._model.busy():
            give_back_memory()
        core = self._model.core  # distributed: rank 0 idle sends a heartbeat every heartbeat_s
        try:
            item = self._inbox.get(block=block, timeout=core.recorder.heartbeat_s if core is not None else None)
        except queue.Empty:
            if block:
                core.recorder.heartbeat()
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

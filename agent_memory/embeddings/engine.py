"""EmbeddingEngine: an embedding model served beside chat models (`--model NAME=FOLDER`).

Like BatchEngine it owns one thread, the only one that touches its MLX arrays, and takes work
from an inbox; it keeps no KV and remembers no agents. Each turn of its loop takes every
request waiting and embeds their inputs together, sorted by length into forward passes of at
most BATCH_TOKENS padded tokens. Its weights are in the residency's count: loaded at start or on
the first request, unloaded when idle or to make room, by the same `Weights` (engine/loading/
weights.py) as a chat model's, over an `Embedder`.
"""

from __future__ import annotations

import logging
import queue
import threading
import time
from collections.abc import Callable
from concurrent.futures import Future
from dataclasses import dataclass
from pathlib import Path

import agent_memory.blas  # noqa: F401
import mlx.core as mx
import numpy as np
from mlx_lm.utils import load_tokenizer
from prometheus_client import CollectorRegistry

from agent_memory.agent_key import AgentKey
from agent_memory.models.embedding_layout import EmbeddingLayout, NotEmbeddingModel, embedding_layout
from agent_memory.embeddings.metrics import EmbeddingMetrics
from agent_memory.embeddings.model import PASS_INPUTS, EmbeddingModel, batches
from agent_memory.engine.config import EngineConfig
from agent_memory.engine.loading.budget import give_back_memory, weights_bytes
from agent_memory.engine.loading.weights_files import weights_damage, weights_file_bytes
from agent_memory.engine.loading.residency import NoRoom, Residency
from agent_memory.engine.loading.weights import Weights
from agent_memory.engine.protocol import AgentInfo, EngineClient, Health, ModelFacts, PinResult
from agent_memory.engine.requests import Failed, GenerationRequest, Sink

log = logging.getLogger(__name__)


@dataclass
class Job:
    """One request's inputs (token ids each) and where its vectors go."""

    inputs: list[list[int]]
    result: Future  # of an np.ndarray (one row per input) or a Failed
    submitted: float  # time.perf_counter() when it came


class Embedder:
    """The embedding model as loading makes it (weights.Loadable): its layout read at start,
    its `EmbeddingModel` while loaded (the embedding thread's to change)."""

    def __init__(self, name: str, path: Path) -> None:
        self.name = name
        self.path = path
        self.layout: EmbeddingLayout | None = None  # once the thread has read it
        self.model: EmbeddingModel | None = None

    def damage(self) -> str | None:
        return weights_damage(self.path)

    def room_bytes(self) -> int:
        return weights_file_bytes(self.path) + self._dense_bytes()

    def load(self, hot_bytes: int, working_bytes: int | None) -> int:
        """No share of the limit to apply: its forward passes are bounded by BATCH_TOKENS."""
        self.model = EmbeddingModel.load(self.path, self.layout)
        log.info("loaded embedding model %s (%d dimensions)", self.name, self.layout.dimensions)
        return weights_bytes(self.model.backbone) + self._dense_bytes()

    def unload(self) -> None:
        self.model = None

    def busy(self) -> bool:
        """Its jobs count as arriving until answered (Weights.arrived)."""
        return False

    def set_budgets(self, hot_bytes: int, working_bytes: int | None) -> None:
        """No KV kept: its forward passes are bounded by BATCH_TOKENS instead."""

    def _dense_bytes(self) -> int:
        return sum(weights_file_bytes(folder) for folder in self.layout.dense)


class EmbeddingEngine(EngineClient):
    def __init__(self, config: EngineConfig, residency: Residency) -> None:
        self.config = config
        self.name = config.served_as or config.model_name or config.model_path.name
        self._metrics = EmbeddingMetrics()
        self._facts: ModelFacts | None = None
        self._loaded = threading.Event()
        self._load_error: str | None = None
        self._inbox: queue.SimpleQueue[Job | Callable[[], None] | None] = queue.SimpleQueue()
        self._embedder = Embedder(self.name, config.model_path)
        self._weights = Weights(
            self.name,
            config.pinned,
            False,  # the residency shares the hot KV budget among the chat models alone
            self._embedder,
            residency,
            config.memory_limit_bytes,
            self._inbox.put,
            self._metrics,
        )
        self._thread = threading.Thread(target=self._run, name="embedding", daemon=True)

    # -- lifetime -----------------------------------------------------------------------

    def start(self) -> None:
        self._thread.start()

    def wait_loaded(self) -> str | None:
        self._loaded.wait()
        return self._load_error

    def announce(self, url: str) -> None:
        """No warm folder: nothing of this model is kept for the `cache` commands."""

    def stop(self) -> None:
        if self._thread.is_alive():
            self._inbox.put(None)
            self._thread.join()

    @property
    def model(self) -> ModelFacts | None:
        return self._facts

    @property
    def max_batch(self) -> int:
        return PASS_INPUTS

    # -- requests -----------------------------------------------------------------------

    def embed(self, inputs: list[list[int]]) -> Future:
        """The vectors of `inputs` (token ids each, none empty): a Future of an np.ndarray, one
        float32 row per input, or of a Failed when the model cannot be loaded."""
        job = Job(inputs, Future(), time.perf_counter())
        self._weights.arriving()
        job.result.add_done_callback(lambda _: self._weights.arrived())
        self._inbox.put(job)
        return job.result

    def submit(self, request: GenerationRequest, sink: Sink) -> int:
        """An embedding model writes no text (the routes refuse such requests before they come here)."""
        sink(Failed(f"the model {self.name} is an embedding model: it serves /v1/embeddings only", 400))
        return -1

    def cancel(self, request_id: int) -> None:
        """A job is one forward pass, never cut short: a client that leaves just gets no answer."""

    # -- agents: none -------------------------------------------------------------------

    def agents(self, tenant: str | None) -> list[AgentInfo]:
        return []

    def agent(self, key: AgentKey) -> AgentInfo | None:
        return None

    def totals(self, tenant: str | None = None) -> dict[str, int]:
        return {}

    def end_agent(self, key: AgentKey) -> Future:
        ended: Future = Future()
        ended.set_result(False)
        return ended

    def heads(self, tenant: str | None) -> list[AgentInfo]:
        return []

    def pin(self, key: AgentKey, on: bool) -> PinResult:
        return PinResult(False, False)

    # -- the operator's view ------------------------------------------------------------

    def health(self) -> Health:
        if not self._loaded.is_set():
            return Health("loading")
        if self._load_error:
            return Health("error", self._load_error)
        if not self._thread.is_alive():
            return Health("error", "the embedding thread has stopped")
        if why := self._weights.unavailable():
            return Health("unavailable", why, loaded=False)
        return Health("ok", loaded=self._weights.loaded)

    def summary(self) -> str:
        layout = self._facts.embedding
        shape = f"{layout.dimensions} dimensions, {layout.pooling} pooling, context {layout.context_length}"
        when = "loaded" if self._weights.loaded else "loads on its first request"
        return f"embedding model {self.name} ({shape}): {when}"

    @property
    def metrics(self) -> CollectorRegistry:
        return self._metrics.registry

    # -- the thread ---------------------------------------------------------------------

    def _run(self) -> None:
        path = self.config.model_path
        try:
            if why := weights_damage(path):
                raise NotEmbeddingModel(why)
            layout = self._embedder.layout = embedding_layout(path)
            tokenizer = load_tokenizer(path)
            self._facts = ModelFacts(
                name=self.config.model_name or path.name,
                ids=tuple(dict.fromkeys((self.config.model_name or path.name, *self.config.model_aliases))),
                tokenizer=tokenizer,
                context_length=layout.context_length,
                vocab_size=len(tokenizer),
                max_token_chars=max(len(t) for t in tokenizer.get_vocab()),
                reply_format=None,
                embedding=layout,
            )
            if self.config.load_at_start:
                self._weights.load_at_start()
        except (NotEmbeddingModel, NoRoom) as e:
            self._facts, self._load_error = None, f"{self.name}: {e}"
        except Exception as e:
            log.exception("could not load %s", path)
            self._facts, self._load_error = None, f"{self.name}: {e}"
        self._loaded.set()
        if self._load_error:
            return
        while (item := self._inbox.get()) is not None:
            if isinstance(item, Job):
                self._answer([item, *self._waiting_jobs()])
            else:
                item()
            if self._inbox.empty():
                give_back_memory()
        mx.synchronize()
        mx.clear_streams()  # by the thread that used them (ml-explore/mlx#4327)

    def _waiting_jobs(self) -> list[Job]:
        """Every job queued behind the first, to embed together (other work is run first)."""
        jobs = []
        while True:
            try:
                item = self._inbox.get_nowait()
            except queue.Empty:
                return jobs
            if isinstance(item, Job):
                jobs.append(item)
            elif item is None:
                self._inbox.put(None)  # stop once these are answered
                return jobs
            else:
                item()

    def _answer(self, jobs: list[Job]) -> None:
        if failed := self._weights.take():
            for job in jobs:
                job.result.set_result(failed)
                self._metrics.failed.inc()
            return
        inputs = [tokens for job in jobs for tokens in job.inputs]
        vectors = np.empty((len(inputs), self._facts.embedding.dimensions), np.float32)
        try:
            for batch in batches([len(tokens) for tokens in inputs]):
                vectors[batch] = self._embedder.model.embed([inputs[i] for i in batch])
                self._metrics.batch_size.observe(len(batch))
        except Exception as e:  # one bad pass must not stop the thread: its requests fail, the next ones run
            log.exception("embedding %d inputs failed", len(inputs))
            for job in jobs:
                job.result.set_result(Failed(f"the model {self.name} failed: {e}"))
                self._metrics.failed.inc()
            return
        at = 0
        for job in jobs:
            job.result.set_result(vectors[at : at + len(job.inputs)])
            at += len(job.inputs)
            self._metrics.answered(len(job.inputs), sum(map(len, job.inputs)), time.perf_counter() - job.submitted)
        self._weights.used()

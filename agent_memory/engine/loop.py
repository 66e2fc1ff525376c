"""BatchEngine: the one thread that touches MLX.

Work arrives on an inbox (submit, cancel, end an agent, any call); between two steps the loop
drains it, so a new request joins at once. Each step is schedule → run → postprocess: every
decoding sequence advances one token together (decode_batch.py), then one waiting sequence
prefills a chunk from its plan (prefill.py), the scheduler (scheduler.py) deciding which and
how much. A sequence ends through one path, `_end`, that releases, commits and reports once.
"""

from __future__ import annotations

import itertools
import logging
import queue
import threading
import time
from collections.abc import Callable
from concurrent.futures import Future
from dataclasses import replace
from typing import Any

import agent_memory.blas  # noqa: F401
import mlx.core as mx

from agent_memory.agent_key import AgentKey
from agent_memory.engine.budget import give_back_memory
from agent_memory.engine.commit import Committer
from agent_memory.engine.config import EngineConfig
from agent_memory.engine.decode_batch import DecodeBatch
from agent_memory.engine.loader import LoadedModel
from agent_memory.engine.parts import build
from agent_memory.engine.prefill import Prefiller
from agent_memory.engine.requests import Failed, Finished, GenerationRequest, SamplingParams, Sink
from agent_memory.engine.scheduler import Scheduler
from agent_memory.engine.sequence import Sequence, Status, new_sequence
from agent_memory.memory.index.blocks import Tier
from agent_memory.memory.index.store import AgentCacheStore
from agent_memory.memory.index.store_records import Segment
from agent_memory.memory.warm.records import BLOCK_TOKENS
from agent_memory.memory.warm.tier import WarmTier
from agent_memory.metrics import Metrics

log = logging.getLogger(__name__)


class BatchEngine:
    def __init__(self, config: EngineConfig) -> None:
        self.config = config
        self.precisions = config.precisions
        self.scheduler = Scheduler(max_batch=config.max_batch)
        self.ready = threading.Event()
        self.load_error: str | None = None
        self.warm_error: str | None = None  # why there is no warm tier, when one was asked for
        self.loaded: LoadedModel | None = None
        self.store: AgentCacheStore | None = None
        self.warm: WarmTier | None = None
        self.metrics = Metrics()
        self._inbox: queue.SimpleQueue[Callable[[], None] | None] = queue.SimpleQueue()
        self._ids = itertools.count()
        self._thread = threading.Thread(target=self._run, name="engine", daemon=True)
        self._seqs: dict[int, Sequence] = {}  # in arrival order
        self._batch: DecodeBatch | None = None
        self._prefiller: Prefiller | None = None
        self._committer: Committer | None = None
        self._working_budget: int | None = None
        self._bytes_per_token = 0

    # -- called from other threads ------------------------------------------------------

    def start(self) -> None:
        self._thread.start()

    def submit(self, request: GenerationRequest, sink: Sink) -> int:
        seq_id = next(self._ids)
        submitted = time.perf_counter()
        self._inbox.put(lambda: self._admit(seq_id, request, sink, submitted))
        return seq_id

    def cancel(self, seq_id: int) -> None:
        self._inbox.put(lambda: self._cancel(seq_id))

    def end_agent(self, agent: AgentKey) -> Future:
        """Forget an agent (future of whether it existed, here or, with a shared warm tier,
        there). Its running requests finish for their clients but no longer join its memory:
        a delete wins over a turn in flight."""
        ended: Future = Future()

        def settle(step: Future) -> None:
            if step.exception() is not None:
                ended.set_exception(step.exception())
            elif isinstance(step.result(), Future):  # the shared tier is asked: wait for its answer
                step.result().add_done_callback(settle)
            else:
                ended.set_result(step.result())

        self.call(lambda: self._end_agent(agent)).add_done_callback(settle)
        return ended

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

    def stop(self) -> None:
        self._inbox.put(None)
        self._thread.join()

    def count(self, state: str) -> int:
        """Sequences in a state: waiting, prefilling or decoding (read from any thread)."""
        return sum(1 for s in list(self._seqs.values()) if s.status.value == state)

    @property
    def decoding(self) -> int:
        return len(self._batch) if self._batch is not None else 0

    def problem(self) -> str | None:
        """Why the server cannot serve, once loaded: a thread that has died."""
        if not self._thread.is_alive():
            return "the engine thread has stopped"
        if self.warm is not None and not self.warm.alive:
            return "the warm tier's writer thread has stopped"
        return None

    # -- the engine thread --------------------------------------------------------------

    def _run(self) -> None:
        try:
            self._load()
        except Exception as e:
            log.exception("could not load %s", self.config.model_path)
            self.load_error = str(e)
            self.ready.set()
            return
        self.ready.set()
        while self._drain(block=not (self.decoding or self._next_prefill())):
            if self.decoding:
                self._guard(self._decode, [self._seqs[i] for i in self._batch.seq_ids])
            seq = self._next_prefill()
            if seq is not None and self.scheduler.may_prefill(self.decoding) and self._fits(seq):
                self._guard(lambda: self._prefill(seq), [seq])
        self._shutdown()

    def _load(self) -> None:
        parts = build(self.config)
        self.loaded, self.store, self.warm, self.warm_error = parts.loaded, parts.store, parts.warm, parts.warm_error
        self._batch, self._prefiller, self._committer = parts.batch, parts.prefiller, parts.committer
        self._working_budget, self._bytes_per_token = parts.working_budget, parts.bytes_per_token
        self.metrics.watch(self)

    def _fits(self, seq: Sequence) -> bool:
        """Whether the sequence's working cache fits the memory left for running requests."""
        return self.scheduler.fits(self._seqs.values(), seq, self._bytes_per_token, self._working_budget)

    def _drain(self, block: bool) -> bool:
        """Run queued calls; False once stop was asked. Before waiting with no sequence left,
        the memory of a burst goes back to the system (not while a sequence only waits for its
        disk reads: each read wakes the loop)."""
        if block and not self._seqs:
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

    def _guard(self, work: Callable[[], None], seqs: list[Sequence]) -> None:
        """Run one unit of MLX work; if it fails, fail the sequences it touched, not the server."""
        try:
            work()
        except Exception as e:
            log.exception("engine step failed for requests %s", [s.request.request_id for s in seqs])
            if any(s.status is Status.DECODING for s in seqs):
                self._batch.reset()
            for seq in seqs:
                self._end(seq, "error", error=Failed(f"generation failed: {e}"))

    def _admit(self, seq_id: int, request: GenerationRequest, sink: Sink, submitted: float) -> None:
        try:
            seq = self._new_sequence(seq_id, request, sink, submitted)
        except Exception as e:
            log.exception("could not admit request %s", request.request_id)
            sink(Failed(f"the request could not be started: {e}"))
            return
        self.metrics.prompt_tokens.inc(len(request.prompt))
        self._seqs[seq_id] = seq
        if seq.discovery is not None:  # the shared warm tier's answer: adopt it, then plan the request
            seq.discovery.add_done_callback(lambda _: self._inbox.put(self.store.sync.apply))

    def _new_sequence(
        self, seq_id: int, request: GenerationRequest, sink: Sink, submitted: float, prefill_only: bool = False
    ) -> Sequence:
        return new_sequence(seq_id, request, sink, submitted, self.loaded, self.precisions.working, self.store, prefill_only)

    def _next_prefill(self) -> Sequence | None:
        """The sequence to prefill next: one already planned whose disk reads are done, else
        the first in the scheduler's order that is ready once planned."""
        seq = self.scheduler.ready_to_prefill(self._seqs.values())
        if seq is not None:
            return seq
        for seq in self.scheduler.planning_order(self._seqs.values(), time.perf_counter()):
            self._plan(seq)
            if seq.ready():
                return seq
        return None

    def _plan(self, seq: Sequence) -> None:
        """Look the prompt up when the sequence's turn to prefill comes rather than on arrival:
        agents that arrive together then reuse the shared prefix the first of them computed.
        The lookup pins the blocks it names; warm ones start being read from disk."""
        prompt = seq.prompt
        if not seq.prefill_only:
            self.metrics.queue_time.observe(time.perf_counter() - seq.submitted)
        seq.lease = self.store.lookup(prompt[: seq.prefill_end], seq.root)
        seq.plan.extend(seq.lease.segments)
        if seq.lease.end < seq.prefill_end:
            seq.plan.append(Segment(seq.lease.end, seq.prefill_end, None))
        for segment in seq.lease.segments:
            if segment.block is not None and segment.block.tier is Tier.WARM:
                future = self.warm.read_block(segment.block)
                future.add_done_callback(self._read_done(time.perf_counter()))
                seq.reads[segment.block.hash] = future
        seq.status = Status.PREFILLING

    def _read_done(self, started: float) -> Callable[[Future], None]:
        """On the reader thread when a warm block is read: count it, wake the loop."""

        def done(future: Future) -> None:
            outcome = "ok" if future.exception() is None else "refused"
            self.metrics.disk_loads.labels(outcome).observe(time.perf_counter() - started)
            self._inbox.put(lambda: None)

        return done

    def _prefill(self, seq: Sequence) -> None:
        if not self._prefiller.run(seq, self.scheduler.chunk_tokens):
            return
        if seq.prefill_only:
            self._end(seq, "follow-up", seq.cache, seq.prompt)
            return
        self._share_prompt(seq)
        params = seq.request.params
        self._batch.add(seq.id, seq.prompt, seq.cache, seq.sampler, seq.processors, params.max_tokens)
        seq.cache = None
        seq.status = Status.DECODING

    def _share_prompt(self, seq: Sequence) -> None:
        """Offer the prompt's new whole blocks for reuse now, not when the request ends, so
        that requests arriving while this one decodes skip the prefix they share with it."""
        whole = (len(seq.prompt) - 1) // BLOCK_TOKENS * BLOCK_TOKENS
        if whole > seq.lease.end:
            self._committer.commit(seq, None, seq.cache, seq.prompt[:whole])

    def _decode(self) -> None:
        stopped = []
        self.metrics.batch_size.observe(len(self._batch))
        for t in self._batch.step():
            seq = self._seqs[t.seq_id]
            hit = seq.take(t.token, t.finish)
            now = time.perf_counter()
            self.metrics.generated_tokens.inc()
            if seq.usage.completion_tokens == 1:
                self.metrics.ttft.observe(now - seq.submitted)
            else:
                self.metrics.inter_token.observe(now - seq.last_token)
            seq.last_token = now
            if hit and t.finish is None:
                stopped.append(seq)  # a stop string: it leaves the batch below
            elif hit or t.finish is not None:
                self._end(seq, "stop" if hit else t.finish, t.cache, t.tokens)
        if stopped:
            taken = self._batch.remove([s.id for s in stopped])
            for seq in stopped:
                self._end(seq, "stop", *taken[seq.id])

    def _end(
        self,
        seq: Sequence,
        reason: str,
        cache: list | None = None,
        tokens: list[int] | None = None,
        error: Failed | None = None,
    ) -> None:
        """Every sequence ends here, once: release its pins, commit its KV, report."""
        if seq.status is Status.FINISHED:
            return
        seq.status = Status.FINISHED
        self._seqs.pop(seq.id, None)
        if seq.lease is not None:  # first, so the blocks it read from disk can become hot
            self.store.release(seq.lease)
            seq.lease = None
        if cache is not None and tokens:
            follow_up = self._committer.commit_turn(seq, reason, cache, tokens)
            if follow_up is not None:
                self._follow_up(seq, follow_up)
        if seq.prefill_only:
            return
        self.metrics.finished.labels(reason).inc()
        self.metrics.prompt_length.observe(seq.usage.prompt_tokens)
        self.metrics.generation_length.observe(seq.usage.completion_tokens)
        if error is not None:
            seq.sink(error)
            return
        self.metrics.cached_tokens.labels("hot").inc(seq.usage.hot_tokens)
        self.metrics.cached_tokens.labels("warm").inc(seq.usage.warm_tokens)
        seq.sink(Finished(reason, seq.usage, seq.stops.matched))

    def _follow_up(self, seq: Sequence, tokens: list[int]) -> None:
        """Queue the KV of `tokens` for the sequence's agent as a prefill with no decoding: done
        now, at the engine's leisure, rather than in the agent's next turn."""
        params = SamplingParams(max_tokens=0, temperature=0.0)
        request = replace(seq.request, prompt=tokens, params=params, agent=seq.agent, grammar=None)
        seq = self._new_sequence(next(self._ids), request, lambda event: None, time.perf_counter(), prefill_only=True)
        self._seqs[seq.id] = seq

    def _cancel(self, seq_id: int) -> None:
        seq = self._seqs.get(seq_id)
        if seq is None:
            return
        if seq.status is Status.DECODING:
            self._end(seq, "cancelled", *self._batch.remove([seq.id])[seq.id])
        else:  # waiting or prefilling: keep what was computed
            self._end(seq, "cancelled", seq.cache, seq.prompt[: seq.pos])

    def _end_agent(self, agent: AgentKey) -> bool | Future:
        for seq in self._seqs.values():
            if seq.agent == agent:
                seq.agent = None
        return self.store.end_agent(agent)

    def _shutdown(self) -> None:
        for seq in list(self._seqs.values()):
            self._end(seq, "shutdown", error=Failed("the server is shutting down", 503, "shutting_down"))
        if self.warm is not None:
            log.info("flushing the warm tier")
            self.warm.close()
        # MLX's per-thread streams must be cleared by the thread that used them, or the
        # process can abort at exit (ml-explore/mlx#4327).
        mx.synchronize()
        mx.clear_streams()

"""Planning a sequence: the store's lookup, when the sequence's turn to prefill comes (not on
arrival, so that agents arriving together reuse the shared prefix the first of them computed),
turned into its plan (cached segments, the snapshot, what to compute, where to stop to offer
a shared head or a client's breakpoint) and the warm-tier reads it needs started; and why the
prompt was not reused further (memory/index/misses.py), for its usage."""

from __future__ import annotations

import time
from collections.abc import Callable
from concurrent.futures import Future

from tokenizers import Tokenizer

from agent_memory.cache_miss import NONE
from agent_memory.engine.observability.metrics import Metrics
from agent_memory.engine.observability.trace import NoTrace
from agent_memory.engine.sequence import Sequence, Status
from agent_memory.memory.index import misses
from agent_memory.memory.index.blocks import Tier
from agent_memory.memory.index.store import AgentCacheStore
from agent_memory.memory.index.store_records import Segment
from agent_memory.memory.warm.tier import WarmTier


class Planner:
    def __init__(
        self,
        store: AgentCacheStore,
        warm: WarmTier | None,
        metrics: Metrics,
        trace: NoTrace,
        post: Callable[[Callable[[], None]], None],
        decoder: Tokenizer,
    ) -> None:
        """decoder: the engine thread's tokenizer, for a rewritten history's excerpt."""
        self.store = store
        self.decoder = decoder
        self.warm = warm
        self.metrics = metrics
        self.trace = trace
        self._post = post  # queue a call for the engine thread (it wakes the loop)

    def plan(self, seq: Sequence) -> None:
        """The lookup pins the blocks (and the snapshot) it names; warm ones start being read."""
        t0 = time.perf_counter()
        if not seq.prefill_only:
            self.metrics.queue_time.observe(t0 - seq.submitted)
        looked_up, extras = seq.prompt[: seq.prefill_end], seq.request.extra_keys
        seq.lease = lease = self.store.lookup(looked_up, seq.root, extras)
        if not seq.prefill_only:  # a follow-up's miss is nobody's to read
            with self.store.lock:
                seq.generation.usage.miss = misses.explain(
                    self.store, seq.agent, looked_up, seq.root, extras, lease, self._text, self.store.state_layers
                )
        seq.plan.extend(lease.segments)
        if lease.end < seq.prefill_end:
            seq.plan.append(Segment(lease.end, seq.prefill_end, None))
        if seq.request.remember:  # state layers: a head others share ends at `matched`; a client's breakpoints
            marks = {lease.matched, *(b.position for b in seq.request.breakpoints)}
            seq.marks = sorted(m for m in marks if lease.end < m < seq.prefill_end)
        planned = [segment.block for segment in lease.segments if segment.block is not None]
        for block in [*planned, *filter(None, [lease.snapshot])]:
            if block.tier is Tier.WARM:
                future = self.warm.read_block(block)
                future.add_done_callback(self._read_done(seq.id, t0))
                seq.reads[block.hash] = future
        seq.status = Status.PREFILLING
        self.trace.planned(seq, t0)

    def report_miss(self, seq: Sequence) -> None:
        """A request that ended: its miss counted by reason, and kept with its agent unless
        nothing was missed."""
        miss = seq.generation.usage.miss
        if miss is None or seq.parent is not None:  # a request's other samples: counted once, by sample 0
            return
        self.metrics.missed(miss)
        if seq.agent is not None and miss.reason != NONE and seq.request.remember:
            self.store.note_miss(seq.agent, miss)

    def _text(self, ids: list[int]) -> str:
        return self.decoder.decode(list(ids), skip_special_tokens=False)

    def _read_done(self, seq_id: int, started: float) -> Callable[[Future], None]:
        """On the reader thread when a warm block is read: count it, wake the loop."""

        def done(future: Future) -> None:
            outcome = "ok" if future.exception() is None else "refused"
            self.metrics.disk_loads.labels(outcome).observe(time.perf_counter() - started)
            self.trace.read_done(seq_id)
            self._post(lambda: None)

        return done

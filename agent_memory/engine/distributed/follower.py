"""A follower rank's engine: it runs no scheduler, store or sampler, only rank 0's step plans.

Each step it applies the plan's ops in order (sequences admitted and planned, ends, blocks cut
from captured caches, payloads demoted or dropped), then runs the same work as rank 0 — the
batch's decode step, then one prefill chunk of the same size — so that every forward, and every
collective inside it, matches rank 0's. Where rank 0 commits without saying so first (a prefill
that ends, a mark reached, an end-of-sequence or length finish inside the decode step), the
follower knows it by the same logic and captures the cache there; the next plan's `Kept` says
which blocks to cut from it (attention KV of past positions never changes: one step later is
exact), and every capture is then dropped.
"""

from __future__ import annotations

import itertools
import logging

import agent_memory.blas  # noqa: F401
import mlx.core as mx

from agent_memory.engine.batch.decode_batch import DecodeBatch
from agent_memory.engine.distributed import sampling
from agent_memory.engine.distributed.payloads import Payloads
from agent_memory.engine.distributed.plan import (
    END,
    Admit,
    Ended,
    Kept,
    KeptSnapshot,
    IDLE,
    STOP,
    Op,
    Planned,
    PoolOp,
    RankStatus,
    StepPlan,
    StepWork,
    WarmOp,
)
from agent_memory.engine.distributed.recorder import Group
from agent_memory.engine.distributed.shadow import Shadow
from agent_memory.engine.kinds import attention
from agent_memory.engine.kinds.layers import ModelLayers
from agent_memory.engine.loading.budget import give_back_memory
from agent_memory.engine.prefill import next_chunk
from agent_memory.precision import Precisions

log = logging.getLogger(__name__)


class Capture:
    """A sequence's cache at a point rank 0 may commit from, kept until the next plan says what."""

    def __init__(self, cache: list, stored: list, snapshot) -> None:
        self.cache, self.stored, self.snapshot = cache, stored, snapshot


class Follower:
    def __init__(
        self, model, layers: ModelLayers, precisions: Precisions, eos: list[int], group: Group, demote=None
    ) -> None:
        """`demote`: parts.demoter(precisions), how rank 0's exact blocks cool (None: they do not)."""
        self.model = model
        self.layers = layers
        self.precisions = precisions
        self.group = group
        self.batch = DecodeBatch(model, eos)
        self.payloads = Payloads(demote)
        self.shadows: dict[int, Shadow] = {}  # waiting, prefilling and decoding, by sequence id
        self.captures: dict[tuple[int, int], Capture] = {}

    def serve(self, channel: Group) -> None:
        """A follower rank's engine thread: rank 0's plans, run one after the other, until it
        says stop (a lost rank raises from the collective; the watchdog ends a silent group)."""
        for n in itertools.count(1):
            with channel.watching(f"plan {n}"):  # rank 0's plan, then the step's forwards
                plan, _ = channel.broadcast(None, self.status())
                self.run(plan)
            if plan.flags & STOP:
                log.info("rank 0 stopped: stopping")
                return

    def status(self) -> RankStatus:
        hot = sum(payload.nbytes for payload in self.payloads.held.values())
        return RankStatus(hot_kib=hot >> 10)

    def run(self, plan: StepPlan) -> None:
        """One step: the plan's ops, then its work. Idle with nothing running, the memory of a
        burst goes back to the system, as on rank 0."""
        self.apply(plan.ops)
        self.execute(plan.work)
        if plan.flags & IDLE and not self.shadows:
            give_back_memory()

    # -- ops -----------------------------------------------------------------------------

    def apply(self, ops: list[Op]) -> None:
        kept = []
        for op in ops:
            if isinstance(op, Admit):
                self.shadows[op.seq_id] = Shadow(op.seq_id, op, self.layers.new_cache(self.precisions.working))
            elif isinstance(op, Planned):
                self.shadows[op.seq_id].planned(op)
            elif isinstance(op, Ended):
                self._end(op.seq_id)
            elif isinstance(op, Kept):
                capture = self.captures[op.capture]
                block = self.layers.cut_at(capture.cache, op.start, op.end, capture.stored, self.precisions.working)
                self.payloads.put(op.hash, block)
                kept.append(block.arrays)
            elif isinstance(op, KeptSnapshot):
                self.payloads.put(op.hash, self.captures[op.capture].snapshot)
            elif isinstance(op, PoolOp):
                self._pool(op)
            elif isinstance(op, WarmOp):
                raise NotImplementedError("a follower has no warm tier yet")
        mx.eval(kept)  # cut now: the captured caches go
        self.captures.clear()

    def _pool(self, op: PoolOp) -> None:
        if op.op == "demote":
            self.payloads.demote(op.hash)
        elif op.op == "drop":
            self.payloads.drop(op.hash)
        else:
            raise NotImplementedError("a follower has no warm tier yet: it cannot read block %s" % op.hash[:12])

    def _end(self, seq_id: int) -> None:
        """Rank 0 ended a sequence: out of the batch (its cache now exactly rank 0's) or its
        prefill stopped; one it ended on its own (a finish in the decode step) is gone already."""
        shadow = self.shadows.pop(seq_id, None)
        if shadow is None:
            return
        if seq_id in self.batch.seq_ids:
            cache, _ = self.batch.remove([seq_id])[seq_id]
            self._capture(shadow, END, cache)
        elif shadow.pos:  # ended before its prefill computed anything (a cancel, a settle superseded): nothing to keep
            self._capture(shadow, shadow.pos, shadow.cache)

    def _capture(self, shadow: Shadow, point: int, cache: list) -> None:
        snapshot = self.layers.take_snapshot(cache) if self.layers.has_state else None  # now: a state moves on
        self.captures[(shadow.seq_id, point)] = Capture(cache, shadow.stored, snapshot)

    # -- work ----------------------------------------------------------------------------

    def execute(self, work: StepWork | None) -> None:
        if work is None:
            return
        if work.decode:
            for token in self.batch.step(work.waiting):
                if token.finish is not None:  # end of sequence or length: as on rank 0
                    self._capture(self.shadows.pop(token.seq_id), END, token.cache)
        if work.prefill is not None and self._prefill(self.shadows[work.prefill], work.budget):
            self._prefill_done(self.shadows[work.prefill])

    def _prefill(self, shadow: Shadow, budget: int) -> bool:
        """Prefiller.run's chunk over the shadow: the same cached runs, the same computed sizes
        (so the same forwards), stopping at the same marks."""
        while shadow.plan and budget > 0:
            start, end, block = shadow.plan[0]
            if block is not None:
                self._append_cached(shadow)
                continue
            n, mark = next_chunk(shadow.pos, end, shadow.marks, budget)
            self.model(mx.array(shadow.prompt[shadow.pos : shadow.pos + n])[None], cache=shadow.cache)
            mx.eval([c.state for c in shadow.cache])
            shadow.pos += n
            budget -= n
            if shadow.pos == mark:
                self._capture(shadow, shadow.pos, shadow.cache)
            if shadow.pos == end:
                shadow.plan.popleft()
        return not shadow.plan

    def _append_cached(self, shadow: Shadow) -> None:
        parts = []
        while shadow.plan and shadow.plan[0][2] is not None:
            start, end, block = shadow.plan.popleft()
            stored = self.payloads.get(block)
            parts.append((stored, end - start))
            shadow.stored.append(attention.StoredRun(shadow.pos, shadow.pos + end - start, stored))
            shadow.pos += end - start
        self.layers.append(shadow.cache, parts, self.precisions.working)
        if shadow.snapshot is not None and shadow.pos == shadow.snapshot_at:
            self.layers.restore(shadow.cache, self.payloads.get(shadow.snapshot))

    def _prefill_done(self, shadow: Shadow) -> None:
        """As EngineCore._prefill_done: the sequence and its other samples join the batch (each
        join runs its first forward), or a follow-up ends."""
        self._capture(shadow, shadow.pos, shadow.cache)
        admit = shadow.admit
        if admit.prefill_only:
            del self.shadows[shadow.seq_id]
            return
        for seq_id in [admit.seq_id, *admit.sample_ids]:
            if seq_id != admit.seq_id:
                self.shadows[seq_id] = Shadow(seq_id, admit, None, shadow.pos)
            sampler = sampling.following(self.group.token_sum(seq_id))
            self.batch.add(seq_id, admit.prompt, shadow.cache, sampler, [], admit.max_tokens)

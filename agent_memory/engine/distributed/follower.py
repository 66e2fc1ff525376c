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
from collections import deque

import agent_memory.blas  # noqa: F401
import mlx.core as mx

from agent_memory.engine.batch.decode_batch import DecodeBatch
from agent_memory.engine.distributed import sampling
from agent_memory.engine.distributed.payloads import Payloads
from agent_memory.engine.distributed.plan import (
    END,
    Admit,
    Ended,
    Held,
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
from agent_memory.engine.prefill import from_disk, next_chunk, warm_ahead
from agent_memory.memory.warm.format.records import BlockRecord
from agent_memory.memory.warm.tier import WarmTier
from agent_memory.precision import Precisions

log = logging.getLogger(__name__)


class Capture:
    """A sequence's cache at a point rank 0 may commit from, kept until the next plan says what."""

    def __init__(self, cache: list, stored: list, snapshot) -> None:
        self.cache, self.stored, self.snapshot = cache, stored, snapshot


class Follower:
    def __init__(
        self,
        model,
        layers: ModelLayers,
        precisions: Precisions,
        eos: list[int],
        group: Group,
        demote=None,
        warm: WarmTier | None = None,
    ) -> None:
        """`demote`: parts.demoter(precisions), how rank 0's exact blocks cool (None: they do not);
        `warm`: this rank's warm tier (blocks only: its shard of each block rank 0 writes)."""
        self.model = model
        self.warm = warm
        self.on_disk: set[str] = set()  # the blocks rank 0 had this rank write and not delete
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
                if self.warm is not None:  # what rank 0 had it write, written
                    self.warm.close()
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
                self._read(self.shadows[op.seq_id], op.reads)
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
                self._warm(op)
            elif isinstance(op, Held):
                self._keep_only(set(op.hashes))
        mx.eval(kept)  # cut now: the captured caches go
        self.captures.clear()

    def _pool(self, op: PoolOp) -> None:
        if op.op == "demote":
            self.payloads.demote(op.hash)
        elif op.op == "drop":
            self.payloads.drop(op.hash)
        else:
            raise RuntimeError(f"rank 0's plan has a pool op this rank does not know: {op.op}")

    # -- the warm tier: this rank's shard of each block, in its own folder ------------------

    def _warm(self, op: WarmOp) -> None:
        """Rank 0's write or delete, on this rank's folder: a save writes the payload held now,
        which is the one rank 0 saved (the op comes before its commit's eviction)."""
        if self.warm is None:
            raise RuntimeError("rank 0 writes to its warm tier, but this rank has none")
        if op.op == "delete":
            self.on_disk.discard(op.hash)
            self.warm.delete_block(op.hash, first=False)  # after a save of it queued here
        elif op.hash not in self.on_disk:  # written already: the first write's bits stay
            self.on_disk.add(op.hash)
            tensors = self.payloads.get(op.hash).tensors(self.precisions.disk)
            self.warm.save_block(BlockRecord.from_meta(op.meta), tensors)

    def _keep_only(self, held: set[str]) -> None:
        """Delete the block files rank 0's folder does not hold: no manifest will name them."""
        stray = [p.stem for p in self.warm.folder.blocks.glob("*/*.safetensors") if p.stem not in held]
        for block_hash in stray:
            self.warm.delete_block(block_hash, first=False)
        if stray:
            log.info("warm tier %s: %d block files rank 0 does not hold, deleted", self.warm.location, len(stray))

    def _read(self, shadow: Shadow, records: list[dict[str, str]]) -> None:
        """Start reading the blocks rank 0 reads from its warm tier, from this rank's."""
        for meta in records:
            record = BlockRecord.from_meta(meta)
            if self.warm.saving(record.hash):  # its write is queued here still: read what it wrote
                self.warm.flush()
            shadow.reads[record.hash] = (record, self.warm.read_block(record))

    def _failed_reads(self, shadow: Shadow) -> set[str]:
        """As Prefiller._failed_reads: this rank's failures, agreed with every rank's."""
        run = list(itertools.takewhile(lambda s: s[2] is not None, shadow.plan))
        at_end = shadow.snapshot if shadow.snapshot is not None and run[-1][1] == shadow.snapshot_at else None
        ahead = warm_ahead([h for _, _, h in run], at_end, shadow.reads)
        if not ahead:
            return set()
        mine = [shadow.reads[h][1].exception() for h in ahead]  # waits for them
        for h, e in zip(ahead, mine):
            if e is not None:
                log.info("block %s unreadable here (%s): every rank recomputes it", h[:12], e)
        agreed = self.group.agree([int(e is not None) for e in mine])
        return {h for h, n in zip(ahead, agreed) if n}

    def _stored(self, shadow: Shadow, block_hash: str, failed: set[str]):
        """A planned block's or snapshot's payload: held, or read (None: a rank could not)."""
        read = shadow.reads.pop(block_hash, None)
        if read is None:
            return self.payloads.get(block_hash)
        if block_hash in failed:
            self.on_disk.discard(block_hash)
            return None
        record, future = read
        return from_disk(self.layers, self.precisions, record.snapshot, record.start, future.result())

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
        """As Prefiller._append_cached: a block a rank could not read becomes a gap (with state
        layers, the whole prompt is computed)."""
        failed = self._failed_reads(shadow)
        parts = []
        while shadow.plan and shadow.plan[0][2] is not None:
            start, end, block = shadow.plan.popleft()
            stored = self._stored(shadow, block, failed)
            if stored is None:
                if self.layers.has_state:
                    return self._start_over(shadow)
                shadow.plan.appendleft((start, end, None))
                break
            parts.append((stored, end - start))
            shadow.stored.append(attention.StoredRun(shadow.pos, shadow.pos + end - start, stored))
            shadow.pos += end - start
        self.layers.append(shadow.cache, parts, self.precisions.working)
        if shadow.snapshot is not None and shadow.pos == shadow.snapshot_at:
            state = self._stored(shadow, shadow.snapshot, failed)
            if state is None:
                return self._start_over(shadow)
            self.layers.restore(shadow.cache, state)

    def _start_over(self, shadow: Shadow) -> None:
        shadow.cache = self.layers.new_cache(self.precisions.working)
        shadow.pos, shadow.stored = 0, []
        shadow.plan = deque([(0, shadow.prefill_end, None)])

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

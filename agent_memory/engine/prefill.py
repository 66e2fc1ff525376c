"""Prefill one sequence from its plan, a chunk at a time: runs of cached blocks are appended to
its working cache's attention layers as KV (from memory, or read from disk and brought to the
hot precision, then converted to the working precision), and at the plan's snapshot its window
and recurrent layers take the state kept there (engine/kinds/layers.py); gaps and the new
suffix are computed by the model. Where the prompt stops matching what others cached (a head
agents share), and at a client's breakpoints, it stops to offer what it computed (with a
snapshot, on a model with state layers) for the next agent."""

from __future__ import annotations

import itertools
import logging
from collections import deque
from contextlib import nullcontext

import agent_memory.blas  # noqa: F401
import mlx.core as mx

from agent_memory.cache_miss import unreadable
from agent_memory.engine.commit import Committer
from agent_memory.engine.distributed.recorder import NO_RECORDER
from agent_memory.engine.kinds import attention
from agent_memory.engine.kinds.layers import ModelLayers, Snapshot
from agent_memory.engine.sequence import Sequence
from agent_memory.memory.index.blocks import Block
from agent_memory.memory.index.store import AgentCacheStore
from agent_memory.memory.index.store_records import Segment
from agent_memory.precision import Precisions
from agent_memory.vision.positions import Positions
from agent_memory.vision.tower import VisionTower

log = logging.getLogger(__name__)


def next_chunk(pos: int, end: int, marks: list[int], budget: int) -> tuple[int, int | None]:
    """How many tokens from `pos` the next forward computes (at most `budget`, not past the
    segment's `end` nor the next mark), and that mark: the same sizes on every rank of a
    distributed server (engine/distributed/follower.py), so the same forwards."""
    n = min(budget, end - pos)
    if (mark := next((m for m in marks if m > pos), None)) is not None:
        n = min(n, mark - pos)
    return n, mark


def warm_ahead(run: list[str], snapshot: str | None, reads) -> list[str]:
    """Of a cached run about to be appended (its blocks, then the snapshot where it ends), the
    ones read from the warm tier, in order: what every rank agrees on before using them."""
    return [h for h in [*run, *([snapshot] if snapshot is not None else [])] if h in reads]


def from_disk(layers: ModelLayers, p: Precisions, snapshot: bool, start: int, arrays) -> attention.BlockKV | Snapshot:
    """A block or snapshot read from the warm tier, as a hot payload (the hot precision)."""
    if snapshot:
        return layers.snapshot_from_numpy(arrays, start)
    stored = layers.block_from_numpy(arrays, p.disk)
    return attention.BlockKV(attention.convert(stored.arrays, p.disk, p.hot), p.hot)


class Prefiller:
    def __init__(
        self,
        model,
        layers: ModelLayers,
        precisions: Precisions,
        store: AgentCacheStore,
        committer: Committer,
        tower: VisionTower | None = None,
        positions: Positions | None = None,
    ) -> None:
        self.model = model
        self.tower = tower  # a vision model's image embeddings (vision/tower.py); None: text only
        self.positions = positions  # a model whose image tokens take 3-D positions (vision/positions.py)
        self.layers = layers
        self.precisions = precisions
        self.store = store
        self.committer = committer
        self.recorder = NO_RECORDER  # split over processes: warm reads' failures agreed by every rank

    def run(self, seq: Sequence, budget: int) -> bool:
        """Put up to `budget` computed tokens (and any cached runs) into the sequence's cache;
        True once its whole plan is in."""
        while seq.plan and budget > 0:
            if seq.plan[0].block is not None:
                self._append_cached(seq)
                continue
            segment = seq.plan[0]
            n, mark = next_chunk(seq.pos, segment.end, seq.marks, budget)
            self._compute(seq, n)
            mx.eval([c.state for c in seq.cache])
            seq.pos += n
            budget -= n
            if seq.pos == mark:
                self.committer.share(seq, seq.pos)
            if seq.pos == segment.end:
                seq.plan.popleft()
        return not seq.plan

    def _compute(self, seq: Sequence, n: int) -> None:
        """The model over the sequence's next n tokens: from their ids, or from input embeddings
        where an image's tokens are among them (vision/tower.py); every chunk of a prompt whose
        images take 3-D positions at its own positions (vision/positions.py)."""
        ids = mx.array(seq.prompt[seq.pos : seq.pos + n])[None]
        vision, placement = seq.request.vision, seq.placement
        embeds = self.tower.chunk_embeddings(seq.prompt, seq.pos, seq.pos + n, vision, seq.root) if vision else None
        placed = placement.positions(seq.pos, seq.pos + n)[:, None] if placement is not None else None
        with self.positions.rows(explicit=placed) if placed is not None else nullcontext():
            if embeds is None:
                self.model(ids, cache=seq.cache)
            else:
                self.model(ids, cache=seq.cache, input_embeddings=embeds)

    def _append_cached(self, seq: Sequence) -> None:
        """Append the run of cached blocks at the head of the plan to the sequence's cache, and
        the snapshot where the run ends. A block whose file cannot be read becomes a gap to
        recompute; with state layers, whose state before a gap is unknown, the whole prompt is."""
        p = self.precisions
        failed = self._failed_reads(seq)
        parts = []
        while seq.plan and seq.plan[0].block is not None:
            segment = seq.plan.popleft()
            n = segment.end - segment.start
            block = segment.block
            from_warm = block.hash in seq.reads
            stored = self._payload(seq, block, failed)
            if stored is None:
                if self.layers.has_state:
                    self._start_over(seq)
                    return
                seq.plan.appendleft(Segment(segment.start, segment.end, None))
                break
            parts.append((stored, n))
            seq.stored.append(attention.StoredRun(seq.pos, seq.pos + n, stored))
            seq.pos += n
            if from_warm:
                seq.generation.usage.warm_tokens += n
            else:
                seq.generation.usage.hot_tokens += n
        self.layers.append(seq.cache, parts, p.working)
        snapshot = seq.lease.snapshot
        if snapshot is not None and seq.pos == snapshot.start:
            state = self._payload(seq, snapshot, failed)
            if state is None:
                self._start_over(seq)
                return
            self.layers.restore(seq.cache, state)

    def _failed_reads(self, seq: Sequence) -> set[str]:
        """The warm reads of the cached run at the plan's head that failed here or, split over
        processes, on any rank (one agreement, only where the run reads from disk), so that
        every rank recomputes the same blocks."""
        run = list(itertools.takewhile(lambda s: s.block is not None, seq.plan))
        snapshot = seq.lease.snapshot
        at_end = snapshot.hash if snapshot is not None and run[-1].end == snapshot.start else None
        ahead = warm_ahead([s.block.hash for s in run], at_end, seq.reads)
        if not ahead:
            return set()
        agreed = self.recorder.agree([int(seq.reads[h].exception() is not None) for h in ahead])
        return {h for h, n in zip(ahead, agreed) if n}

    def _payload(self, seq: Sequence, block: Block, failed: set[str]) -> attention.BlockKV | Snapshot | None:
        """A planned block's or snapshot's payload: held in memory, or read from the warm tier
        (None when a rank's copy is unreadable: it is recomputed from now on)."""
        read = seq.reads.pop(block.hash, None)
        if read is None:
            return block.payload
        if block.hash in failed:
            why = read.exception() or "another rank could not read its part"
            log.info("block %s unreadable (%s): recomputing it", block.hash[:12], why)
            self.store.warm_lost(block)
            if read.exception() is None:  # this rank's copy is of no use without the others'
                self.store.warm.delete_block(block.hash)
            usage = seq.generation.usage
            at = 0 if self.layers.has_state else block.start  # state layers: the whole prompt again
            n = (seq.lease.end if self.layers.has_state else min(block.end, seq.lease.end)) - at
            usage.miss = unreadable(usage.miss, at, n)
            return None
        return from_disk(self.layers, self.precisions, block.snapshot, block.start, read.result())

    def _start_over(self, seq: Sequence) -> None:
        """Compute the whole prompt: what was put in the cache cannot be completed."""
        seq.cache = self.layers.new_cache(self.precisions.working)
        seq.pos, seq.stored = 0, []
        seq.generation.usage.hot_tokens = seq.generation.usage.warm_tokens = 0
        seq.plan = deque([Segment(0, seq.prefill_end, None)])

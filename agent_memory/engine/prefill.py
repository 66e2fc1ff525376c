"""Prefill one sequence from its plan, a chunk at a time: runs of cached blocks are appended to
its working cache's attention layers as KV (from memory, or read from disk and brought to the
hot precision, then converted to the working precision), and at the plan's snapshot its window
and recurrent layers take the state kept there (engine/kinds/layers.py); gaps and the new
suffix are computed by the model. Where the prompt stops matching what others cached (a head
agents share), and at a client's breakpoints, it stops to offer what it computed (with a
snapshot, on a model with state layers) for the next agent."""

from __future__ import annotations

import logging
from collections import deque

import agent_memory.blas  # noqa: F401
import mlx.core as mx

from agent_memory.cache_miss import unreadable
from agent_memory.engine.commit import Committer
from agent_memory.engine.kinds import attention
from agent_memory.engine.kinds.layers import ModelLayers, Snapshot
from agent_memory.engine.sequence import Sequence
from agent_memory.memory.index.blocks import Block
from agent_memory.memory.index.store import AgentCacheStore
from agent_memory.memory.index.store_records import Segment
from agent_memory.precision import Precisions
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


class Prefiller:
    def __init__(
        self,
        model,
        layers: ModelLayers,
        precisions: Precisions,
        store: AgentCacheStore,
        committer: Committer,
        tower: VisionTower | None = None,
    ) -> None:
        self.model = model
        self.tower = tower  # a vision model's image embeddings (vision/tower.py); None: text only
        self.layers = layers
        self.precisions = precisions
        self.store = store
        self.committer = committer

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
        where an image's tokens are among them (vision/tower.py)."""
        ids = mx.array(seq.prompt[seq.pos : seq.pos + n])[None]
        vision = seq.request.vision
        embeds = self.tower.chunk_embeddings(seq.prompt, seq.pos, seq.pos + n, vision, seq.root) if vision else None
        if embeds is None:
            self.model(ids, cache=seq.cache)
        else:
            self.model(ids, cache=seq.cache, input_embeddings=embeds)

    def _append_cached(self, seq: Sequence) -> None:
        """Append the run of cached blocks at the head of the plan to the sequence's cache, and
        the snapshot where the run ends. A block whose file cannot be read becomes a gap to
        recompute; with state layers, whose state before a gap is unknown, the whole prompt is."""
        p = self.precisions
        parts = []
        while seq.plan and seq.plan[0].block is not None:
            segment = seq.plan.popleft()
            n = segment.end - segment.start
            block = segment.block
            from_warm = block.hash in seq.reads
            stored = self._payload(seq, block)
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
            state = self._payload(seq, snapshot)
            if state is None:
                self._start_over(seq)
                return
            self.layers.restore(seq.cache, state)

    def _payload(self, seq: Sequence, block: Block) -> attention.BlockKV | Snapshot | None:
        """A planned block's or snapshot's payload: held in memory, or read from the warm tier
        (None when that copy is unreadable: it is recomputed from now on)."""
        read = seq.reads.pop(block.hash, None)
        if read is None:
            return block.payload
        if read.exception() is not None:
            log.info("block %s unreadable (%s): recomputing it", block.hash[:12], read.exception())
            self.store.warm_lost(block)
            usage = seq.generation.usage
            at = 0 if self.layers.has_state else block.start  # state layers: the whole prompt again
            n = (seq.lease.end if self.layers.has_state else min(block.end, seq.lease.end)) - at
            usage.miss = unreadable(usage.miss, at, n)
            return None
        if block.snapshot:
            return self.layers.snapshot_from_numpy(read.result(), block.start)
        p = self.precisions
        stored = self.layers.block_from_numpy(read.result(), p.disk)
        return attention.BlockKV(attention.convert(stored.arrays, p.disk, p.hot), p.hot)

    def _start_over(self, seq: Sequence) -> None:
        """Compute the whole prompt: what was put in the cache cannot be completed."""
        seq.cache = self.layers.new_cache(self.precisions.working)
        seq.pos, seq.stored = 0, []
        seq.generation.usage.hot_tokens = seq.generation.usage.warm_tokens = 0
        seq.plan = deque([Segment(0, seq.prefill_end, None)])

"""Prefill one sequence from its plan, a chunk at a time: runs of cached blocks are appended to
its working cache as KV (from memory, or read from disk and brought to the hot precision, then
converted to the working precision); gaps and the new suffix are computed by the model."""

from __future__ import annotations

import logging

import agent_memory.blas  # noqa: F401
import mlx.core as mx

from agent_memory.engine import kv
from agent_memory.engine.sequence import Sequence
from agent_memory.memory.index.store import AgentCacheStore
from agent_memory.memory.index.store_records import Segment
from agent_memory.precision import Precisions

log = logging.getLogger(__name__)


class Prefiller:
    def __init__(self, model, shape: kv.KVShape, precisions: Precisions, store: AgentCacheStore) -> None:
        self.model = model
        self.shape = shape
        self.precisions = precisions
        self.store = store

    def run(self, seq: Sequence, budget: int) -> bool:
        """Put up to `budget` computed tokens (and any cached runs) into the sequence's cache;
        True once its whole plan is in."""
        while seq.plan and budget > 0:
            if seq.plan[0].block is not None:
                self._append_cached(seq)
                continue
            segment = seq.plan[0]
            n = min(budget, segment.end - seq.pos)
            self.model(mx.array(seq.prompt[seq.pos : seq.pos + n])[None], cache=seq.cache)
            mx.eval([c.state for c in seq.cache])
            seq.pos += n
            budget -= n
            if seq.pos == segment.end:
                seq.plan.popleft()
        return not seq.plan

    def _append_cached(self, seq: Sequence) -> None:
        """Append the run of cached blocks at the head of the plan to the sequence's cache.
        A block whose file cannot be read becomes a gap to recompute."""
        p = self.precisions
        parts = []
        while seq.plan and seq.plan[0].block is not None:
            segment = seq.plan.popleft()
            n = segment.end - segment.start
            block = segment.block
            read = seq.reads.pop(block.hash, None)
            if read is None:
                stored = block.payload
                seq.usage.hot_tokens += n
            elif read.exception() is None:
                stored = kv.BlockKV(kv.convert(kv.from_numpy(read.result(), self.shape), p.disk, p.hot), p.hot)
                seq.usage.warm_tokens += n
            else:
                log.info("block %s unreadable (%s): recomputing it", block.hash[:12], read.exception())
                self.store.warm_lost(block)
                seq.plan.appendleft(Segment(segment.start, segment.end, None))
                break
            parts.append((stored, n))
            seq.stored.append(kv.StoredRun(seq.pos, seq.pos + n, stored))
            seq.pos += n
        kv.append(seq.cache, parts, p.working)

"""Eviction, the store's half that keeps the tiers within their budgets (AgentCacheStore mixes
it in): Pensieve's retention value, recompute cost per byte over idle time, so an idle agent's
cheap early blocks leave first; a block a running sequence uses never leaves. Over the hot
budget an exact block is quantized first, a quantized one leaves memory; over the disk budget
a block's warm copy goes (it becomes COLD: its tokens are kept, its KV is recomputed)."""

from __future__ import annotations

import time

from agent_memory.memory.index.blocks import Block, Tier

# Reloading a block from disk costs this fraction of recomputing it.
DISK_RELOAD_COST = 0.05


class Eviction:
    """Needs the store's pool, budgets, lock, `demote`, `moves`, `warm`, `shared` and `_drop_if_unused`."""

    # -- eviction -----------------------------------------------------------------------

    def set_hot_budget(self, nbytes: int) -> None:
        """A new share of the memory limit (engine/residency.py): over it, blocks cool now."""
        with self.lock:
            self.hot_budget_bytes = nbytes
            self._evict_hot()

    def retention_value(self, block: Block, now: float, nbytes: int, on_disk: bool) -> float:
        """What keeping the block saves, per byte per idle second; the lowest leaves first.

        The saving is the cost of getting its KV back otherwise: recompute (attention makes
        later positions dearer; a snapshot saves recomputing its whole prefix, roughly) or,
        with a disk copy, a fraction of that to reload it.
        """
        n, first = (block.start, 0) if block.snapshot else (len(block.tokens), block.start)
        cost = n * (1.0 + (first + n / 2) / self.attention_tokens)
        if on_disk:
            cost *= DISK_RELOAD_COST
        idle = now - block.last_used + 1.0
        return cost * (1 + block.refs) / (max(nbytes, 1) * idle)

    def _evict_hot(self) -> None:
        """Over the hot budget, the blocks worth least per byte cool a step each: an exact
        block is quantized (it stays hot, several times smaller), a quantized one leaves
        memory (WARM with a file, else COLD)."""
        if self.pool.hot_bytes <= self.hot_budget_bytes:
            return
        now = time.monotonic()
        candidates = [b for b in self.pool.in_tier(Tier.HOT) if b.pins == 0]
        candidates.sort(key=lambda b: self.retention_value(b, now, b.hot_bytes, bool(b.disk_bytes)))
        demoted = False
        for block in candidates:
            if self.pool.hot_bytes <= self.hot_budget_bytes:
                break
            if block.exact and self.demote is not None:
                self.pool.set_payload(block, *self.demote(block.payload))
                self.moves["hot_exact", "hot_quantized", "hot_budget"] += 1
                demoted = True
                continue
            self.pool.drop_payload(block)
            self._drop_if_unused(block)
            self.moves["hot", block.tier.value if block.hash in self.pool else "gone", "hot_budget"] += 1
        if demoted and self.pool.hot_bytes > self.hot_budget_bytes:  # not enough: a second pass
            self._evict_hot()

    def _evict_disk(self) -> None:
        if self.shared or self.pool.disk_bytes <= self.disk_budget_bytes:
            return  # a shared tier is bounded by its own maxmemory (warm/redis_backend.py)
        now = time.monotonic()
        candidates = [b for b in self.pool.blocks.values() if b.disk_bytes and b.pins == 0]
        candidates.sort(key=lambda b: self.retention_value(b, now, b.disk_bytes, False))
        for block in candidates:
            if self.pool.disk_bytes <= self.disk_budget_bytes:
                break
            self.warm.delete_block(block.hash)
            self.pool.drop_disk(block)  # agents still refer to it: it becomes COLD, not gone
            self.moves["warm", block.tier.value, "disk_budget"] += 1

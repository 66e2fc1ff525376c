"""Eviction, the store's half that keeps the tiers within their budgets (AgentCacheStore mixes
it in): Pensieve's retention value, recompute cost per byte over idle time, so an idle agent's
cheap early blocks leave first; a block a running sequence uses never leaves. Over the hot
budget an exact block is quantized first, a quantized one leaves memory; over the disk budget
a block's warm copy goes (it becomes COLD: its tokens are kept, its KV is recomputed).

Tenants share both budgets fairly: each next block to cool is the least valuable of the tenant
holding the most bytes of that tier (`fair_order`), so eviction levels the largest holders down,
and a tenant holding no more than its fair share (the budget over the tenants holding any) loses
nothing while another tenant holds more than it and has anything evictable."""

from __future__ import annotations

import collections
import time
from collections.abc import Callable, Iterator

from agent_memory.memory.index.blocks import Block, Tier

# Reloading a block from disk costs this fraction of recomputing it.
DISK_RELOAD_COST = 0.05


class Eviction:
    """Needs the store's pool, budgets, lock, `demote`, `moves`, `warm`, `shared`, `counts` and
    `drop_if_unused`."""

    # -- eviction -----------------------------------------------------------------------

    def set_hot_budget(self, nbytes: int) -> None:
        """A new share of the memory limit (engine/loading/residency.py): over it, blocks cool now."""
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
        held = self.pool.in_tier(Tier.HOT)
        for block in fair_order(
            held, lambda b: b.hot_bytes, lambda b: self.retention_value(b, now, b.hot_bytes, bool(b.disk_bytes))
        ):
            if self.pool.hot_bytes <= self.hot_budget_bytes:
                break
            if block.exact and self.demote is not None:
                self.pool.set_payload(block, *self.demote(block.payload))
                self.moves["hot_exact", "hot_quantized", "hot_budget"] += 1
                continue
            self.pool.drop_payload(block)
            self.drop_if_unused(block)
            self.moves["hot", block.tier.value if block.hash in self.pool else "gone", "hot_budget"] += 1

    def _evict_disk(self) -> None:
        if self.shared or self.pool.disk_bytes <= self.disk_budget_bytes:
            return  # a shared tier is bounded by its own maxmemory (warm/redis_backend.py)
        now = time.monotonic()
        held = [b for b in self.pool.blocks.values() if b.disk_bytes]
        for block in fair_order(
            held, lambda b: b.disk_bytes, lambda b: self.retention_value(b, now, b.disk_bytes, False)
        ):
            if self.pool.disk_bytes <= self.disk_budget_bytes:
                break
            self.warm.delete_block(block.hash)
            self.pool.drop_disk(block)  # agents still refer to it: it becomes COLD, not gone
            self.moves["warm", block.tier.value, "disk_budget"] += 1

    # -- what the API shows ----------------------------------------------------------------

    def totals(self, tenant: str | None = None) -> dict[str, int]:
        """The memory's figures against the budgets: every tenant's (None), or one tenant's."""
        with self.lock:
            mine = [b for b in self.pool.blocks.values() if tenant is None or b.tenant == tenant]
            by_tier = {t: 0 for t in Tier}
            for block in mine:
                by_tier[block.tier] += not block.snapshot
            held = [s for s in mine if s.snapshot and s.tier is not Tier.COLD]
            hot, exact = sum(b.hot_bytes for b in mine), sum(b.hot_bytes for b in mine if b.exact)
            snapshot_hot = sum(s.hot_bytes for s in held)
            return {
                "hot_bytes": hot,
                "hot_exact_bytes": exact,
                "hot_quantized_bytes": hot - exact - snapshot_hot,
                "hot_budget_bytes": self.hot_budget_bytes,
                "disk_bytes": sum(b.disk_bytes for b in mine),
                "disk_budget_bytes": self._disk_budget(),
                **{f"{t.value}_blocks": n for t, n in by_tier.items()},
                "snapshots": len(held),
                "snapshot_hot_bytes": snapshot_hot,
                "snapshot_disk_bytes": sum(s.disk_bytes for s in held),
                **self.counts(tenant),
            }

    def _disk_budget(self) -> int:
        if self.warm is None:
            return 0
        return (self.warm.usage.limit_bytes or 0) if self.shared else self.disk_budget_bytes


def fair_order(
    held: list[Block], nbytes: Callable[[Block], int], value: Callable[[Block], float]
) -> Iterator[Block]:
    """The unpinned blocks of `held` (every block of a tier) in the order they should cool: each
    next one the lowest-valued of the tenant holding the most bytes of the tier now, pinned
    blocks counted. The caller cools each block before asking for the next (its bytes are read
    again then: one that shrank but stayed, quantized, comes again after its tenant's others),
    and stops when the tier fits."""
    usage: collections.Counter[str] = collections.Counter()
    queues: dict[str, collections.deque[Block]] = {}
    for block in sorted(held, key=value):
        usage[block.tenant] += nbytes(block)
        if block.pins == 0:
            queues.setdefault(block.tenant, collections.deque()).append(block)
    while queues:
        tenant = max(queues, key=lambda t: (usage[t], t))
        block = queues[tenant].popleft()
        if not queues[tenant]:
            del queues[tenant]
        before = nbytes(block)
        yield block
        usage[tenant] -= before - nbytes(block)
        if 0 < nbytes(block) < before:
            queues.setdefault(tenant, collections.deque()).append(block)

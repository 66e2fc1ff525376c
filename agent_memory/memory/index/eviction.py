"""Evictor, which keeps the store's tiers within their budgets (the store calls it, under its
lock, after each change): Pensieve's retention value, recompute cost per byte over idle time, so
an idle agent's cheap early blocks leave first; a block a running sequence uses never leaves.
Over the hot budget an exact block is quantized first, a quantized one leaves memory; over the
disk budget a block's warm copy goes (it becomes COLD: its tokens are kept, its KV is recomputed).

Tenants share both budgets fairly: each next block to cool is the least valuable of the tenant
holding the most bytes of that tier (`fair_order`), so eviction levels the largest holders down,
and a tenant holding no more than its fair share (the budget over the tenants holding any) loses
nothing while another tenant holds more than it and has anything evictable. A block a client
asked to keep (keep.py) goes after every block not so kept, until its keep-until passes."""

from __future__ import annotations

import collections
import time
from collections.abc import Callable
from typing import Any

from agent_memory.agent_key import UNNAMED
from agent_memory.cache_miss import EVICTED_DISK, EVICTED_HOT
from agent_memory.fair_share import fair_order
from agent_memory.memory.index.blocks import Block, BlockPool, Tier
from agent_memory.memory.warm.tier import WarmTier

# Quantize an exact block's KV to the hot tier's rest precision: payload -> (payload, nbytes).
KVDemoter = Callable[[Any], tuple[Any, int]]
# Reloading a block from disk costs this fraction of recomputing it.
DISK_RELOAD_COST = 0.05
# What an unnamed one-off (a request no later one continued) adds to its blocks' retention, where
# an agent or a conversation that came back adds 1: among equally idle blocks its go first.
ONE_OFF_WEIGHT = 0.25


def retention_weight(kind: str, turns: int) -> float:
    """What an agent's reference adds to the retention value of each block it holds."""
    return ONE_OFF_WEIGHT if kind == UNNAMED and turns < 2 else 1.0


class Evictor:
    def __init__(
        self,
        pool: BlockPool,
        *,
        hot_budget_bytes: int,
        disk_budget_bytes: int,
        attention_tokens: float,
        demote: KVDemoter | None,
        warm: WarmTier | None,
        drop_if_unused: Callable[[Block], None],
        moves: collections.Counter[tuple[str, str, str]],
        cooled: Callable[[], None] = lambda: None,
    ) -> None:
        """pool: the store's blocks; attention_tokens: the context length at which a token's
        attention costs as much as its matmuls; demote: how an exact hot block cools to the
        rest precision (None: it leaves memory); warm: the tier whose copies the disk budget
        bounds (a shared one bounds itself); drop_if_unused: the index's way to let a block
        nobody holds go; moves: the store's count of blocks cooled, by (from, to, reason);
        cooled: called once blocks went COLD for good (over the disk budget, or the hot one with no
        warm tier): the index lets unnamed one-offs go with them."""
        self.pool = pool
        self.hot_budget_bytes = hot_budget_bytes
        self.disk_budget_bytes = disk_budget_bytes
        self.attention_tokens = attention_tokens
        self.demote = demote
        self.warm = warm
        self.shared = warm is not None and warm.shared
        self.drop_if_unused = drop_if_unused
        self.moves = moves
        self.cooled = cooled

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
        return cost * (1 + block.weight) / (max(nbytes, 1) * idle)

    def evict_hot(self) -> None:
        """Over the hot budget, the blocks worth least per byte cool a step each: an exact
        block is quantized (it stays hot, several times smaller), a quantized one leaves
        memory (WARM with a file, else COLD)."""
        if self.pool.hot_bytes <= self.hot_budget_bytes:
            return
        now, wall, went_cold = time.monotonic(), time.time(), False
        held = self.pool.in_tier(Tier.HOT)
        for block in fair_order(
            held,
            lambda b: b.hot_bytes,
            lambda b: (b.keep_until > wall, self.retention_value(b, now, b.hot_bytes, bool(b.disk_bytes))),
            unpinned,
        ):
            if self.pool.hot_bytes <= self.hot_budget_bytes:
                break
            if block.exact and self.demote is not None:
                self.pool.set_payload(block, *self.demote(block.payload))
                self.moves["hot_exact", "hot_quantized", "hot_budget"] += 1
                continue
            self.pool.drop_payload(block)
            if block.tier is Tier.COLD:
                block.cooled_by = EVICTED_HOT
                went_cold = True
            self.drop_if_unused(block)
            self.moves["hot", block.tier.value if block.hash in self.pool else "gone", "hot_budget"] += 1
        if went_cold and self.warm is None:  # with a warm tier, a block written meanwhile is WARM again
            self.cooled()

    def evict_disk(self) -> None:
        if self.shared or self.pool.disk_bytes <= self.disk_budget_bytes:
            return  # a shared tier is bounded by its own maxmemory (warm/redis/backend.py)
        now, wall, went_cold = time.monotonic(), time.time(), False
        held = [b for b in self.pool.blocks.values() if b.disk_bytes]
        value = lambda b: (b.keep_on_disk_until > wall, self.retention_value(b, now, b.disk_bytes, False))  # noqa: E731
        for block in fair_order(held, lambda b: b.disk_bytes, value, unpinned):
            if self.pool.disk_bytes <= self.disk_budget_bytes:
                break
            self.warm.delete_block(block.hash)
            self.pool.drop_disk(block)  # agents still refer to it: it becomes COLD, not gone
            if block.tier is Tier.COLD:
                block.cooled_by = EVICTED_DISK
                went_cold = True
            self.moves["warm", block.tier.value, "disk_budget"] += 1
        if went_cold:
            self.cooled()

    # -- what the API shows ----------------------------------------------------------------

    def totals(self, tenant: str | None) -> dict[str, int]:
        """The memory's figures against the budgets (the caller holds the store's lock): every
        tenant's (None), or one tenant's."""
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
            "disk_budget_bytes": self.disk_budget(),
            **{f"{t.value}_blocks": n for t, n in by_tier.items()},
            "snapshots": len(held),
            "snapshot_hot_bytes": snapshot_hot,
            "snapshot_disk_bytes": sum(s.disk_bytes for s in held),
        }

    def disk_budget(self) -> int:
        """What the warm tier may hold: this server's budget, or a shared tier's maxmemory."""
        if self.warm is None:
            return 0
        return (self.warm.usage.limit_bytes or 0) if self.shared else self.disk_budget_bytes


def unpinned(block: Block) -> bool:
    """A block no running sequence and no pinned agent uses: one eviction may move."""
    return block.pins == 0 and block.held == 0

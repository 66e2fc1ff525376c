"""AgentCacheStore: each agent's latest sequence, the blocks behind it, and the hot budget.

The engine thread calls `lookup` before a prefill and `commit` when a prefill ends (the prompt,
offered for reuse) and when the sequence ends (prompt and reply); HTTP handlers read
`agents()` under the same lock. Eviction follows Pensieve's retention value:
recompute cost per byte over idle time, so an idle agent's cheap early blocks leave first, and
a block a running sequence uses never leaves. Which agent uses which block is agents.py's
(`AgentIndex`, the store's base). With a warm tier (see `warm`), an agent's block gains a copy
there once it is durable, and is WARM when it leaves memory.

With a shared warm tier (several servers on one Redis: `warm.shared`), the store holds what
this server has seen: agents are not restored at start but probed when a request arrives
(shared_sync.py), the store evicts nothing from the shared tier (Redis does, under its
maxmemory), and a block this server stops using is forgotten here, not deleted there (manifests
count the references: memory/warm/redis_backend.py).
"""

from __future__ import annotations

import collections
import secrets
import time
from collections.abc import Callable, Sequence
from concurrent.futures import Future
from typing import Any

from agent_memory.agent_key import AgentKey
from agent_memory.memory.index.agents import AgentIndex
from agent_memory.memory.index.blocks import Block, Tier
from agent_memory.memory.index.prefix import PrefixMatcher
from agent_memory.memory.index.shared_sync import SharedTierSync
from agent_memory.memory.index.store_records import Lease, Persist, Segment
from agent_memory.memory.warm.records import BlockRecord, Manifest
from agent_memory.memory.warm.scan import FolderScan
from agent_memory.memory.warm.tier import WarmTier

# Cut one block's KV out of a finished sequence: (start, end) -> (payload, nbytes, exact).
KVCutter = Callable[[int, int], tuple[Any, int, bool]]
# Quantize an exact block's KV to the hot tier's rest precision: payload -> (payload, nbytes).
KVDemoter = Callable[[Any], tuple[Any, int]]

# Reloading a block from disk costs this fraction of recomputing it.
DISK_RELOAD_COST = 0.05


class AgentCacheStore(AgentIndex):
    def __init__(
        self,
        *,
        block_tokens: int,
        salt: str,
        hot_budget_bytes: int,
        attention_tokens: float,
        warm: WarmTier | None = None,
        disk_budget_bytes: int = 0,
        demote: KVDemoter | None = None,
    ) -> None:
        """demote: how an exact hot block cools to the rest precision (None: hot blocks have
        one precision and leave memory when they cool)."""
        super().__init__(block_tokens=block_tokens, salt=salt, warm=warm)
        self.demote = demote
        # Blocks that cooled or left, by (from tier, to tier, reason): read by /metrics.
        self.moves: collections.Counter[tuple[str, str, str]] = collections.Counter()
        self.prefix = PrefixMatcher(self.pool, self.names)
        self.hot_budget_bytes = hot_budget_bytes
        # Context length at which a token's attention costs as much as its matmuls.
        self.attention_tokens = attention_tokens
        self.disk_budget_bytes = disk_budget_bytes
        self.sync = SharedTierSync(self, warm) if self.shared else None
        if warm is not None:
            warm.on_saved = self._block_saved
            warm.still_used = self._still_used
            if self.sync is not None:
                warm.on_manifest = self.sync.manifest_written
            if warm.budget_bytes is not None:  # what its disk can hold (memory/warm/opening.py)
                self.disk_budget_bytes = min(disk_budget_bytes, warm.budget_bytes)

    # -- the request path ---------------------------------------------------------------

    def lookup(self, tokens: Sequence[int], root: str | None = None) -> Lease:
        """Plan the longest reusable prefix of `tokens` in a namespace and pin its blocks."""
        with self.lock:
            if self.sync is not None:
                self.sync.apply()
            segments, blocks, pos = [], [], 0
            for block, n in self.prefix.match(tokens, root):
                usable = block is not None and block.tier is not Tier.COLD
                if usable:
                    block.pins += 1
                    block.last_used = time.monotonic()
                    blocks.append(block)
                if not usable and segments and segments[-1].block is None:
                    segments[-1].end += n
                else:
                    segments.append(Segment(pos, pos + n, block if usable else None))
                pos += n
            return Lease(segments, blocks)

    def release(self, lease: Lease) -> None:
        with self.lock:
            for block in lease.blocks:
                block.pins -= 1
                self._drop_if_unused(block)
            lease.blocks = []
            self._evict_hot()

    def commit(self, agent: AgentKey | None, tokens: Sequence[int], cut: KVCutter, root: str | None = None) -> Persist:
        """Store a sequence's tokens (a finished one after releasing its lease): its blocks become
        hot and the agent points at it. Returns what the caller should write to the warm tier."""
        with self.lock:
            now = time.monotonic()
            blocks = []
            for h, parent, start, end in self.names.chain(tokens, root):
                block = self.pool.get(h) or self.pool.add(
                    Block(h, parent, tuple(tokens[start:end]), start)
                )
                block.last_used = now
                # A block another running sequence pinned outside memory stays there: made hot
                # now, it could not be evicted until that sequence ends.
                if block.tier is not Tier.HOT and not block.pins:
                    self.pool.set_payload(block, *cut(start, end))
                blocks.append(block)
            persist = Persist()
            if agent is not None:
                self.point_agent(agent, list(tokens), blocks, root)
                if self.warm is not None:
                    persist.blocks = [
                        (BlockRecord(b.hash, b.parent, b.start, b.tokens), b.payload)
                        for b in blocks
                        if b.tier is Tier.HOT and not b.disk_bytes
                    ]
                    record = self.agents[agent]
                    persist.manifest = Manifest(
                        agent, self.warm.fingerprint, record.tokens, record.blocks, record.last_used, root=root
                    )
                    if self.shared:
                        persist.base, record.etag = record.etag, secrets.token_hex(8)
                        persist.etag = record.etag
            self._evict_hot()
            return persist

    # -- the warm tier --------------------------------------------------------------------

    def _block_saved(self, block_hash: str, nbytes: int) -> None:
        """The writer made a block durable; it counts as warm unless nobody wants it now."""
        with self.lock:
            block = self.pool.get(block_hash)
            if block is None or not block.refs:
                if not self.shared:  # a shared tier's blocks are other servers' too
                    self.warm.delete_block(block_hash)
                return
            self.pool.set_disk(block, nbytes)
            self._evict_disk()

    def warm_lost(self, block: Block) -> None:
        """A block's warm copy could not be read back: it is recomputed from now on."""
        with self.lock:
            self.pool.drop_disk(block)
            self._drop_if_unused(block)
            self.moves["warm", "cold", "unreadable"] += 1

    def restore(self, scan: FolderScan) -> None:
        """Rebuild agents from their manifests at start: blocks with a file are WARM, the rest
        COLD; files no manifest names are deleted."""
        with self.lock:
            now_wall, now = time.time(), time.monotonic()
            for manifest in scan.manifests:
                # Every check comes before the first change to the pool, so a bad manifest is
                # quarantined whole and the others still load (Manifest.read has already
                # refused token ids the hash chain cannot pack).
                chain = self.names.chain(manifest.tokens, manifest.root)
                if [h for h, *_ in chain] != manifest.blocks:
                    self.warm.quarantine_manifest(manifest, "its block hashes do not match its tokens")
                    continue
                last_used = now - max(0.0, now_wall - manifest.last_used)
                blocks = []
                for h, parent, start, end in chain:
                    block = self.pool.get(h) or self.pool.add(
                        Block(h, parent, tuple(manifest.tokens[start:end]), start, last_used=last_used)
                    )
                    block.last_used = max(block.last_used, last_used)
                    if h in scan.blocks and not block.disk_bytes:
                        self.pool.set_disk(block, scan.blocks[h].size)
                    blocks.append(block)
                self.point_agent(manifest.key, manifest.tokens, blocks, manifest.root)
                self.agents[manifest.key].last_used = manifest.last_used
            for h in scan.blocks:
                if h not in self.pool:
                    self.warm.delete_block(h)
            self._evict_disk()

    def _still_used(self, hashes: list[str]) -> set[str]:
        with self.lock:
            return {h for h in hashes if (b := self.pool.get(h)) is not None and (b.refs or b.pins)}

    # -- agents -------------------------------------------------------------------------

    def end_agent(self, agent: AgentKey) -> bool | Future:
        """Forget an agent: every block only it held leaves every tier. With a shared tier,
        its manifest there goes too, and blocks no other manifest names; an agent this server
        does not hold is looked for there only (a Future of whether it was there)."""
        with self.lock:
            held = self.forget(agent)
            if self.warm is None or not (held or self.shared):
                return held
            ended = self.warm.delete_agent(agent)
            return True if held else ended

    def totals(self) -> dict[str, int]:
        with self.lock:
            by_tier = {t: 0 for t in Tier}
            for block in self.pool.blocks.values():
                by_tier[block.tier] += 1
            return {
                "hot_bytes": self.pool.hot_bytes,
                "hot_exact_bytes": self.pool.exact_bytes,
                "hot_quantized_bytes": self.pool.hot_bytes - self.pool.exact_bytes,
                "hot_budget_bytes": self.hot_budget_bytes,
                "disk_bytes": self.pool.disk_bytes,
                "disk_budget_bytes": self._disk_budget(),
                **{f"{t.value}_blocks": n for t, n in by_tier.items()},
                **self.counts(),
            }

    def _disk_budget(self) -> int:
        if self.warm is None:
            return 0
        return (self.warm.usage.limit_bytes or 0) if self.shared else self.disk_budget_bytes

    # -- eviction -----------------------------------------------------------------------

    def retention_value(self, block: Block, now: float, nbytes: int, on_disk: bool) -> float:
        """What keeping the block saves, per byte per idle second; the lowest leaves first.

        The saving is the cost of getting its KV back otherwise: recompute (attention makes
        later positions dearer) or, with a disk copy, a fraction of that to reload it.
        """
        n = len(block.tokens)
        cost = n * (1.0 + (block.start + n / 2) / self.attention_tokens)
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

"""AgentCacheStore: each agent's latest sequence, the blocks behind it, and the hot budget.

The engine thread calls `lookup` before a prefill and `commit` when a prefill ends (the prompt,
offered for reuse) and when the sequence ends (prompt and reply); HTTP handlers read
`agents()` under the same lock. Eviction follows Pensieve's retention value:
recompute cost per byte over idle time, so an idle agent's cheap early blocks leave first, and
a block a running sequence uses never leaves. A block nobody refers to stays only while hot;
with a disk tier (see `disk`), an agent's block gains a file once it is durable, and is WARM
when it leaves memory.

With a shared warm tier (several servers on one Redis: `disk.shared`), the store holds what
this server has seen: agents are not restored at start but probed when a request arrives
(shared_sync.py), the store evicts nothing
from the shared tier (Redis does, under its maxmemory), and a block this server stops using
is forgotten here, not deleted there (manifests count the references: redis_store.py).
"""

from __future__ import annotations

import collections
import logging
import secrets
import threading
import time
from collections.abc import Callable, Sequence
from concurrent.futures import Future
from typing import Any

from agent_memory.agent_key import AgentKey
from agent_memory.memory.blocks import Block, BlockPool, Tier
from agent_memory.memory.disk import BlockRecord, DiskTier
from agent_memory.memory.folder import FolderScan
from agent_memory.memory.hashing import BlockNames
from agent_memory.memory.prefix import PrefixMatcher, common_prefix
from agent_memory.memory.records import Manifest
from agent_memory.memory.shared_sync import SharedTierSync
from agent_memory.memory.store_records import AgentInfo, AgentRecord, Lease, Persist, Segment

log = logging.getLogger(__name__)

# Cut one block's KV out of a finished sequence: (start, end) -> (payload, nbytes, exact).
KVCutter = Callable[[int, int], tuple[Any, int, bool]]
# Quantize an exact block's KV to the hot tier's rest precision: payload -> (payload, nbytes).
KVDemoter = Callable[[Any], tuple[Any, int]]

# Reloading a block from disk costs this fraction of recomputing it.
DISK_RELOAD_COST = 0.05


class AgentCacheStore:
    def __init__(
        self,
        *,
        block_tokens: int,
        salt: str,
        hot_budget_bytes: int,
        attention_tokens: float,
        disk: DiskTier | None = None,
        disk_budget_bytes: int = 0,
        demote: KVDemoter | None = None,
    ) -> None:
        """demote: how an exact hot block cools to the rest precision (None: hot blocks have
        one precision and leave memory when they cool)."""
        self.lock = threading.RLock()
        self.demote = demote
        # Blocks that cooled or left, by (from tier, to tier, reason): read by /metrics.
        self.moves: collections.Counter[tuple[str, str, str]] = collections.Counter()
        self.pool = BlockPool()
        self.names = BlockNames(salt, block_tokens)
        self.prefix = PrefixMatcher(self.pool, self.names)
        self.agents: dict[AgentKey, AgentRecord] = {}
        self.hot_budget_bytes = hot_budget_bytes
        # Context length at which a token's attention costs as much as its matmuls.
        self.attention_tokens = attention_tokens
        self.disk = disk
        self.disk_budget_bytes = disk_budget_bytes
        self.shared = disk is not None and disk.shared
        self.sync = SharedTierSync(self) if self.shared else None
        if disk is not None:
            disk.on_saved = self._block_saved
            disk.still_used = self._still_used
            if self.sync is not None:
                disk.on_manifest = self.sync.manifest_written
            if disk.budget_bytes is not None:  # what its disk can hold (engine/warm.py)
                self.disk_budget_bytes = min(disk_budget_bytes, disk.budget_bytes)

    # -- the request path ---------------------------------------------------------------

    def known_prefix(self, agent: AgentKey | None, tokens: Sequence[int]) -> int:
        """How much of `tokens` the agent's own last sequence covers: a cheap guess at what is
        cached, for ordering work (the lookup proper comes later, when the work starts)."""
        with self.lock:
            record = self.agents.get(agent) if agent is not None else None
            return common_prefix(record.tokens, tokens) if record is not None else 0

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
        hot and the agent points at it. Returns what the caller should write to the disk tier."""
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
                if self.disk is not None:
                    persist.blocks = [
                        (BlockRecord(b.hash, b.parent, b.start, b.tokens), b.payload)
                        for b in blocks
                        if b.tier is Tier.HOT and not b.disk_bytes
                    ]
                    record = self.agents[agent]
                    persist.manifest = Manifest(
                        agent.id,
                        self.disk.fingerprint,
                        record.tokens,
                        record.blocks,
                        record.last_used,
                        tenant=agent.tenant,
                        root=root,
                        kind=agent.kind,
                    )
                    if self.shared:
                        persist.base, record.etag = record.etag, secrets.token_hex(8)
                        persist.etag = record.etag
            self._evict_hot()
            return persist

    def point_agent(self, agent: AgentKey, tokens: list[int], blocks: list[Block], root: str | None) -> None:
        for block in blocks:
            block.refs += 1
        old = self.agents.get(agent)
        self.agents[agent] = AgentRecord(tokens, [b.hash for b in blocks], root)
        if old is not None:
            self.agents[agent].etag, self.agents[agent].stored = old.etag, old.stored
            self._unref(old.blocks)

    # -- the disk tier --------------------------------------------------------------------

    def _block_saved(self, block_hash: str, nbytes: int) -> None:
        """The writer made a block durable; it counts as on disk unless nobody wants it now."""
        with self.lock:
            block = self.pool.get(block_hash)
            if block is None or not block.refs:
                if not self.shared:  # a shared tier's blocks are other servers' too
                    self.disk.delete_block(block_hash)
                return
            self.pool.set_disk(block, nbytes)
            self._evict_disk()

    def disk_lost(self, block: Block) -> None:
        """A block's file could not be read back: it is recomputed from now on."""
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
                    self.disk.quarantine_manifest(manifest, "its block hashes do not match its tokens")
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
                    self.disk.delete_block(h)
            self._evict_disk()

    def _still_used(self, hashes: list[str]) -> set[str]:
        with self.lock:
            return {h for h in hashes if (b := self.pool.get(h)) is not None and (b.refs or b.pins)}

    def forget(self, agent: AgentKey) -> bool:
        """Drop an agent here only (the shared tier no longer has it); whether it was here."""
        record = self.agents.pop(agent, None)
        if record is not None:
            self._unref(record.blocks)
        return record is not None

    # -- agents -------------------------------------------------------------------------

    def end_agent(self, agent: AgentKey) -> bool | Future:
        """Forget an agent: every block only it held leaves every tier. With a shared tier,
        its manifest there goes too, and blocks no other manifest names; an agent this server
        does not hold is looked for there only (a Future of whether it was there)."""
        with self.lock:
            held = self.forget(agent)
            if self.disk is None or not (held or self.shared):
                return held
            ended = self.disk.delete_agent(agent)
            return True if held else ended

    def agent_info(self, agent: AgentKey) -> AgentInfo | None:
        with self.lock:
            record = self.agents.get(agent)
            if record is None:
                return None
            blocks = [self.pool.blocks[h] for h in record.blocks]
            by_tier = {t.value: 0 for t in Tier}
            for b in blocks:
                by_tier[b.tier.value] += 1
            return AgentInfo(
                id=agent.id,
                tokens=len(record.tokens),
                blocks=by_tier,
                hot_bytes=sum(b.hot_bytes for b in blocks),
                exact_bytes=sum(b.hot_bytes for b in blocks if b.exact),
                disk_bytes=sum(b.disk_bytes for b in blocks),
                last_used=record.last_used,
            )

    def all_agents(self, tenant: str | None = "") -> list[AgentInfo]:
        """A tenant's agents (None: every tenant's); stored responses are not agents."""
        with self.lock:
            return [
                self.agent_info(a)
                for a in sorted(self.agents)
                if (tenant is None or a.tenant == tenant) and a.kind == "agent"
            ]

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
            }

    def _disk_budget(self) -> int:
        if self.disk is None:
            return 0
        return (self.disk.usage.limit_bytes or 0) if self.shared else self.disk_budget_bytes

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
            return  # a shared tier is bounded by its own maxmemory (redis_store.py)
        now = time.monotonic()
        candidates = [b for b in self.pool.blocks.values() if b.disk_bytes and b.pins == 0]
        candidates.sort(key=lambda b: self.retention_value(b, now, b.disk_bytes, False))
        for block in candidates:
            if self.pool.disk_bytes <= self.disk_budget_bytes:
                break
            self.disk.delete_block(block.hash)
            self.pool.drop_disk(block)  # agents still refer to it: it becomes COLD, not gone
            self.moves["warm", block.tier.value, "disk_budget"] += 1

    def _unref(self, hashes: Sequence[str]) -> None:
        """Drop an agent's references. Blocks it alone held and no longer uses go at once: a
        superseded tail, the end of a reply that re-tokenized differently, an abandoned branch.
        Kept, they would be memory that no request of the agent's can reach any more."""
        for h in hashes:
            block = self.pool.blocks[h]
            block.refs -= 1
            self._drop_if_unused(block, forget=True)

    def _drop_if_unused(self, block: Block, forget: bool = False) -> None:
        """A block no agent refers to lives on only in memory, for anonymous reuse."""
        if block.refs or block.pins:
            return
        if block.disk_bytes:
            if not self.shared:  # other servers' agents may name it: manifests count them there
                self.disk.delete_block(block.hash)
            self.pool.drop_disk(block)
        if forget or block.tier is not Tier.HOT:
            self.pool.remove(block)

"""AgentCacheStore: each agent's latest sequence, the blocks behind it, and the hot budget.

The engine thread calls `lookup` before a prefill, `commit` when a prefill ends (the prompt) and
when the sequence ends (prompt and reply); HTTP handlers read `agents()` under the same lock. Which agent uses which block is agents.py's (`AgentIndex`, the
store's base); after each change the store calls its `Evictor` (eviction.py). With a warm tier,
an agent's block gains a copy there once durable, and is WARM when it leaves memory.

With a shared warm tier (several servers on one Redis: `warm.shared`), agents are probed when
a request arrives (shared_sync.py), not restored at start; Redis evicts under its maxmemory, and
a block this server stops using is forgotten here, not deleted there (memory/warm/redis/).
"""

from __future__ import annotations

import collections
import time
from collections.abc import Callable, Sequence
from concurrent.futures import Future
from typing import Any

from agent_memory.agent_key import AgentKey
from agent_memory.cache_miss import UNREADABLE
from agent_memory.memory.hashing import SpanKey, covering
from agent_memory.memory.index import pins, snapshots
from agent_memory.memory.index.agents import AgentIndex
from agent_memory.memory.index.blocks import Block, Tier
from agent_memory.memory.index.eviction import Evictor, KVDemoter
from agent_memory.memory.index.prefix import PrefixMatcher
from agent_memory.memory.index.shared_sync import SharedTierSync
from agent_memory.memory.index.store_records import Lease, Persist, Segment, Turn
from agent_memory.memory.warm.scan import FolderScan
from agent_memory.memory.warm.tier import WarmTier

# Cut one block's KV out of a finished sequence: (start, end) -> (payload, nbytes, exact).
KVCutter = Callable[[int, int], tuple[Any, int, bool]]
# Take the snapshot of a sequence's state layers where its cache ends: () -> (payload, nbytes).
SnapshotTaker = Callable[[], tuple[Any, int]]

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
        state_layers: bool = False,
    ) -> None:
        """demote: how an exact hot block cools to the rest precision (None: hot blocks have
        one precision and leave memory when they cool); state_layers: the model has window or
        recurrent layers, so a prompt resumes only at a snapshot (snapshots.py)."""
        super().__init__(block_tokens=block_tokens, salt=salt, warm=warm)
        self.state_layers = state_layers
        # Blocks that cooled or left, by (from tier, to tier, reason): read by /metrics.
        self.moves: collections.Counter[tuple[str, str, str]] = collections.Counter()
        self.prefix = PrefixMatcher(self.pool, self.names)
        if warm is not None and warm.budget_bytes is not None:  # what its disk can hold (memory/warm/opening.py)
            disk_budget_bytes = min(disk_budget_bytes, warm.budget_bytes)
        self.evictor = Evictor(
            self.pool,
            hot_budget_bytes=hot_budget_bytes,
            disk_budget_bytes=disk_budget_bytes,
            attention_tokens=attention_tokens,
            demote=demote,
            warm=warm,
            drop_if_unused=self.drop_if_unused,
            moves=self.moves,
            cooled=self.drop_cold_one_offs,
        )
        self.sync = SharedTierSync(self, warm) if self.shared else None

    hot_budget_bytes = property(lambda self: self.evictor.hot_budget_bytes)
    disk_budget_bytes = property(lambda self: self.evictor.disk_budget_bytes)

    def set_hot_budget(self, nbytes: int) -> None:
        """A new share of the memory limit (engine/loading/residency.py): over it, blocks cool now."""
        with self.lock:
            self.evictor.hot_budget_bytes = nbytes
            self.evictor.evict_hot()

    def totals(self, tenant: str | None = None) -> dict[str, int]:
        """The memory's figures against the budgets: every tenant's (None), or one tenant's."""
        with self.lock:
            return {**self.evictor.totals(tenant), **self.counts(tenant)}

    # -- the request path ---------------------------------------------------------------

    def lookup(self, tokens: Sequence[int], root: str | None = None, extras: Sequence[SpanKey] = ()) -> Lease:
        """Plan the longest reusable prefix of `tokens` in a namespace and pin its blocks;
        `extras`: what fixes their KV beyond their ids (memory/hashing.py)."""
        with self.lock:
            if self.sync is not None:
                self.sync.apply()
            if self.state_layers:
                return self._lookup_resumable(tokens, root, extras)
            segments, blocks, pos = [], [], 0
            for block, n in self.prefix.match(tokens, root, extras):
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

    def _lookup_resumable(self, tokens: Sequence[int], root: str | None, extras: Sequence[SpanKey]) -> Lease:
        """With state layers: blocks from the start without a gap, up to the latest snapshot
        along them (a gap could not be recomputed without the state before it)."""
        entries = self.prefix.match(tokens, root, extras)
        usable = 0
        for block, n in entries:
            if block is None or block.tier is Tier.COLD:
                break
            usable += n
        snapshot = snapshots.find(self.pool, self.names, tokens, root, usable, extras)
        end = snapshot.start if snapshot is not None else 0
        segments, blocks, pos = [], [], 0
        for block, n in entries:
            if pos >= end:
                break
            segments.append(Segment(pos, pos + min(n, end - pos), block))
            blocks.append(block)
            pos = segments[-1].end
        held = [*blocks, *([snapshot] if snapshot is not None else [])]
        for block in held:
            block.pins += 1
            block.last_used = time.monotonic()
        return Lease(segments, held, snapshot, matched=sum(n for _, n in entries))

    def let_go(self, snapshots: Sequence[str]) -> None:
        """Unpin the snapshots a sequence took anonymously (see `commit`), now it has ended."""
        with self.lock:
            for h in snapshots:
                block = self.pool.blocks[h]
                block.pins -= 1
                self.drop_if_unused(block)
            self.evictor.evict_hot()

    def release(self, lease: Lease) -> None:
        with self.lock:
            for block in lease.blocks:
                block.pins -= 1
                self.drop_if_unused(block)
            lease.blocks = []
            self.evictor.evict_hot()

    def commit(
        self,
        agent: AgentKey | None,
        tokens: Sequence[int],
        cut: KVCutter,
        root: str | None = None,
        snapshot: SnapshotTaker | None = None,
        made: Sequence[str] = (),
        tenant: str = "",
        extras: Sequence[SpanKey] = (),
        role: str = snapshots.TURN_END,
        resumed: str | None = None,
    ) -> Persist:
        """Store a sequence's tokens (a finished one after releasing its lease): its blocks become
        hot and the agent points at it. `snapshot`: take one where the tokens end (taken for no
        agent, it stays pinned for the running sequence's own commit until `let_go`), kept by the
        agent as `role` (snapshots.py); `made`: the snapshots the sequence took on its way, for
        the agent to keep; `resumed`: the snapshot its turn resumed from; `tenant`: whose request
        it is (its blocks count against that tenant's share of the budgets: eviction.py);
        `extras`: what fixes their KV beyond their ids (memory/hashing.py).
        Returns what the caller should write to the warm tier."""
        with self.lock:
            now = time.monotonic()
            blocks = []
            extras = tuple(sorted(extras))
            chain = self.names.chain(tokens, root, extras)
            for h, parent, start, end in chain:
                block = self.pool.get(h) or self.pool.add(Block(h, parent, tuple(tokens[start:end]), start))
                block.extras = covering(extras, start, end)  # the same name: the same extras
                block.last_used, block.tenant = now, tenant
                # A block another running sequence pinned outside memory stays there: made hot
                # now, it could not be evicted until that sequence ends.
                if block.tier is not Tier.HOT and not block.pins:
                    self.pool.set_payload(block, *cut(start, end))
                blocks.append(block)
            persist = Persist()
            if snapshot is not None and blocks:
                taken = snapshots.get_or_add(self.pool, self.names, blocks[-1].hash, len(tokens))
                taken.last_used, taken.tenant = now, tenant
                if taken.tier is not Tier.HOT and not taken.pins:
                    self.pool.set_payload(taken, *snapshot())
                taken.pins += agent is None
                persist.snapshot = taken.hash
            if agent is not None:
                old = self.agents.get(agent)
                roles = snapshots.assign(old.roles if old is not None else {}, resumed, role, persist.snapshot)
                named = [*(old.snapshots if old is not None else ()), *made, *filter(None, [resumed, persist.snapshot])]
                along = snapshots.along(self.pool, self.names, chain, tokens, named, extras)
                kept, roles = snapshots.choose(along, roles)
                turn = self.started(agent, len(tokens)) if role == snapshots.TURN_START else None
                self.point_agent(agent, list(tokens), blocks, root, kept, extras, roles, turn)
                if self.warm is not None:
                    persist.blocks = self.pool.to_write([*blocks, *kept])
                    persist.manifest, persist.base, persist.etag = self.manifest(agent)
            self.evictor.evict_hot()
            return persist

    # -- the warm tier --------------------------------------------------------------------

    def block_saved(self, block_hash: str, nbytes: int) -> None:
        """The writer made a block durable (tier_events.py): warm, unless nobody wants it now."""
        with self.lock:
            block = self.pool.get(block_hash)
            if block is None or not block.refs:
                if not self.shared:  # a shared tier's blocks are other servers' too
                    self.warm.delete_block(block_hash)
                return
            self.pool.set_disk(block, nbytes)
            self.evictor.evict_disk()

    def warm_lost(self, block: Block) -> None:
        """A block's warm copy could not be read back: it is recomputed from now on."""
        with self.lock:
            self.pool.drop_disk(block)
            block.cooled_by = UNREADABLE
            self.drop_if_unused(block)
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
                chain = self.names.chain(manifest.tokens, manifest.root, manifest.extras)
                if [h for h, *_ in chain] != manifest.blocks:
                    self.warm.quarantine_manifest(manifest, "its block hashes do not match its tokens")
                    continue
                last_used = now - max(0.0, now_wall - manifest.last_used)
                blocks = []
                for h, parent, start, end in chain:
                    block = self.pool.get(h) or self.pool.add(
                        Block(h, parent, tuple(manifest.tokens[start:end]), start, last_used=last_used,
                              extras=covering(manifest.extras, start, end))
                    )
                    block.last_used, block.tenant = max(block.last_used, last_used), manifest.key.tenant
                    if h in scan.blocks and not block.disk_bytes:
                        self.pool.set_disk(block, scan.blocks[h].size)
                    blocks.append(block)
                kept = []
                for position, h in manifest.snapshots:  # a snapshot whose file is gone is simply not kept
                    prefix = self.names.prefix_name(chain, manifest.tokens, position, manifest.extras)
                    if h in scan.blocks and h == self.names.snapshot_name(prefix):
                        kept.append(snapshots.get_or_add(self.pool, self.names, prefix, position))
                        kept[-1].tenant = manifest.key.tenant
                        if not kept[-1].disk_bytes:
                            self.pool.set_disk(kept[-1], scan.blocks[h].size)
                roles = {r: h for r, h in manifest.roles.items() if h in {s.hash for s in kept}}
                turn = Turn(*manifest.turn)
                self.point_agent(manifest.key, manifest.tokens, blocks, manifest.root, kept, manifest.extras, roles, turn)
                self.agents[manifest.key].last_used = manifest.last_used
            for h in scan.blocks:
                if h not in self.pool:
                    self.warm.delete_block(h)
            pins.restore(self, scan.manifests, self.evictor.hot_budget_bytes)
            self.evictor.evict_disk()

    # -- agents -------------------------------------------------------------------------

    def pin(self, agent: AgentKey, on: bool) -> pins.PinResult:
        """Keep an agent or head against eviction, or no longer (pins.py): refused over the budget."""
        with self.lock:
            result = pins.pin(self, agent, on, self.evictor.hot_budget_bytes)
            self.evictor.evict_hot()  # what an unpin lets go of, over the budget
            return result

    def end_agent(self, agent: AgentKey) -> bool | Future:
        """Forget an agent: every block only it held leaves every tier. With a shared tier,
        its manifest there goes too, and blocks no other manifest names; an agent this server
        does not hold is looked for there only (a Future of whether it was there)."""
        with self.lock:
            held = self.forget(agent)
            self.evictor.evict_hot()  # a pinned agent's blocks, evictable now
            if self.warm is None or not (held or self.shared):
                return held
            ended = self.warm.delete_agent(agent)
            return True if held else ended

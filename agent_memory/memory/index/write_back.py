"""WriteBack: what this server gives back to a shared warm tier that lost it or missed it.

A shared tier can lose what this server wrote there (a Redis restarted without persistence,
FLUSHALL, a failover to a replica that lagged), and it misses what this server could not write
while it was skipped (memory/warm/watch.py). The store still takes a block it wrote as stored
there, so it would never write it again while its agent stays hot, and a later failover would
recompute it. When the tier's watch says it lost its data or answers again (its events: tier_events.py), WriteBack asks it,
on the writer thread, which of the blocks this server takes as stored there are gone (one round
trip per CHUNK), then, on the engine thread (a hot block's KV is MLX), forgets those copies and
queues what the tier lacks: every hot block of an agent this server holds that has no copy
there, and manifests (every agent's after a loss; after a skip, those not written).
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from typing import Any

from agent_memory.memory.index.agents import AgentIndex
from agent_memory.memory.index.blocks import Tier
from agent_memory.memory.warm.format.blockfile import Tensors
from agent_memory.memory.warm.format.records import Manifest
from agent_memory.memory.warm.tier import WarmTier

log = logging.getLogger(__name__)

CHUNK = 1000  # block names asked about per round trip


class WriteBack:
    def __init__(
        self,
        index: AgentIndex,
        tier: WarmTier,
        post: Callable[[Callable[[], None]], None],
        tensors: Callable[[Any], Tensors],
    ) -> None:
        """post: run a call on the engine thread; tensors: a hot block's payload as a block
        file's arrays, at the tier's precision."""
        self.index = index
        self.tier = tier
        self._post = post
        self._tensors = tensors

    def tier_back(self, lost: bool) -> None:
        """On the writer thread: after a loss, which blocks taken as stored there are gone."""
        gone: set[str] = set()
        if lost:
            with self.index.lock:
                stored = [h for h, b in self.index.pool.blocks.items() if b.disk_bytes]
            for start in range(0, len(stored), CHUNK):
                asked = stored[start : start + CHUNK]
                held = self.tier.backend.probe(None, None, asked).sizes
                gone.update(h for h in asked if h not in held)
        self._post(lambda: self.write_back(gone, lost))

    def write_back(self, gone: set[str], lost: bool) -> None:
        """On the engine thread: forget the copies that are gone, queue what the tier lacks."""
        index, tier = self.index, self.tier
        queued: set[str] = set()
        manifests = 0
        with index.lock:
            for h in gone:
                block = index.pool.get(h)
                if block is not None and block.disk_bytes:
                    index.pool.drop_disk(block)
                    index.drop_if_unused(block)
            for agent, record in index.agents.items():
                held = [index.pool.blocks[h] for h in [*record.blocks, *record.snapshots]]
                for b in held:
                    if b.tier is Tier.HOT and not b.disk_bytes and b.hash not in queued:
                        queued.add(b.hash)
                        tier.save_block(b.record(), self._tensors(b.payload))
                if record.etag is not None and (lost or record.etag != record.stored):
                    snapshots = [(b.start, b.hash) for b in held if b.snapshot and b.tier is not Tier.COLD]
                    manifest = Manifest(
                        agent, tier.fingerprint, record.tokens, record.blocks, record.last_used,
                        root=record.root, snapshots=snapshots, extras=record.extras,
                        roles={r: h for r, h in record.roles.items() if h in {s for _, s in snapshots}},
                        pinned=record.pinned,
                    )
                    tier.save_agent(manifest, None if lost else record.stored, record.etag)
                    manifests += 1
        if queued or manifests:
            log.info(
                "writing back %d blocks and %d manifests to the shared warm tier %s",
                len(queued), manifests, tier.location,
            )

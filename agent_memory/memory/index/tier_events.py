"""StoreEvents: the warm tier's events (memory/warm/events.py) delivered to what acts on them,
all named at once when the tier's writer starts: the store (a block made durable, blocks still
used), its shared-tier sync (a manifest's version), the write-back of a shared tier that lost
or missed data, and the trace's record of each write."""

from __future__ import annotations

from collections.abc import Callable

from agent_memory.agent_key import AgentKey
from agent_memory.memory.index.store import AgentCacheStore
from agent_memory.memory.index.write_back import WriteBack


class StoreEvents:
    def __init__(
        self,
        store: AgentCacheStore,
        write_back: WriteBack | None = None,
        traced: Callable[[str, str, float], None] | None = None,
    ) -> None:
        """write_back: with a shared tier, what it lost or missed is written back (None: not
        shared); traced: each write done, for --trace-file (kind, block hash or agent id, start)."""
        self.store = store
        self.write_back = write_back
        self.traced = traced

    def block_saved(self, block_hash: str, nbytes: int) -> None:
        self.store.block_saved(block_hash, nbytes)

    def manifest_written(self, agent: AgentKey, etag: str, ok: bool) -> None:
        if self.store.sync is not None:
            self.store.sync.manifest_written(agent, etag, ok)

    def still_used(self, hashes: list[str]) -> set[str]:
        return self.store.still_used(hashes)

    def written(self, kind: str, subject: str, started: float) -> None:
        if self.traced is not None:
            self.traced(kind, subject, started)

    def tier_back(self, lost: bool) -> None:
        if self.write_back is not None:
            self.write_back.tier_back(lost)

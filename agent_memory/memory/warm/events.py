"""TierEvents: what the warm tier's writer tells whoever keeps the index of its blocks (the
store: memory/index/tier_events.py), given to `WarmTier.start` with the writer thread itself, so
that no event is ever emitted before there is someone to hear it. Every call comes on the writer
thread."""

from __future__ import annotations

from typing import Protocol

from agent_memory.agent_key import AgentKey


class TierEvents(Protocol):
    def block_saved(self, block_hash: str, nbytes: int) -> None:
        """A block's copy is durable now, taking `nbytes` in the backend."""

    def manifest_written(self, agent: AgentKey, etag: str, ok: bool) -> None:
        """A shared backend's manifest write: done as version `etag`, or given way (ok False)."""

    def still_used(self, hashes: list[str]) -> set[str]:
        """Of blocks no manifest in a shared backend names any more, those still used here."""

    def written(self, kind: str, subject: str, started: float) -> None:
        """A save is done, fsyncs included: its job's kind, block hash or agent id, and start."""

    def tier_back(self, lost: bool) -> None:
        """A shared backend answers again after being skipped (False), or lost its data (True)."""

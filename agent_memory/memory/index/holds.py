"""A pin's holds on its record's blocks and snapshots (`Block.held`): what eviction never moves
(pins.py says which records are pinned and why). The caller holds the store's lock."""

from __future__ import annotations

from agent_memory.memory.index.blocks import BlockPool
from agent_memory.memory.index.store_records import AgentRecord


def hold(pool: BlockPool, record: AgentRecord, n: int) -> None:
    """Add n holds (1, -1, or 0) to each block and snapshot of the record."""
    for h in [*record.blocks, *record.snapshots]:
        pool.blocks[h].held += n


def move_hold(pool: BlockPool, old: AgentRecord, new: AgentRecord) -> None:
    """A pinned agent's latest sequence replaced: the pin and its holds go to the new one."""
    if old.pinned:
        new.pinned = old.pinned
        hold(pool, new, 1)
        hold(pool, old, -1)

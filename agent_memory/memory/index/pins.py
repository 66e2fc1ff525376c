"""Pins: agents and shared heads kept against eviction, within the budget.

A pinned record's blocks and snapshots count one `Block.held` each, and eviction moves no held
block in either tier (eviction.py `unpinned`); a pinned agent's next turn moves the hold to its
new blocks (holds.py `move_hold`). Pinned records together may hold at most PINNED_SHARE of the hot
budget, and a tenant at most its fair share of that (the limit over the tenants holding blocks),
so pins cannot starve the rest. A block counts its hot bytes, or its warm copy's where it is not
in memory: what it will take once read back. The pin is kept in the agent's manifest
(`Manifest.pinned`, when it was pinned); at start, pins the budget no longer allows are undone,
the newest first (`restore`), in one log line. The caller holds the store's lock."""

from __future__ import annotations

import logging
import time
from collections.abc import Iterable
from dataclasses import dataclass
from typing import TYPE_CHECKING

from agent_memory.agent_key import AgentKey, shown_id
from agent_memory.memory.index.blocks import Block
from agent_memory.memory.index.holds import hold
from agent_memory.memory.index.store_records import AgentRecord
from agent_memory.memory.warm.format.records import Manifest

if TYPE_CHECKING:  # the index imports this module
    from agent_memory.memory.index.agents import AgentIndex

log = logging.getLogger(__name__)

PINNED_SHARE = 0.5  # of the hot budget, for every pinned record together


@dataclass(frozen=True)
class PinResult:
    found: bool  # whether the store holds the agent
    pinned: bool  # whether it is pinned now
    refused: str | None = None  # why pinning it was refused: the numbers over the budget


def pin(index: AgentIndex, agent: AgentKey, on: bool, hot_budget: int) -> PinResult:
    """Pin (on) or unpin an agent; a pin that would take the pinned bytes over the limit, or its
    tenant over its share, is refused with the numbers. A change is written to its manifest."""
    record = index.agents.get(agent)
    if record is None:
        return PinResult(False, False)
    if bool(record.pinned) == on:
        return PinResult(True, on)
    if on and (why := _over(index, agent, record, hot_budget)) is not None:
        return PinResult(True, False, why)
    hold(index.pool, record, 1 if on else -1)
    record.pinned = time.time() if on else 0.0
    if index.warm is not None:
        index.warm.save_agent(*index.manifest(agent))
    return PinResult(True, on)


def _over(index: AgentIndex, agent: AgentKey, record: AgentRecord, hot_budget: int) -> str | None:
    """Why pinning the record would go over the budget, or None."""
    limit = int(hot_budget * PINNED_SHARE)
    held = [b for b in index.pool.blocks.values() if b.held]
    mine = [index.pool.blocks[h] for h in {*record.blocks, *record.snapshots}]
    need = _bytes(b for b in mine if not b.held)
    pinned = _bytes(held)
    tenants = {b.tenant for b in index.pool.blocks.values()} | {agent.tenant}
    share = limit // len(tenants)
    own = _bytes(b for b in held if b.tenant == agent.tenant)
    what = f"pinning {agent.kind} '{shown_id(agent.id)}' needs {_size(need)}"
    if pinned + need > limit:
        half = f"{PINNED_SHARE:.0%} of the {_size(hot_budget)} hot budget"
        return f"{what}; pinned agents hold {_size(pinned)} of the {_size(limit)} they may ({half})"
    if own + need > share:
        return f"{what}; its tenant's pins hold {_size(own)} of its fair share, {_size(share)} of {_size(limit)}"
    return None


def restore(index: AgentIndex, manifests: Iterable[Manifest], hot_budget: int) -> None:
    """At start: the pins manifests keep, oldest first; those the budget no longer allows (a
    smaller --hot-budget-mb) undone, the newest first, said in one line."""
    undone = []
    for manifest in sorted((m for m in manifests if m.pinned), key=lambda m: m.pinned):
        record = index.agents.get(manifest.key)
        if record is None or record.pinned:
            continue
        if _over(index, manifest.key, record, hot_budget) is not None:
            undone.append(manifest.key)
            if index.warm is not None:
                index.warm.save_agent(*index.manifest(manifest.key))
            continue
        hold(index.pool, record, 1)
        record.pinned = manifest.pinned
    if undone:
        names = ", ".join(f"{k.kind} '{shown_id(k.id)}'" for k in undone)
        log.warning("pins undone at start, over %.0f%% of the hot budget now: %s", PINNED_SHARE * 100, names)


def _bytes(blocks: Iterable[Block]) -> int:
    return sum(b.hot_bytes or b.disk_bytes for b in blocks)


def _size(n: int) -> str:
    """Bytes as people read them: 412 MiB, 24.5 KiB, 300 bytes."""
    for unit, shift in (("GiB", 30), ("MiB", 20), ("KiB", 10)):
        if n >= 1 << shift:
            return f"{n / (1 << shift):,.1f} {unit}".replace(".0 ", " ")
    return f"{n} bytes"

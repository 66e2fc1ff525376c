"""The records the store keeps and hands out: an agent's latest sequence (`AgentRecord`), a
request's plan over cached blocks and the pins behind it (`Segment`, `Lease`), what a commit
asks to be written (`Persist`), and what the API shows of an agent (`AgentInfo`)."""

from __future__ import annotations

import time
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, NamedTuple

from agent_memory.agent_key import AGENT
from agent_memory.cache_miss import Miss
from agent_memory.memory.hashing import SpanKey
from agent_memory.memory.index.blocks import Block
from agent_memory.memory.warm.format.blockfile import Tensors
from agent_memory.memory.warm.format.records import BlockRecord, Manifest
from agent_memory.memory.warm.tier import WarmTier

MISSES_KEPT = 8  # an agent's latest misses kept for /v1/agents/ID


@dataclass
class AgentRecord:
    tokens: list[int]
    blocks: list[str]  # hashes, in order
    root: str | None = None  # the namespace its hash chain starts from (memory/hashing.py)
    last_used: float = field(default_factory=time.time)  # wall clock, for people
    # A shared warm tier's manifest versions: of the latest state here (written or queued),
    # and of the latest known to be in the store. They differ while a write is queued.
    etag: str | None = None
    stored: str | None = None
    snapshots: list[str] = field(default_factory=list)  # the snapshots it keeps, by position
    roles: dict[str, str] = field(default_factory=dict)  # role -> one of them (snapshots.py)
    extras: tuple[SpanKey, ...] = ()  # what fixes its KV beyond its tokens (memory/hashing.py)
    # Its requests' latest misses (cache_miss.py), in memory only: what /v1/agents/ID shows.
    misses: deque[Miss] = field(default_factory=lambda: deque(maxlen=MISSES_KEPT))
    # Until when its memory is kept with priority, hot and on disk (keep.py: prompt_cache_retention).
    keep_until: float = 0.0
    keep_on_disk_until: float = 0.0
    pinned: float = 0.0  # when it was pinned against eviction (wall clock; pins.py), 0: not pinned
    turn_start: int = 0  # the prompt tokens its latest client turn committed before decoding
    turns: int = 0  # its client turns (a resend is not another): an unnamed one-off has one


class Turn(NamedTuple):
    """Where an agent's latest client turn started (its prompt's committed length), and how many
    turns it has had: what conversations.py recognises a resend by, and eviction a one-off."""

    start: int
    count: int


@dataclass
class Segment:
    """Request tokens [start, end): from `block`'s first tokens, or recomputed if block is None."""

    start: int
    end: int
    block: Block | None


@dataclass
class Lease:
    """What a running sequence holds: the plan for its cached prefix and the pins behind it;
    for a model with state layers, the snapshot at the plan's end, and how far the prompt
    matched cached tokens (where a snapshot would let the next request resume further)."""

    segments: list[Segment]
    blocks: list[Block]
    snapshot: Block | None = None
    matched: int = 0

    @property
    def end(self) -> int:
        return self.segments[-1].end if self.segments else 0


@dataclass
class Persist:
    """What a commit asks to be written to the warm tier: new blocks (with the KV they had when
    committed, so eviction meanwhile cannot take it) and the agent's manifest, in that order."""

    blocks: list[tuple[BlockRecord, Any]] = field(default_factory=list)
    manifest: Manifest | None = None
    base: str | None = None  # shared tier: the manifest version this one replaces
    etag: str | None = None  # and its own
    snapshot: str | None = None  # the name of the snapshot at the committed tokens' end, if one was asked for

    def write(self, warm: WarmTier, tensors: Callable[[Any], Tensors]) -> None:
        """Queue the writes; `tensors` turns a hot payload into a block file's numpy arrays."""
        for record, payload in self.blocks:
            warm.save_block(record, tensors(payload))
        if self.manifest is not None:
            warm.save_agent(self.manifest, self.base, self.etag)


@dataclass
class AgentInfo:
    id: str
    tokens: int
    blocks: dict[str, int]  # by tier
    hot_bytes: int
    exact_bytes: int  # the part of hot_bytes at the precision it was computed at
    disk_bytes: int
    last_used: float
    snapshots: int = 0  # of its state layers (window, recurrent), kept at positions it returns to
    snapshot_bytes: int = 0  # the hot ones' part of hot_bytes
    misses: list[Miss] = field(default_factory=list)  # its requests' latest misses, oldest first
    pinned: bool = False  # kept against eviction (memory/index/pins.py)
    kind: str = AGENT  # agent_key.py: a named agent, or an unnamed conversation
    turns: int = 0
    # Until when its memory is kept with priority (wall clock: prompt_cache_retention, keep.py), hot
    # and on disk; 0: not asked.
    keep_until: float = 0.0
    keep_on_disk_until: float = 0.0

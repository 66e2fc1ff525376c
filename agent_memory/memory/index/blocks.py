"""BlockPool: every KV block the server knows, with its tier, references and exact byte counts.

A block is `block_tokens` consecutive tokens of one sequence (the last block of a sequence may
be shorter), named by a hash chain over token ids, so identical prefixes are held once. A
snapshot is a block of no tokens: the state of a model's window and recurrent layers after the
prefix its `parent` names (engine/kinds/layers.py), at position `start`; it has the same tiers,
references and pins, and is found by that prefix (`snapshots`), not as a child. The pool owns no
MLX: a hot block's `payload` is whatever the engine gave it, with its byte size.
"""

from __future__ import annotations

import enum
import time
from dataclasses import dataclass, field
from collections.abc import Callable
from typing import Any

from agent_memory.memory.hashing import Extras
from agent_memory.memory.warm.format.records import BlockRecord


class Tier(enum.Enum):
    HOT = "hot"  # KV in memory (it may also have a warm copy)
    WARM = "warm"  # KV only in the warm tier (memory/warm/: a folder, or a shared Redis)
    COLD = "cold"  # tokens known, KV dropped: recomputed on demand


@dataclass(eq=False)
class Block:
    hash: str
    parent: str | None
    tokens: tuple[int, ...]
    start: int  # position of the block's first token in its sequence
    payload: Any = None  # engine-owned KV; None unless HOT
    hot_bytes: int = 0
    exact: bool = False  # HOT at the precision it was computed at, not yet quantized
    disk_bytes: int = 0  # size of its warm copy (a file, or a Redis value); 0 when none
    refs: int = 0  # agents whose latest sequence uses the block
    weight: float = 0.0  # their references' worth to eviction (eviction.retention_weight)
    pins: int = 0  # running sequences using it: never evicted while > 0
    held: int = 0  # pinned agents and heads using it (memory/index/pins.py): never evicted while > 0
    # No agent uses it any more, but a running sequence did when its last agent let go (an
    # agent's prompt committed while its own lease still read the old turn's blocks): it goes
    # with that sequence's pin rather than live on as anonymous memory (agents.py `_unref`).
    orphan: bool = False
    last_used: float = field(default_factory=time.monotonic)
    snapshot: bool = False  # the state after its parent's prefix, at position `start`
    tenant: str = ""  # whose namespace named it: no block is shared across tenants (memory/hashing.py)
    extras: Extras = ()  # what fixes its KV beyond its tokens, relative to `start` (memory/hashing.py)
    cooled_by: str = ""  # once COLD, why its KV went (cache_miss.py: evicted_hot, evicted_disk, unreadable)
    # Wall-clock times until which it leaves memory, and its warm copy the disk, after the blocks
    # not so kept (keep.py: a client's breakpoint ttl or prompt_cache_retention).
    keep_until: float = 0.0
    keep_on_disk_until: float = 0.0

    @property
    def tier(self) -> Tier:
        if self.payload is not None:
            return Tier.HOT
        return Tier.WARM if self.disk_bytes else Tier.COLD

    @property
    def end(self) -> int:
        return self.start + len(self.tokens)

    def record(self) -> BlockRecord:
        """What its block file says about it."""
        return BlockRecord(self.hash, self.parent, self.start, self.tokens, self.snapshot, self.extras)


class BlockPool:
    """Blocks by hash, the parent → children index, and the hot/disk byte totals."""

    def __init__(self) -> None:
        self.blocks: dict[str, Block] = {}
        self.children: dict[str | None, set[str]] = {}
        self.snapshots: dict[str, Block] = {}  # by the name of the prefix they follow
        self.hot_bytes = 0  # exact, quantized and snapshots together: what the hot budget bounds
        self.exact_bytes = 0
        self.snapshot_bytes = 0  # the hot snapshots' part of hot_bytes
        self.disk_bytes = 0
        # Told ("set" or "drop", the block) before a payload changes, and ("save", the block)
        # when a commit asks for its payload to be written: rank 0 of a distributed server
        # records them for the other ranks (engine/distributed/recorder.py); None alone.
        self.watch: Callable[[str, Block], None] | None = None

    def __contains__(self, block_hash: str) -> bool:
        return block_hash in self.blocks

    def __len__(self) -> int:
        return len(self.blocks)

    def get(self, block_hash: str) -> Block | None:
        return self.blocks.get(block_hash)

    def add(self, block: Block) -> Block:
        assert block.hash not in self.blocks, block.hash
        self.blocks[block.hash] = block
        if block.snapshot:
            self.snapshots[block.parent] = block
        else:
            self.children.setdefault(block.parent, set()).add(block.hash)
        return block

    def remove(self, block: Block) -> None:
        """Forget a block entirely; the caller has deleted its disk copy first."""
        self.drop_payload(block)
        assert not block.disk_bytes, "remove the disk copy before the block"
        del self.blocks[block.hash]
        if block.snapshot:
            del self.snapshots[block.parent]
            return
        siblings = self.children[block.parent]
        siblings.discard(block.hash)
        if not siblings:
            del self.children[block.parent]

    def set_payload(self, block: Block, payload: Any, nbytes: int, exact: bool = False) -> None:
        if self.watch is not None:
            self.watch("set", block)
        self._unset(block)
        block.payload, block.hot_bytes, block.exact = payload, nbytes, exact
        self.hot_bytes += nbytes
        self.exact_bytes += nbytes if exact else 0
        self.snapshot_bytes += nbytes if block.snapshot else 0

    def drop_payload(self, block: Block) -> None:
        if self.watch is not None and block.payload is not None:
            self.watch("drop", block)
        self._unset(block)

    def _unset(self, block: Block) -> None:
        self.hot_bytes -= block.hot_bytes
        self.exact_bytes -= block.hot_bytes if block.exact else 0
        self.snapshot_bytes -= block.hot_bytes if block.snapshot else 0
        block.payload, block.hot_bytes, block.exact = None, 0, False

    def to_write(self, blocks: list[Block]) -> list[tuple[BlockRecord, Any]]:
        """Of a commit's blocks, the hot ones with no warm copy: their records and payloads as
        they are now, before the commit's eviction (told to `watch` here, in that order)."""
        chosen = [b for b in blocks if b.tier is Tier.HOT and not b.disk_bytes]
        for block in chosen if self.watch is not None else ():
            self.watch("save", block)
        return [(b.record(), b.payload) for b in chosen]

    def set_disk(self, block: Block, nbytes: int) -> None:
        self.disk_bytes += nbytes - block.disk_bytes
        block.disk_bytes = nbytes

    def drop_disk(self, block: Block) -> None:
        self.set_disk(block, 0)

    def in_tier(self, tier: Tier) -> list[Block]:
        return [b for b in self.blocks.values() if b.tier is tier]

"""A follower's hot payloads: its shard of every block and snapshot rank 0's store holds hot,
by hash. It mirrors only the payload column of rank 0's BlockPool (memory/index/blocks.py),
driven by the plan's `Kept`, `KeptSnapshot` and `PoolOp` entries, so that after every step it
holds a payload for exactly the hashes rank 0 holds one for, at the same precision."""

from __future__ import annotations

from collections.abc import Callable

from agent_memory.engine.kinds.attention import BlockKV
from agent_memory.engine.kinds.layers import Snapshot


class Payloads:
    def __init__(self, demote: Callable[[BlockKV], tuple[BlockKV, int]] | None) -> None:
        self.held: dict[str, BlockKV | Snapshot] = {}
        self._demote = demote  # parts.demoter: how an exact block cools to --kv-bits

    def __len__(self) -> int:
        return len(self.held)

    def put(self, block_hash: str, payload: BlockKV | Snapshot) -> None:
        self.held[block_hash] = payload

    def get(self, block_hash: str) -> BlockKV | Snapshot:
        payload = self.held.get(block_hash)
        if payload is None:
            raise RuntimeError(f"rank 0's plan names block {block_hash[:12]}, which this rank does not hold")
        return payload

    def demote(self, block_hash: str) -> None:
        if self._demote is None:
            raise RuntimeError("rank 0 demoted a block, but this rank's KV is already at --kv-bits")
        self.held[block_hash] = self._demote(self.get(block_hash))[0]

    def drop(self, block_hash: str) -> None:
        self.held.pop(block_hash, None)

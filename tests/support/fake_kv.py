"""A memory store over fake KV (each token 10 bytes, a block's tensor its token ids) on a real
warm tier, a folder or a Redis namespace: what the store, warm tier and scale-out tests commit
through, as the engine does at the end of a request, without a model."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import numpy as np

from agent_memory.agent_key import AgentKey
from agent_memory.memory.hashing import namespace
from agent_memory.memory.index.snapshots import TURN_END
from agent_memory.memory.index.store import AgentCacheStore
from agent_memory.memory.index.tier_events import StoreEvents
from agent_memory.memory.index.write_back import WriteBack
from agent_memory.memory.warm.folder.paths import Folder
from agent_memory.memory.warm.redis.backend import RedisBackend
from agent_memory.memory.warm.tier import WarmTier
from agent_memory.precision import KVPrecision

FINGERPRINT = "f" * 32
BYTES_PER_TOKEN = 10


@dataclass(frozen=True)
class FakeKV:
    tokens: tuple[int, ...]


@dataclass(frozen=True)
class FakeSnapshot:
    """Stands in for a model's state layers at a position (a model with state layers)."""

    position: int


SNAPSHOT_BYTES = 25
BLOCK = 3  # the Redis tests' block size, in tokens


def encode(payload: FakeKV | FakeSnapshot) -> dict:
    if isinstance(payload, FakeSnapshot):
        return {"s": ("U32", np.asarray([payload.position], dtype=np.uint32))}
    return {"k": ("U32", np.asarray(payload.tokens, dtype=np.uint32))}


def layout(n: int) -> dict:
    return {"k": ("U32", (n,))}


def snapshot_layout(position: int) -> dict:
    return {"s": ("U32", (1,))}


def make_store(
    root: Path, *, hot_tokens=1000, disk_bytes=1 << 30, block_tokens=3, state=False
) -> tuple[AgentCacheStore, WarmTier]:
    disk = WarmTier(
        Folder(root),
        fingerprint=FINGERPRINT,
        precision=KVPrecision(),
        block_layout=layout,
        name="test/model",
        block_tokens=block_tokens,
        snapshot_layout=snapshot_layout if state else None,
    )
    store = AgentCacheStore(
        block_tokens=block_tokens,
        salt=FINGERPRINT,
        hot_budget_bytes=hot_tokens * BYTES_PER_TOKEN,
        attention_tokens=50.0,
        warm=disk,
        disk_budget_bytes=disk_bytes,
        state_layers=state,
    )
    store.restore(disk.open())
    disk.start(StoreEvents(store))
    return store, disk


def commit(store, agent, tokens, snapshot=False, role=TURN_END, made=()):
    """What the engine does at the end of a request: commit (with a snapshot where the tokens
    end, for a store of a model with state layers, kept as `role`; `made`: those its sequence
    took on its way), then write what the store asks; returns what it asked.
    `agent`: an id in the shared namespace, an AgentKey, or None."""
    key = AgentKey(agent) if isinstance(agent, str) else agent
    root = store.names.root(namespace(key.tenant, "")) if key else None
    take = (lambda: (FakeSnapshot(len(tokens)), SNAPSHOT_BYTES)) if snapshot and store.state_layers else None
    persist = store.commit(
        key, tokens, lambda s, e: (FakeKV(tuple(tokens[s:e])), (e - s) * BYTES_PER_TOKEN, False), root, take, made,
        role=role,
    )
    if store.warm is not None:
        persist.write(store.warm, encode)
    if key is None and persist.snapshot is not None:  # pinned for its sequence, which has ended
        store.let_go([persist.snapshot])
    return persist


def shared_disk(url: str, ns: str) -> WarmTier:
    """A warm tier on the Redis at `url`, namespace `ns`, of BLOCK-token blocks."""
    disk = WarmTier(
        RedisBackend(url, ns), fingerprint=FINGERPRINT, precision=KVPrecision(), block_layout=layout, name="t", block_tokens=BLOCK
    )
    disk.open()
    return disk


def shared_store(url: str, ns: str, write_back: bool = False) -> tuple[AgentCacheStore, WarmTier]:
    """What one agent-memory server holds: its store (memory) on the shared tier; with
    `write_back`, what the tier loses or misses is written back from it (engine/core.py)."""
    disk = shared_disk(url, ns)
    store = AgentCacheStore(
        block_tokens=BLOCK,
        salt=FINGERPRINT,
        hot_budget_bytes=1000 * BYTES_PER_TOKEN,
        attention_tokens=50.0,
        warm=disk,
        disk_budget_bytes=1 << 30,
    )
    disk.start(StoreEvents(store, WriteBack(store, disk, lambda call: call(), encode) if write_back else None))
    return store, disk


def discover(store: AgentCacheStore, agent: str | None, tokens: list[int]):
    key = AgentKey(agent) if agent else None
    future = store.sync.discover(key, tokens, None)
    if future is not None:
        future.result(timeout=10)
    store.sync.apply()

"""A warm folder written by hand through the project's own block file and manifest code: what the
`agent-memory cache` tests inspect and tidy (`cache`: three agents of two models, one block file
no agent names)."""

from __future__ import annotations

import json
import os
import time
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pytest
from typer.testing import CliRunner

from agent_memory import files
from agent_memory.agent_key import AgentKey
from agent_memory.cli.cache.commands import cache_app
from agent_memory.memory.hashing import BlockNames
from agent_memory.memory.warm.format import blockfile
from agent_memory.memory.warm.folder.paths import Folder, folder_name
from agent_memory.memory.warm.format.records import Manifest, tokens_text

FP_TINY = "a1" * 16
FP_DEMO = "b2" * 16
DAY = 86400.0


@dataclass
class Agent:
    id: str
    tokens: list[int]
    blocks: list[str]
    layout: Folder


@dataclass
class Cache:
    root: Path
    tiny: Folder
    demo: Folder
    alice: Agent  # tiny, used 10 days ago
    bob: Agent  # tiny, shares alice's first two blocks, its last block is cold
    carol: Agent  # demo, 64-token blocks like the server's
    orphan: str  # a tiny block file no manifest names

    def run(self, *args: str, input: str | None = None):
        return CliRunner().invoke(cache_app, [*args, "--cache-dir", str(self.root)], input=input)

    def json(self, *args: str) -> dict:
        result = self.run(*args, "--format", "json")
        return json.loads(result.stdout)

    def files(self) -> set[Path]:
        return {p for p in self.root.rglob("*") if p.is_file()}


def make_folder(root: Path, name: str, fingerprint: str) -> Folder:
    layout = Folder(root / "kv" / folder_name(name, fingerprint, "kv16"))
    layout.agents.mkdir(parents=True)
    layout.blocks.mkdir()
    (layout.root / "model.json").write_text(json.dumps({"fingerprint": fingerprint, "bits": "16", "group_size": "0"}))
    return layout


def write_block(
    layout: Folder, fingerprint: str, h: str, parent: str | None, start: int, tokens: list[int]
) -> Path:
    """A block file as the server writes it: K and V of 2 layers, 2 heads, 8 dims per token."""
    rng = np.random.default_rng(start)
    tensors = {kv: ("F16", rng.standard_normal((2, 2, len(tokens), 8)).astype(np.float16)) for kv in ("k", "v")}
    meta = {
        "fingerprint": fingerprint,
        "bits": "16",
        "group_size": "0",
        "hash": h,
        "parent": parent or "",
        "start": str(start),
        "tokens": tokens_text(tokens),
    }
    path = layout.block_path(h)
    path.parent.mkdir(exist_ok=True)
    files.write_atomic(path, blockfile.encode(meta, tensors))
    return path


def write_agent(
    layout: Folder, fingerprint: str, block_tokens: int, agent: str, tokens: list[int], last_used: float, skip=()
) -> Agent:
    """The agent's manifest and its block files (but those in `skip`: cold)."""
    chain = BlockNames(fingerprint, block_tokens).chain(tokens)
    for i, (h, parent, start, end) in enumerate(chain):
        if i not in skip and not layout.block_path(h).exists():
            write_block(layout, fingerprint, h, parent, start, tokens[start:end])
    blocks = [h for h, *_ in chain]
    manifest = Manifest(AgentKey(agent), fingerprint, tokens, blocks, last_used)
    files.write_atomic(layout.agent_path(agent), [manifest.to_bytes()])
    return Agent(agent, tokens, blocks, layout)


def age(path: Path, seconds: float) -> None:
    t = time.time() - seconds
    os.utime(path, (t, t))


@pytest.fixture
def cache(tmp_path) -> Cache:
    now = time.time()
    root = tmp_path / "cache"
    tiny, demo = make_folder(root, "tiny", FP_TINY), make_folder(root, "demo", FP_DEMO)
    shared = list(range(1, 9))
    alice = write_agent(tiny, FP_TINY, 4, "alice", [*shared, 20, 21, 22, 23, 24, 25], now - 10 * DAY)
    bob = write_agent(tiny, FP_TINY, 4, "bob", [*shared, 30, 31, 32, 33, 34, 35], now - 60, skip={3})
    carol = write_agent(demo, FP_DEMO, 64, "carol", list(range(100, 200)), now - 3 * 3600)
    orphan = BlockNames(FP_TINY, 4).block_hash(None, [7, 7, 7, 7])
    age(write_block(tiny, FP_TINY, orphan, None, 0, [7, 7, 7, 7]), 2 * DAY)
    return Cache(root, tiny, demo, alice, bob, carol, orphan)


def verify(cache) -> tuple[int, dict]:
    result = cache.run("verify", "--format", "json")
    return result.exit_code, json.loads(result.stdout)

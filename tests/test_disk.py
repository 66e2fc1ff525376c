"""The warm tier in process: the block file format, distrust of damaged files, a full disk,
and the store's invariants across write-behind, crashes and restarts (real files in tmp)."""

from __future__ import annotations

import errno
import json
import os
import queue
import shutil
import struct
import tempfile
from pathlib import Path
from unittest import mock

import numpy as np
import pytest
from hypothesis import HealthCheck, settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, initialize, invariant, precondition, rule
from safetensors.numpy import load_file

from agent_memory import files
from agent_memory.agent_key import AgentKey
from agent_memory.memory.index.blocks import Tier
from agent_memory.memory.index.snapshots import TURN_END, TURN_START
from agent_memory.memory.index.store import AgentCacheStore
from agent_memory.memory.warm.format import blockfile
from agent_memory.memory.warm.format.blockfile import BlockFileError
from agent_memory.memory.warm.folder.paths import Folder
from agent_memory.memory.warm.format.records import Manifest
from agent_memory.memory.warm.tier import WarmTier
from agent_memory.precision import KVPrecision
from tests.support.fake_kv import (
    BYTES_PER_TOKEN,
    FINGERPRINT,
    commit,
    layout,
    make_store,
)

# -- the file format -------------------------------------------------------------------------


def test_block_files_are_plain_safetensors_with_their_identity(tmp_path):
    store, disk = make_store(tmp_path)
    commit(store, "a", [1, 2, 3, 4, 5])
    disk.flush()
    files = sorted((tmp_path / "blocks").rglob("*.safetensors"))
    assert len(files) == 2
    for f in files:
        arrays = load_file(f)  # the reference safetensors reader accepts our files
        meta, ours = blockfile.read(f, {"hash": f.stem}, None)
        assert np.array_equal(arrays["k"], ours["k"])
        assert json.loads(meta["tokens"]) == arrays["k"].tolist()
        assert meta["fingerprint"] == FINGERPRINT and meta["format"] == blockfile.FORMAT
    disk.close()


def write_block(path: Path, tokens=(1, 2, 3)) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    files.write_atomic(path, blockfile.encode({"hash": path.stem}, {"k": ("U32", np.asarray(tokens, np.uint32))}))


@pytest.mark.parametrize(
    "damage",
    ["truncate_header", "truncate_middle", "truncate_tail", "flip_header", "flip_middle", "flip_tail", "huge_header", "empty"],
)
def test_damaged_files_are_refused_with_a_reason(tmp_path, damage):
    path = tmp_path / "b.safetensors"
    write_block(path, tuple(range(64)))
    data = bytearray(path.read_bytes())
    n = struct.unpack("<Q", data[:8])[0]
    where = {"header": 8 + n // 2, "middle": 8 + n + (len(data) - 8 - n) // 2, "tail": len(data) - 1}
    kind, _, at = damage.partition("_")
    if kind == "truncate":
        data = data[: where[at]]
    elif kind == "flip":
        data[where[at]] ^= 0x10
    elif damage == "huge_header":
        data[:8] = struct.pack("<Q", 1 << 40)
    else:
        data = bytearray()
    path.write_bytes(bytes(data))
    with pytest.raises(BlockFileError) as e:
        blockfile.read(path, {"hash": "b"}, {"k": ("U32", (64,))})
    assert str(e.value)


def test_header_is_checked_before_data_is_read(tmp_path):
    """A header that announces more tensor data than the file has fails on the header alone."""
    path = tmp_path / "b.safetensors"
    write_block(path)
    with pytest.raises(BlockFileError, match="expected"):
        blockfile.read(path, {"hash": "b"}, {"k": ("U32", (1 << 34,))})
    with pytest.raises(BlockFileError, match="hash"):
        blockfile.read(path, {"hash": "other"}, None)


def test_a_crash_mid_write_leaves_the_old_file_and_a_temp_file(tmp_path):
    path = tmp_path / "b.safetensors"
    write_block(path, (7, 8, 9))

    def chunks():
        yield b"partial bytes"
        raise KeyboardInterrupt  # the process dies mid-write

    with pytest.raises(KeyboardInterrupt):
        files.write_atomic(path, chunks())
    assert blockfile.read(path, {"hash": "b"}, None)[1]["k"].tolist() == [7, 8, 9]
    assert [f for f in tmp_path.iterdir() if f.name.endswith(".tmp")] == []


def test_full_disk_keeps_the_server_consistent(tmp_path, caplog):
    store, disk = make_store(tmp_path)
    real_write = os.write

    def full(fd, data):
        raise OSError(errno.ENOSPC, "No space left on device")

    with mock.patch("agent_memory.files.os.write", side_effect=full):
        commit(store, "a", list(range(10)))
        commit(store, "b", list(range(20, 30)))
        disk.flush()
    assert os.write is real_write
    # Nothing half-written, nothing counted on disk, every block still in memory.
    assert list((tmp_path / "blocks").rglob("*")) == [p for p in (tmp_path / "blocks").rglob("*") if p.is_dir()]
    assert store.pool.disk_bytes == 0
    assert all(b.tier is Tier.HOT for b in store.pool.blocks.values())
    assert [r.message for r in caplog.records].count(
        next(r.message for r in caplog.records if "save_block failed" in r.message)
    ) == 1, "the same failure is logged once"
    # Once there is room again, the next commit writes everything.
    commit(store, "a", list(range(12)))
    disk.flush()
    assert store.pool.disk_bytes == sum(p.stat().st_size for p in (tmp_path / "blocks").rglob("*.safetensors"))
    assert store.pool.disk_bytes > 0
    disk.close()


def test_restart_restores_agents_and_removes_orphans_and_temp_files(tmp_path):
    store, disk = make_store(tmp_path)
    commit(store, "a", list(range(10)))
    commit(store, "b", list(range(5)) + [9, 9, 9])
    disk.close()
    orphan = Folder(tmp_path).block_path("0" * 32)
    write_block(orphan)
    tmp = tmp_path / "blocks" / "00" / ".x.safetensors.abcd.tmp"
    tmp.write_bytes(b"junk")
    (tmp_path / "agents" / "nonsense.json").write_text("{not json")

    store2, disk2 = make_store(tmp_path)
    disk2.flush()
    assert sorted(store2.agents) == [AgentKey("a"), AgentKey("b")]
    assert store2.agents[AgentKey("a")].tokens == list(range(10))
    assert all(b.tier is Tier.WARM for b in store2.pool.blocks.values())
    assert not orphan.exists() and not tmp.exists()
    assert any(p.name.endswith("nonsense.json") for p in (tmp_path / "quarantine").iterdir())
    lease = store2.lookup(list(range(10)) + [1])
    assert lease.end == 10
    for seg in lease.segments:
        tensors = disk2.read_block(seg.block).result()
        assert tensors["k"].tolist() == list(seg.block.tokens)
    store2.release(lease)
    disk2.close()


def test_a_damaged_block_is_quarantined_and_becomes_a_miss(tmp_path):
    store, disk = make_store(tmp_path)
    commit(store, "a", list(range(9)))
    disk.close()
    store2, disk2 = make_store(tmp_path)
    victim = Folder(tmp_path).block_path(store2.agents[AgentKey("a")].blocks[1])
    data = bytearray(victim.read_bytes())
    data[-2] ^= 0xFF
    victim.write_bytes(bytes(data))
    lease = store2.lookup(list(range(9)))
    bad = lease.segments[1].block
    with pytest.raises(BlockFileError):
        disk2.read_block(bad).result()
    store2.warm_lost(bad)
    assert bad.tier is Tier.COLD and not victim.exists()
    assert any(p.name.endswith(".why") for p in (tmp_path / "quarantine").iterdir())
    store2.release(lease)
    again = store2.lookup(list(range(9)))
    # The damaged block is a gap to recompute; the good block after it is still reused.
    assert [(s.start, s.end, s.block is None) for s in again.segments] == [(0, 3, False), (3, 6, True), (6, 9, False)]
    store2.release(again)
    disk2.close()


def test_a_block_another_sequence_reads_from_disk_stays_within_the_hot_budget(tmp_path):
    store, disk = make_store(tmp_path, hot_tokens=3)
    commit(store, "a", list(range(9)))
    disk.close()
    store2, disk2 = make_store(tmp_path, hot_tokens=3)
    reading = store2.lookup(list(range(9)))  # pins three WARM blocks while it reads them
    commit(store2, "b", list(range(9)))  # another agent finishes with the same tokens
    assert store2.pool.hot_bytes <= 3 * BYTES_PER_TOKEN
    assert all(s.block.tier is Tier.WARM for s in reading.segments)
    store2.release(reading)
    disk2.close()


# -- review fixes: model.json, hostile manifests and headers, races with a pruner ----------------


def test_model_json_names_the_model_block_size_and_precision_and_is_written_atomically(tmp_path):
    disk = WarmTier(
        Folder(tmp_path),
        fingerprint=FINGERPRINT,
        precision=KVPrecision(8, 32),
        block_layout=layout,
        name="HuggingFaceTB/SmolLM2-135M",
        block_tokens=64,
    )
    with mock.patch("agent_memory.files.write_atomic", wraps=files.write_atomic) as w:
        disk.open()
    assert [c.args[0] for c in w.call_args_list] == [tmp_path / "model.json"]
    info = json.loads((tmp_path / "model.json").read_text())
    assert info["name"] == "HuggingFaceTB/SmolLM2-135M" and info["fingerprint"] == FINGERPRINT
    assert info["block_tokens"] == 64 and info["precision"] == {"bits": 8, "group_size": 32}
    assert (info["bits"], info["group_size"]) == ("8", "32")  # what every block file repeats
    disk.close()


def test_a_crash_while_writing_model_json_leaves_a_temp_file_the_next_start_removes(tmp_path):
    store, disk = make_store(tmp_path)
    disk.close()
    leftover = tmp_path / ".model.json.dead.tmp"
    leftover.write_bytes(b"{half")
    store2, disk2 = make_store(tmp_path)
    assert not leftover.exists() and json.loads((tmp_path / "model.json").read_text())["block_tokens"] == 3
    disk2.close()


def write_manifest(root: Path, agent: str, **fields) -> Path:
    """A manifest named after `agent` whose fields (valid unless overridden) are written raw."""
    body = {"version": 1, "agent": agent, "fingerprint": FINGERPRINT, "last_used": 1.0, "blocks": [], "tokens": []}
    path = Folder(root).agent_path(agent)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps({**body, **fields}) if fields.get("raw") is None else fields["raw"])
    return path


@pytest.mark.parametrize(
    "fields",
    [
        {"tokens": [2**32]},
        {"tokens": [-1]},
        {"tokens": [1.0]},
        {"tokens": [True]},
        {"tokens": ["1"]},
        {"last_used": float("nan")},
        {"last_used": 10**400},
        {"last_used": True},
        {"raw": '{"version": 1, "agent": "x", "tokens": ' + "[" * 100_000 + "]" * 100_000 + "}"},
        {"roles": ["turn_start"]},
        {"roles": {"turn_start": "0" * 32}},  # a role naming no snapshot of its own
    ],
    ids=[
        "id_2_32", "negative", "float", "bool", "string", "nan_time", "huge_time", "bool_time", "deep_nesting",
        "roles_list", "role_unnamed",
    ],
)
def test_hostile_manifests_are_refused_with_a_value_error(tmp_path, fields):
    with pytest.raises(ValueError):
        Manifest.read(write_manifest(tmp_path, "x", **fields))


def test_a_bad_manifest_is_quarantined_and_the_others_still_load(tmp_path):
    store, disk = make_store(tmp_path)
    commit(store, "good", list(range(7)))
    disk.close()
    write_manifest(tmp_path, "huge-id", tokens=[1, 2**32])
    write_manifest(tmp_path, "deep", raw="[" * 100_000 + "]" * 100_000)
    store2, disk2 = make_store(tmp_path)
    assert sorted(store2.agents) == [AgentKey("good")] and store2.agents[AgentKey("good")].tokens == list(range(7))
    quarantined = sorted(p.name.split("-", 2)[2] for p in (tmp_path / "quarantine").iterdir())
    names = sorted(Folder(tmp_path).agent_path(a).name for a in ("huge-id", "deep"))
    assert quarantined == sorted([*names, *(n + ".why" for n in names)])
    disk2.close()


def rewrite_header(path: Path, change) -> None:
    """Replace a block file's header by change(header) (a dict, or any JSON text), keeping its data."""
    data = path.read_bytes()
    n = struct.unpack("<Q", data[:8])[0]
    header = change(json.loads(data[8 : 8 + n]))
    head = (header if isinstance(header, str) else json.dumps(header)).encode()
    path.write_bytes(struct.pack("<Q", len(head)) + head + data[8 + n :])


def _entry(**changes):
    return lambda h: {**h, "k": {**h["k"], **changes}}


@pytest.mark.parametrize(
    "change",
    [
        _entry(data_offsets=[0.0, 12.0]),
        _entry(data_offsets=["0", "12"]),
        _entry(data_offsets=[False, 12]),
        _entry(shape=[-1, -3]),  # the right size, but no shape
        _entry(shape=[True, 3]),
        _entry(shape=[3.0]),
        _entry(shape=[2**64]),  # overflows int64
        _entry(shape="abc"),
        lambda h: [h],  # a list, not an object
        lambda h: "[" * 100_000 + "]" * 100_000,  # nested too deeply for the parser
    ],
    ids=[
        "float_offsets", "str_offsets", "bool_offset", "negative_dims", "bool_dim",
        "float_dim", "huge_dim", "str_shape", "list", "deep",
    ],
)
def test_hostile_headers_are_bad_files_never_other_exceptions(tmp_path, change):
    path = tmp_path / "b.safetensors"
    write_block(path)  # three uint32 tokens: 12 bytes of data
    rewrite_header(path, change)
    for shape in (None, {"k": ("U32", (3,))}):
        with pytest.raises(BlockFileError):
            blockfile.read(path, {}, shape)


def test_a_block_with_a_hostile_header_is_quarantined_on_read(tmp_path):
    store, disk = make_store(tmp_path)
    commit(store, "a", [1, 2, 3])
    disk.flush()
    block = store.pool.get(store.agents[AgentKey("a")].blocks[0])
    rewrite_header(disk.folder.block_path(block.hash), _entry(shape=[True, 3]))
    with pytest.raises(BlockFileError):
        disk.read_block(block).result()
    assert not disk.folder.block_path(block.hash).exists()
    assert len(list((tmp_path / "quarantine").glob("*.why"))) == 1
    disk.close()


def test_files_of_one_name_quarantined_in_the_same_second_are_all_kept(tmp_path):
    disk_layout = Folder(tmp_path)
    for content in ("first", "second"):
        (tmp_path / "m.json").write_text(content)
        with mock.patch("agent_memory.memory.warm.folder.paths.time.time", return_value=1_700_000_000.0):
            disk_layout.quarantine(tmp_path / "m.json", f"bad {content}")
    kept = sorted(p.read_text() for p in disk_layout.quarantine_dir.iterdir() if not p.name.endswith(".why"))
    assert kept == ["first", "second"]
    assert len(list(disk_layout.quarantine_dir.glob("*.why"))) == 2


def test_listing_survives_folders_pruned_meanwhile(tmp_path):
    """Another process (`agent-memory cache prune`) may remove folders while the server lists them."""
    store, disk = make_store(tmp_path)
    commit(store, "a", [1, 2, 3, 4, 5, 6])
    disk.close()
    folder = Folder(tmp_path)
    (next(folder.blocks.iterdir()) / ".x.safetensors.abcd.tmp").write_bytes(b"junk")
    real_scandir = os.scandir

    def pruning_scandir(path):
        if isinstance(path, Path) and (path.parent == folder.blocks or path == folder.agents):
            shutil.rmtree(path, ignore_errors=True)  # gone between listing blocks/ and listing it
        return real_scandir(path)

    with mock.patch("agent_memory.memory.warm.folder.paths.os.scandir", pruning_scandir):
        scan = folder.scan(owns=lambda fingerprint: True)
    assert scan.blocks == {} and scan.manifests == [] and scan.temp_files == []
    store2, disk2 = make_store(tmp_path)
    assert store2.pool.disk_bytes == 0 and not store2.agents
    disk2.close()


# -- the state machine, with disk, crashes and restarts -----------------------------------------

AGENTS = st.sampled_from([AgentKey("a"), AgentKey("b"), AgentKey("a", "t2"), None])
TOKENS = st.lists(st.integers(0, 3), max_size=12)


class DiskStoreMachine(RuleBasedStateMachine):
    @initialize(hot_tokens=st.integers(0, 40), disk_blocks=st.integers(0, 12), state=st.booleans())
    def setup(self, hot_tokens, disk_blocks, state):
        self.root = Path(tempfile.mkdtemp(prefix="am-disk-sm-"))
        self.hot_tokens = hot_tokens
        self.disk_budget = disk_blocks * 200  # a 3-token block file is ~180 bytes
        self.state = state  # a model with state layers: snapshots beside the blocks
        self.store, self.disk = self._open()
        self.seen: list[list[int]] = []
        self.history: dict[str, list[list[int]]] = {}  # every sequence each agent committed
        self.running = []

    def teardown(self):
        if hasattr(self, "disk"):
            self.disk.close()
            shutil.rmtree(self.root, ignore_errors=True)

    def _open(self) -> tuple[AgentCacheStore, WarmTier]:
        return make_store(self.root, hot_tokens=self.hot_tokens, disk_bytes=self.disk_budget, state=self.state)

    def _commit(self, agent, tokens):
        commit(self.store, agent, tokens, snapshot=True)
        self.seen.append(tokens)
        if agent is not None:
            self.history.setdefault(agent, []).append(tokens)

    def _draw(self, data):
        base = data.draw(st.sampled_from(self.seen)) if self.seen else []
        return base[: data.draw(st.integers(0, len(base)))] + data.draw(TOKENS)

    @rule(agent=AGENTS, data=st.data())
    def commit(self, agent, data):
        tokens = self._draw(data)
        if tokens:
            self._commit(agent, tokens)

    @rule(data=st.data())
    def lookup_and_read(self, data):
        tokens = self._draw(data)
        lease = self.store.lookup(tokens)
        for seg in lease.segments:
            if seg.block is not None and seg.block.tier is Tier.WARM:
                got = self.disk.read_block(seg.block).result()["k"].tolist()
                assert got == list(seg.block.tokens), "a warm block read back other tokens"
        if lease.snapshot is not None and lease.snapshot.tier is Tier.WARM:
            got = self.disk.read_block(lease.snapshot).result()["s"].tolist()
            assert got == [lease.snapshot.start] == [lease.end], "a warm snapshot read back another position"
        self.running.append((tokens, lease))

    @precondition(lambda self: self.running)
    @rule(agent=AGENTS, extra=TOKENS, data=st.data())
    def finish(self, agent, extra, data):
        tokens, lease = self.running.pop(data.draw(st.integers(0, len(self.running) - 1)))
        self.store.release(lease)  # as the engine does: release, then commit
        if tokens + extra:
            self._commit(agent, tokens + extra)

    @rule(agent=AGENTS.filter(lambda a: a is not None))
    def end_agent(self, agent):
        self.store.end_agent(agent)

    @rule()
    def flush(self):
        self.disk.flush()
        self._check_files()

    @precondition(lambda self: not self.running)
    @rule(graceful=st.booleans())
    def restart(self, graceful):
        """Stop (flushing, or crashing with writes still queued) and start on the same folder."""
        expected = {a: list(r.tokens) for a, r in self.store.agents.items()}
        snapshots = {a: set(r.snapshots) for a, r in self.store.agents.items()}
        if graceful:
            self.disk.close()
        else:
            _crash(self.disk)
        self.store, self.disk = self._open()
        self.disk.flush()
        if graceful:
            assert {a: r.tokens for a, r in self.store.agents.items()} == expected
            # Its snapshots come back, but those whose file the disk budget took.
            assert all(set(r.snapshots) <= snapshots[a] for a, r in self.store.agents.items())
        else:  # writes were lost: each agent is back at some sequence it really had
            for agent, record in self.store.agents.items():
                assert record.tokens in self.history[agent]
        assert not list(self.root.rglob("*.tmp"))
        self._check_files()

    def _check_files(self):
        files = {p.stem: p.stat().st_size for p in (self.root / "blocks").rglob("*.safetensors")}
        on_disk = {b.hash: b.disk_bytes for b in self.store.pool.blocks.values() if b.disk_bytes}
        assert files == on_disk
        manifests = {Manifest.read(p).key for p in (self.root / "agents").glob("*.json")}
        assert manifests == set(self.store.agents)

    @invariant()
    def invariants(self):
        if not hasattr(self, "store"):
            return
        pool = self.store.pool
        assert pool.hot_bytes == sum(b.hot_bytes for b in pool.blocks.values())
        assert pool.hot_bytes <= self.hot_tokens * BYTES_PER_TOKEN
        assert pool.disk_bytes == sum(b.disk_bytes for b in pool.blocks.values())
        for b in pool.blocks.values():
            assert b.refs or b.pins or (b.tier is Tier.HOT and not b.disk_bytes)
        names = self.store.names
        for record in self.store.agents.values():
            assert [t for h in record.blocks for t in pool.blocks[h].tokens] == record.tokens
            chain = names.chain(record.tokens, record.root)
            for h in record.snapshots:  # each after a prefix of its tokens, in every tier
                snapshot = pool.blocks[h]
                assert snapshot.parent == names.prefix_name(chain, record.tokens, snapshot.start)


def _crash(disk: WarmTier) -> None:
    """Lose every queued write, as a killed process would, and leave a half-written temp file."""
    while True:
        try:
            disk._jobs.get_nowait()
        except queue.Empty:
            break
        disk._jobs.task_done()
    disk.close()
    some_dir = disk.folder.blocks / "ab"
    some_dir.mkdir(exist_ok=True)
    (some_dir / ".ab00.safetensors.dead.tmp").write_bytes(b"half a block")


DiskStoreMachine.TestCase.settings = settings(
    max_examples=100, stateful_step_count=30, deadline=None, suppress_health_check=[HealthCheck.too_slow]
)
test_disk_store_state_machine = DiskStoreMachine.TestCase


def test_a_turns_start_snapshot_is_kept_by_role_through_a_follow_up_and_a_restart(tmp_path):
    """A hybrid agent's turn: its prompt committed as it starts (`turn_start`), a snapshot taken
    on its way (a follow-up's), its end. Kept by position (the earliest and latest two), the
    prompt's would go; kept by role it stays, is written with its role, and after a restart the
    same prompt sent again resumes at its last token."""
    store, disk = make_store(tmp_path, state=True)
    prompt = [1, 2, 3, 1, 2, 3, 1]
    commit(store, "a", prompt[:3], snapshot=True)  # the first turn's end: the agent's earliest
    commit(store, "a", prompt, snapshot=True, role=TURN_START)
    on_the_way = commit(store, None, prompt + [2, 3], snapshot=True).snapshot
    commit(store, "a", prompt + [2, 3, 1], snapshot=True, made=[on_the_way])
    record = store.agents[AgentKey("a")]
    positions = {r: store.pool.blocks[h].start for r, h in record.roles.items()}
    assert positions == {TURN_START: len(prompt), TURN_END: len(prompt) + 3}
    assert sorted(store.pool.blocks[h].start for h in record.snapshots) == [3, len(prompt), len(prompt) + 3]
    disk.close()

    store, disk = make_store(tmp_path, state=True)
    restored = store.agents[AgentKey("a")]
    assert restored.roles == record.roles and restored.snapshots == record.snapshots
    lease = store.lookup(prompt)  # the same prompt again: it resumes where it ends
    assert lease.end == len(prompt) and lease.snapshot.hash == record.roles[TURN_START]
    store.release(lease)
    disk.close()


def test_snapshots_are_written_restored_resumed_from_and_deleted_with_their_agent(tmp_path):
    """A model with state layers: the snapshot at the end of an agent's turn is a file beside
    its blocks, named in its manifest; after a restart it is WARM, a returning prompt resumes
    exactly there (reading it back), and ending the agent deletes it with the blocks."""
    store, disk = make_store(tmp_path, state=True)
    tokens = [1, 2, 3, 1, 2, 3, 1]
    commit(store, "a", tokens, snapshot=True)
    disk.close()

    store, disk = make_store(tmp_path, state=True)
    record = store.agents[AgentKey("a")]
    (snapshot,) = [store.pool.blocks[h] for h in record.snapshots]
    assert snapshot.tier is Tier.WARM and snapshot.start == len(tokens)
    lease = store.lookup(tokens + [2, 2])
    assert lease.snapshot is snapshot and lease.end == len(tokens)
    assert disk.read_block(snapshot).result()["s"].tolist() == [len(tokens)]
    store.release(lease)
    files = {p.stem for p in (tmp_path / "blocks").rglob("*.safetensors")}
    assert snapshot.hash in files and set(record.blocks) <= files
    assert store.end_agent(AgentKey("a")) is True
    disk.flush()
    assert not list((tmp_path / "blocks").rglob("*.safetensors"))
    disk.close()

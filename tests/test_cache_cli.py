"""`agent-memory cache`: the disk cache inspected and tidied without a model, on real files
written through the project's own block file and manifest code."""

from __future__ import annotations

import json
import os
import struct
import subprocess
import sys
import time

import pytest
import typer
from typer.testing import CliRunner

from agent_memory import files
from agent_memory.agent_key import AgentKey
from agent_memory.cli.cache.commands import cache_app
from agent_memory.cli.cache.render import human_age, human_bytes, parse_duration
from agent_memory.memory.hashing import BlockNames
from agent_memory.memory.warm.folder.paths import Folder, folder_name
from agent_memory.memory.warm.format.records import Manifest
from agent_memory.memory.warm.tier import WarmTier
from agent_memory.precision import KVPrecision
from tests.support.server import REPO
from tests.support.warm_folders import (  # noqa: F401 - cache: the fixture
    DAY,
    FP_TINY,
    age,
    cache,
    make_folder,
    verify,
    write_agent,
    write_block,
)

pytestmark = pytest.mark.process

# -- ls ------------------------------------------------------------------------------------


def test_ls_human_lists_every_agent_of_every_model(cache):
    result = cache.run("ls")
    assert result.exit_code == 0, result.output
    lines = result.stdout.splitlines()
    assert lines[0].split()[:3] == ["id", "model", "tokens"]
    rows = {line.split()[0]: line for line in lines[1:4]}
    assert set(rows) == {"alice", "bob", "carol"}
    assert "tiny-" in rows["alice"] and "demo-" in rows["carol"]
    assert "3 + 1 cold" in rows["bob"] and "10d ago" in rows["alice"] and "3h ago" in rows["carol"]
    assert "3 agents" in result.stdout


def test_ls_json_has_stable_fields(cache):
    agents = {a["id"]: a for a in cache.json("ls")["agents"]}
    bob = agents["bob"]
    assert set(bob) == {
        "id",
        "tenant",
        "model",
        "folder",
        "tokens",
        "blocks",
        "on_disk",
        "cold",
        "bytes",
        "last_used",
        "manifest",
        "where",
        "kind",  # "agent", or "unnamed": a conversation recognised by its content
    }
    assert bob["kind"] == "agent"
    assert (bob["tokens"], bob["blocks"], bob["on_disk"], bob["cold"]) == (14, 4, 3, 1)
    sizes = {h: cache.tiny.block_path(h).stat().st_size for h in cache.bob.blocks[:3]}
    assert bob["bytes"] == sum(sizes.values())
    assert bob["manifest"] == str(cache.tiny.agent_path("bob"))
    assert agents["carol"]["blocks"] == 2 and agents["carol"]["cold"] == 0
    assert abs(agents["alice"]["last_used"] - (time.time() - 10 * DAY)) < 60


def test_ls_quiet_sorting_filter_and_limit(cache):
    def ids(*args):
        result = cache.run("ls", "--format", "quiet", *args)
        assert result.exit_code == 0, result.output
        return result.stdout.splitlines()

    assert ids() == ["bob", "carol", "alice"]  # most recently used first
    assert ids("--reverse") == ["alice", "carol", "bob"]
    assert ids("--sort", "id") == ["alice", "bob", "carol"]
    assert ids("--sort", "tokens") == ["carol", "alice", "bob"]  # 100, then 14 and 14 by id
    assert ids("--sort", "bytes", "--limit", "1") == ["carol"]
    assert ids("--model", "tiny") == ["bob", "alice"]
    assert ids("--model", cache.demo.root.name) == ["carol"]
    result = cache.run("ls", "--model", "nope")
    assert result.exit_code == 1 and "no model folder matches" in result.stderr


def test_ls_of_an_empty_or_missing_cache_dir(tmp_path):
    result = CliRunner().invoke(cache_app, ["ls", "--cache-dir", str(tmp_path / "none"), "--format", "json"])
    assert result.exit_code == 0 and json.loads(result.stdout)["agents"] == []


def test_cache_dir_comes_from_the_environment(cache):
    result = CliRunner().invoke(cache_app, ["ls", "--format", "quiet"], env={"AGENT_MEMORY_CACHE_DIR": str(cache.root)})
    assert result.exit_code == 0 and sorted(result.stdout.split()) == ["alice", "bob", "carol"]


# -- show ----------------------------------------------------------------------------------


def test_show_lists_blocks_with_sharing_and_cold_ones(cache):
    doc = cache.json("show", "bob")
    assert doc["id"] == "bob" and doc["folder"] == cache.tiny.root.name and doc["block_tokens"] == 4
    assert [b["hash"] for b in doc["blocks"]] == cache.bob.blocks
    assert [(b["start"], b["tokens"]) for b in doc["blocks"]] == [(0, 4), (4, 4), (8, 4), (12, 2)]
    assert [b["on_disk"] for b in doc["blocks"]] == [True, True, True, False]
    assert [b["shared_with"] for b in doc["blocks"]] == [1, 1, 0, 0]
    own = cache.tiny.block_path(cache.bob.blocks[2]).stat().st_size
    assert doc["totals"]["cold"] == 1 and doc["totals"]["private_bytes"] == own

    result = cache.run("show", "bob")
    assert result.exit_code == 0, result.output
    assert "cold" in result.stdout and "1 agent" in result.stdout and cache.bob.blocks[0][:16] in result.stdout


def test_show_unknown_agent_fails_clearly(cache):
    result = cache.run("show", "dave")
    assert result.exit_code == 1 and "no agent dave" in result.stderr


def test_the_servers_model_json_names_the_model_and_its_block_size(tmp_path):
    """model.json as WarmTier writes it: `ls` shows the model's name, `--model` takes it, and
    `show` knows the block size even when none of the agent's blocks has a file."""
    root = tmp_path / "cache"
    layout = Folder(root / "kv" / folder_name("org/Model-1", FP_TINY, "kv16"))
    disk = WarmTier(
        layout,
        fingerprint=FP_TINY,
        precision=KVPrecision(),
        block_layout=lambda n: {},
        name="org/Model-1",
        block_tokens=4,
    )
    disk.open()
    disk.close()
    write_agent(layout, FP_TINY, 4, "dora", list(range(10)), time.time(), skip={0, 1, 2})

    def run(*args: str):
        result = CliRunner().invoke(cache_app, [*args, "--cache-dir", str(root), "--format", "json"])
        return result.exit_code, json.loads(result.stdout)

    code, doc = run("ls", "--model", "org/Model-1")
    assert code == 0 and [(a["id"], a["model"]) for a in doc["agents"]] == [("dora", "org/Model-1")]
    code, doc = run("show", "dora")
    assert code == 0 and doc["block_tokens"] == 4 and [b["tokens"] for b in doc["blocks"]] == [4, 4, 2]
    code, doc = run("verify")
    assert code == 0, doc


# -- verify --------------------------------------------------------------------------------


def test_verify_passes_on_a_sound_cache(cache):
    code, doc = verify(cache)
    assert (code, doc["ok"], doc["problems"]) == (0, True, [])
    assert doc["checked"] == {"folders": 2, "blocks": 8, "manifests": 3}
    result = cache.run("verify")
    assert result.exit_code == 0 and "all good" in result.stdout
    assert cache.run("verify", "--format", "quiet").stdout == ""


def damage_truncate(cache):
    path = cache.tiny.block_path(cache.alice.blocks[2])
    with open(path, "r+b") as f:
        f.truncate(path.stat().st_size - 10)
    return [path]


def damage_flip(cache):
    path = cache.tiny.block_path(cache.alice.blocks[2])
    data = bytearray(path.read_bytes())
    n = struct.unpack("<Q", data[:8])[0]
    data[8 + n + (len(data) - 8 - n) // 2] ^= 0x01
    path.write_bytes(bytes(data))
    return [path]


def damage_swap(cache):
    a, b = (cache.tiny.block_path(h) for h in cache.alice.blocks[2:4])
    tmp = a.with_name("swap")
    os.replace(a, tmp)
    os.replace(b, a)
    os.replace(tmp, b)
    return [a, b]


def damage_forge(cache):
    """A well-formed file whose metadata claims the name, but whose tokens hash elsewhere."""
    h, parent = cache.alice.blocks[2], cache.alice.blocks[1]
    return [write_block(cache.tiny, FP_TINY, h, parent, 8, [20, 21, 22, 99])]


def damage_manifest(cache):
    tokens = list(cache.alice.tokens)
    tokens[5] = 999
    manifest = Manifest(AgentKey("alice"), FP_TINY, tokens, cache.alice.blocks, time.time())
    path = cache.tiny.agent_path("alice")
    files.write_atomic(path, [manifest.to_bytes()])
    return [path]


@pytest.mark.parametrize("damage", [damage_truncate, damage_flip, damage_swap, damage_forge, damage_manifest])
def test_verify_names_each_bad_file(cache, damage):
    bad = damage(cache)
    before = {p: p.read_bytes() for p in cache.files()}
    code, doc = verify(cache)
    assert code == 1 and not doc["ok"]
    assert sorted(p["path"] for p in doc["problems"]) == sorted(map(str, bad))
    assert all(p["reason"] for p in doc["problems"])
    result = cache.run("verify")
    assert result.exit_code == 1
    for path in bad:
        assert path.name[:16] in result.stdout
    assert {p: p.read_bytes() for p in cache.files()} == before  # verify changes nothing


def test_verify_reports_old_temp_files_and_unreadable_manifests(cache):
    fresh = cache.tiny.agents / ".x.json.1234abcd.tmp"
    fresh.write_bytes(b"{")
    old = cache.tiny.blocks / "ab" / ".ab.safetensors.0000aaaa.tmp"
    old.parent.mkdir(exist_ok=True)
    old.write_bytes(b"partial")
    age(old, DAY)
    broken = cache.demo.agent_path("carol")
    broken.write_bytes(b'{"version": 1, "agent": ')
    code, doc = verify(cache)
    assert code == 1
    assert {(p["path"], p["kind"]) for p in doc["problems"]} == {(str(old), "temp"), (str(broken), "manifest")}


# -- rm ------------------------------------------------------------------------------------


def test_rm_keeps_blocks_another_agent_uses(cache):
    shared, private = cache.alice.blocks[:2], cache.alice.blocks[2:]
    sizes = sum(cache.tiny.block_path(h).stat().st_size for h in private)
    manifest_size = cache.tiny.agent_path("alice").stat().st_size
    result = cache.run("rm", "alice", "-y", "--format", "json")
    assert result.exit_code == 0, result.output
    doc = json.loads(result.stdout)
    assert sorted(doc["removed_blocks"]) == sorted(private) and doc["kept_shared_blocks"] == 2
    assert doc["freed_bytes"] == sizes + manifest_size
    assert not cache.tiny.agent_path("alice").exists()
    assert all(cache.tiny.block_path(h).exists() for h in shared)
    assert not any(cache.tiny.block_path(h).exists() for h in private)
    assert cache.run("ls", "--format", "quiet").stdout.split() == ["bob", "carol"]
    assert verify(cache)[0] == 0  # bob is still sound
    assert cache.json("show", "bob")["totals"]["on_disk"] == 3


def test_rm_asks_first_and_refuses_unknown_agents(cache):
    result = cache.run("rm", "alice", input="n\n")
    assert result.exit_code == 1 and cache.tiny.agent_path("alice").exists()
    result = cache.run("rm", "alice", input="y\n")
    assert result.exit_code == 0 and "freed" in result.stdout and not cache.tiny.agent_path("alice").exists()
    result = cache.run("rm", "alice", "-y")
    assert result.exit_code == 1 and "no agent alice" in result.stderr


# -- prune ---------------------------------------------------------------------------------


def test_prune_dry_run_deletes_nothing(cache):
    before = cache.files()
    result = cache.run("prune", "--older-than", "7d", "--dry-run", "--format", "json")
    assert result.exit_code == 0, result.output
    doc = json.loads(result.stdout)
    assert doc["dry_run"] and doc["older_than_s"] == 7 * DAY
    assert {(i["kind"], i["name"]) for i in doc["removed"]} == {
        ("agent", "alice"),
        *(("block", h) for h in cache.alice.blocks[2:]),
        ("block", cache.orphan),
    }
    assert doc["freed_bytes"] > 0 and cache.files() == before
    human = cache.run("prune", "--older-than", "7d", "--dry-run")
    assert "would free" in human.stdout and cache.files() == before


def test_prune_removes_only_old_agents_orphans_and_old_temp_files(cache):
    old_tmp = cache.tiny.agents / ".y.json.00000000.tmp"
    old_tmp.write_bytes(b"x" * 10)
    age(old_tmp, DAY)
    old_model_tmp = cache.tiny.root / ".model.json.22222222.tmp"  # a model.json write cut short
    old_model_tmp.write_bytes(b"{")
    age(old_model_tmp, DAY)
    fresh_tmp = cache.tiny.agents / ".z.json.11111111.tmp"
    fresh_tmp.write_bytes(b"x")
    fresh_orphan = BlockNames(FP_TINY, 4).block_hash(None, [5, 5, 5, 5])
    write_block(cache.tiny, FP_TINY, fresh_orphan, None, 0, [5, 5, 5, 5])  # maybe the server's write under way
    gone = [
        cache.tiny.agent_path("alice"),
        old_tmp,
        old_model_tmp,
        *(cache.tiny.block_path(h) for h in [*cache.alice.blocks[2:], cache.orphan]),
    ]
    expected = sum(p.stat().st_size for p in gone)

    result = cache.run("prune", "--older-than", "1w", "-y", "--format", "json")
    assert result.exit_code == 0, result.output
    assert json.loads(result.stdout)["freed_bytes"] == expected
    assert not any(p.exists() for p in gone)
    assert fresh_tmp.exists() and cache.tiny.block_path(fresh_orphan).exists()
    assert cache.run("ls", "--format", "quiet").stdout.split() == ["bob", "carol"]
    assert all(cache.tiny.block_path(h).exists() for h in cache.bob.blocks[:3])
    assert verify(cache)[0] == 0


def test_prune_without_age_keeps_agents_and_empties_quarantine_on_request(cache):
    cache.tiny.quarantine_dir.mkdir()
    (cache.tiny.quarantine_dir / "1-x.safetensors").write_bytes(b"q" * 100)
    result = cache.run("prune", "-y", "--format", "json")
    assert {i["kind"] for i in json.loads(result.stdout)["removed"]} == {"block"}  # the orphan only
    assert cache.run("ls", "--format", "quiet").stdout.split() == ["bob", "carol", "alice"]
    assert (cache.tiny.quarantine_dir / "1-x.safetensors").exists()
    result = cache.run("prune", "--quarantine", "-y", "--format", "json")
    assert [i["kind"] for i in json.loads(result.stdout)["removed"]] == ["quarantine"]
    assert not any(cache.tiny.quarantine_dir.iterdir())


def test_prune_refuses_a_bad_duration(cache):
    result = cache.run("prune", "--older-than", "7 days")
    assert result.exit_code == 2 and cache.tiny.agent_path("alice").exists()


@pytest.mark.timeout(60)
def test_links_and_fifos_neither_hang_the_commands_nor_lead_them_outside(cache, tmp_path):
    """Links planted as quarantine/, as a blocks/xx folder, as a manifest, as a block file and
    as a temp file, and FIFOs named like a manifest, a block and a quarantined file: every
    command lists them without opening them, and prune deletes nothing outside the cache nor
    anything but files. (The server's side: tests/test_disk_safety.py.)"""
    outside = tmp_path / "outside"
    (outside / "quarantine").mkdir(parents=True)
    (outside / "quarantine" / "1-x.safetensors").write_bytes(b"q")
    decoy = BlockNames(FP_TINY, 4).block_hash(None, [9, 9, 9, 9])
    decoys = Folder(outside)
    decoys.blocks.mkdir()
    write_block(decoys, FP_TINY, decoy, None, 0, [9, 9, 9, 9])  # a block file prune would take for an orphan
    (outside / "manifest.json").write_bytes(cache.tiny.agent_path("bob").read_bytes())
    (outside / "old.tmp").write_bytes(b"t")
    (outside / "orphan.safetensors").write_bytes(decoys.block_path(decoy).read_bytes())
    for path in [*outside.rglob("*")]:
        age(path, 2 * DAY)
    (cache.tiny.root / "quarantine").symlink_to(outside / "quarantine")
    (cache.tiny.blocks / decoy[:2]).symlink_to(decoys.block_path(decoy).parent)
    (cache.demo.agents / "0123456789abcdef0123456789abcdef.json").symlink_to(outside / "manifest.json")
    (cache.tiny.agents / ".z.json.00000000.tmp").symlink_to(outside / "old.tmp")
    linked_block = cache.tiny.block_path(BlockNames(FP_TINY, 4).block_hash(None, [8, 8, 8, 8]))
    linked_block.parent.mkdir(exist_ok=True)
    linked_block.symlink_to(outside / "orphan.safetensors")  # named like an old orphan block
    fifos = [
        cache.tiny.agents / "fifo.json",
        cache.tiny.block_path(cache.bob.blocks[3]),  # bob's cold block, as a FIFO
        cache.demo.quarantine_dir / "1-fifo.safetensors",
    ]
    for fifo in fifos:
        fifo.parent.mkdir(exist_ok=True)
        os.mkfifo(fifo)
    before = {p: p.read_bytes() for p in outside.rglob("*") if p.is_file()}

    assert cache.run("ls", "--format", "quiet").stdout.split() == ["bob", "carol", "alice"]
    code, doc = verify(cache)
    strays = {p["path"] for p in doc["problems"] if p["kind"] == "stray"}
    assert code == 1 and {str(f) for f in fifos[:2]} | {str(linked_block)} <= strays
    assert {p["kind"] for p in doc["problems"]} == {"stray"}
    assert cache.json("stats")["total"]["quarantined_files"] == 0
    result = cache.run("prune", "--older-than", "1s", "--quarantine", "-y", "--format", "json")
    assert result.exit_code == 0, result.output
    assert {i["kind"] for i in json.loads(result.stdout)["removed"]} == {"agent", "block"}
    assert cache.run("ls", "--format", "quiet").stdout == ""
    assert {p: p.read_bytes() for p in outside.rglob("*") if p.is_file()} == before
    assert all(f.exists() for f in fifos) and linked_block.is_symlink()


# -- stats ---------------------------------------------------------------------------------


def test_stats_per_model_and_total(cache):
    cache.tiny.quarantine_dir.mkdir()
    (cache.tiny.quarantine_dir / "1-x.safetensors").write_bytes(b"q" * 100)
    (cache.tiny.quarantine_dir / "1-x.safetensors.why").write_bytes(b"checksum\n")
    (cache.tiny.agents / ".t.json.22222222.tmp").write_bytes(b"x")
    doc = cache.json("stats")
    models = {m["folder"]: m for m in doc["models"]}
    tiny, demo = models[cache.tiny.root.name], models[cache.demo.root.name]
    tiny_bytes = sum(p.stat().st_size for p in cache.tiny.blocks.rglob("*.safetensors"))
    assert tiny == {
        "model": cache.tiny.root.name,
        "folder": cache.tiny.root.name,
        "agents": 2,
        "stored_responses": 0,
        "block_files": 6,  # alice 4, bob's own 1, the orphan
        "bytes": tiny_bytes,
        "cold_blocks": 1,
        "orphan_blocks": 1,
        "quarantined_files": 2,
        "quarantined_bytes": 109,
        "temp_files": 1,
    }
    assert (demo["agents"], demo["block_files"], demo["cold_blocks"]) == (1, 2, 0)
    assert doc["total"]["agents"] == 3 and doc["total"]["block_files"] == 8
    assert doc["total"]["bytes"] == tiny_bytes + demo["bytes"]
    result = cache.run("stats")
    assert result.exit_code == 0 and "total" in result.stdout and human_bytes(doc["total"]["bytes"]) in result.stdout


# -- helpers and the real command line -----------------------------------------------------


def test_durations_sizes_and_ages():
    assert parse_duration("90s") == 90 and parse_duration("15m") == 900 and parse_duration("1d12h") == 1.5 * DAY
    assert parse_duration("2w") == 14 * DAY and parse_duration("1.5h") == 5400
    for bad in ("7", "7 days", "", "d7", "-1d"):
        with pytest.raises(typer.BadParameter):
            parse_duration(bad)
    assert [human_bytes(n) for n in (0, 999, 1024, 3 << 20, 5 << 30)] == [  # decimal, as hf cache's
        "0 bytes",
        "999 bytes",
        "1.0 kB",
        "3.1 MB",
        "5.4 GB",
    ]
    now = 1_000_000.0
    assert [human_age(now - s, now) for s in (0, 5, 180, 7200, 3 * DAY, 21 * DAY)] == [
        "just now",
        "5s ago",
        "3m ago",
        "2h ago",
        "3d ago",
        "3w ago",
    ]


def test_hostile_agent_ids_stay_on_one_line(tmp_path):
    layout = make_folder(tmp_path, "tiny", FP_TINY)
    write_agent(layout, FP_TINY, 4, "evil\n[red]id\x1b[2J", [1, 2, 3], time.time())
    result = CliRunner().invoke(cache_app, ["ls", "--cache-dir", str(tmp_path), "--format", "quiet"])
    assert result.stdout == '"evil\\n[red]id\\u001b[2J"\n'
    result = CliRunner().invoke(cache_app, ["ls", "--cache-dir", str(tmp_path)])
    assert "[red]id" in result.stdout and "\x1b" not in result.stdout


def test_the_cache_commands_never_import_mlx(cache):
    code = (
        "import sys\n"
        "from typer.testing import CliRunner\n"
        "import agent_memory.cli.cache.commands as c\n"
        "for cmd in ('ls', 'stats', 'verify'):\n"
        f"    r = CliRunner().invoke(c.cache_app, [cmd, '--cache-dir', {str(cache.root)!r}])\n"
        "    assert r.exit_code == 0, r.output\n"
        "loaded = [m for m in sys.modules if m.startswith('mlx')]\n"
        "assert not loaded, loaded\n"
    )
    subprocess.run([sys.executable, "-c", code], check=True, cwd=REPO, timeout=120)


def _cache_is_registered() -> bool:
    from agent_memory.cli import app

    return "cache" in typer.main.get_command(app).commands


@pytest.mark.skipif(not _cache_is_registered(), reason="`cache` is not yet a command of agent_memory.cli.app")
def test_python_dash_m_agent_memory_cache_ls(cache):
    result = subprocess.run(
        [sys.executable, "-m", "agent_memory", "cache", "ls", "--cache-dir", str(cache.root), "--format", "json"],
        capture_output=True,
        text=True,
        check=False,
        cwd=REPO,
        timeout=120,
    )
    assert result.returncode == 0, result.stderr
    assert sorted(a["id"] for a in json.loads(result.stdout)["agents"]) == ["alice", "bob", "carol"]

"""What the disk and its neighbours can do to the server, through real server processes and
the real command line: a full or read-only disk, a disk budget larger than the disk, links
and FIFOs planted in the cache folder, a folder readable by others, a delete racing a turn in
flight, a file the writer cannot write. None may stop the server, lose what it acknowledged,
or lead it outside its folder.

The small disks are tmpfs mounts (root on Linux); where mounting is refused those tests skip.
"""

from __future__ import annotations

import errno
import json
import os
import shutil
import stat
import subprocess
import threading
import time
from contextlib import contextmanager
from pathlib import Path

import httpx
import pytest

from agent_memory.memory.warm.folder.paths import Folder, model_folders
from agent_memory.memory.warm.format.records import Manifest
from tests.support.chat import ask, tiers
from tests.support.cli import cache_cli
from tests.support.inprocess import InProcessServer

MiB = 1 << 20
STORY = "The keeper wrote down the ships, the weather and the lamps of every night on the cape. "


def conversation(agent: str, words: int = 150) -> list[dict]:
    """A conversation of its own for each agent: no block is shared between two of them."""
    return [
        {"role": "system", "content": f"You are {agent}, keeper of the records. " + STORY * (words // 15)},
        {"role": "user", "content": f"{agent}: what happened last night?"},
    ]


def wait_for(predicate, timeout: float = 30) -> None:
    deadline = time.monotonic() + timeout
    while not predicate():
        assert time.monotonic() < deadline, "timed out"
        time.sleep(0.05)


def health(server: InProcessServer) -> dict:
    response = httpx.get(server.base_url + "/health", timeout=10)
    assert response.status_code == 200, response.text
    return response.json()


def listed(server: InProcessServer) -> dict:
    return httpx.get(server.base_url + "/v1/agents", timeout=30).json()


def kv_folder(cache_dir: Path) -> Folder:
    (folder,) = model_folders(cache_dir / "kv")
    return folder


def free_bytes(path: Path) -> int:
    st = os.statvfs(path)
    return st.f_bavail * st.f_frsize


# -- small disks ---------------------------------------------------------------------------


@contextmanager
def tmpfs(path: Path, size: int):
    """A file system of `size` bytes at `path`, unmounted afterwards; skip where not allowed."""
    path.mkdir(parents=True, exist_ok=True)
    try:
        done = subprocess.run(
            ["mount", "-t", "tmpfs", "-o", f"size={size}", "tmpfs", str(path)], capture_output=True, text=True
        )
    except FileNotFoundError:
        pytest.skip("no mount command: a small or full disk cannot be made here")
    if done.returncode != 0:
        pytest.skip(f"cannot mount a tmpfs here ({done.stderr.strip() or done.returncode}); root on Linux can")
    try:
        yield path
    finally:
        subprocess.run(["umount", "-l", str(path)], capture_output=True)


def fill(disk: Path) -> None:
    """A neighbour takes every byte left."""
    with open(disk / "filler", "ab", buffering=0) as f:
        chunk = b"\0" * (1 << 16)
        while chunk:
            try:
                f.write(chunk)
            except OSError as e:
                if e.errno != errno.ENOSPC:
                    raise
                chunk = chunk[: len(chunk) // 2]
    assert free_bytes(disk) == 0


# -- a cache folder from an earlier run ----------------------------------------------------


SEEDED = ("alice", "bob")


@pytest.fixture(scope="module")
def seeded(tiny_model, tmp_path_factory):
    """(a cache folder holding alice and bob, each agent's answer): copied by the tests."""
    cache = tmp_path_factory.mktemp("seeded") / "cache"
    with InProcessServer(tiny_model, cache) as s:
        answers = {a: ask(s.client(), conversation(a), a).choices[0].message.content for a in SEEDED}
    for log in cache.glob("*.log"):
        log.unlink()
    return cache, answers


def copy_seeded(seeded, to: Path) -> tuple[Path, Folder, dict[str, Manifest]]:
    shutil.copytree(seeded[0], to, symlinks=True)
    folder = kv_folder(to)
    manifests = {a: Manifest.read(folder.agent_path(a)) for a in SEEDED}
    return to, folder, manifests


# -- a: full and read-only disks -----------------------------------------------------------


@pytest.mark.timeout(120)
def test_a_full_or_read_only_disk_still_serves_and_says_why(tiny_model, tmp_path, seeded):
    logs = tmp_path / "logs"
    logs.mkdir()
    with tmpfs(tmp_path / "disk", 8 * MiB) as disk:
        cache, folder, _ = copy_seeded(seeded, disk / "cache")  # an earlier run's folder
        answers = seeded[1]
        fill(disk)

        # A new cache folder on the full disk: no warm tier, and why; requests are served.
        with InProcessServer(tiny_model, disk / "fresh", log=logs / "fresh.log") as s:
            warm = health(s)["warm_tier"]
            assert warm["status"] == "off" and "is full" in warm["reason"], warm
            assert str(disk) not in json.dumps(health(s))  # /health needs no key: it names no path
            assert ask(s.client(), conversation("alice"), "alice").choices[0].message.content == answers["alice"]
            assert "serving without the warm tier" in s.log() and "is full" in s.log()

        # The earlier folder: model.json is not rewritten, the agents' blocks load from disk.
        with InProcessServer(tiny_model, cache, log=logs / "full.log") as s:
            warm = health(s)["warm_tier"]  # capped by its disk: a note, not a fault
            assert warm["status"] == "on" and "MiB free" in warm["note"], warm
            assert str(disk) not in json.dumps(health(s))
            agents = {a["id"]: a for a in listed(s)["data"]}
            assert set(agents) == set(SEEDED) and all(a["blocks"]["warm"] > 0 for a in agents.values())
            for agent in SEEDED:
                r = ask(s.client(), conversation(agent), agent)
                assert r.choices[0].message.content == answers[agent]
                assert tiers(r)[1] > 0, (agent, tiers(r), r.usage.prompt_tokens, agents)  # warm tokens: read back from the full disk
            assert "disk budget is capped" in s.log()
        assert free_bytes(disk) > 0  # it gave the reserve back from its own blocks

        # A read-only disk: served from memory only, and said so.
        subprocess.run(["mount", "-o", "remount,ro", str(disk)], check=True)
        with InProcessServer(tiny_model, cache, log=logs / "ro.log") as s:
            warm = health(s)["warm_tier"]
            assert warm["status"] == "off" and "read-only file system" in warm["reason"], warm
            assert ask(s.client(), conversation("bob"), "bob").choices[0].message.content == answers["bob"]
            assert "serving without the warm tier" in s.log() and "read-only" in s.log()


# -- b: a budget larger than the disk ------------------------------------------------------


@pytest.mark.timeout(120)
def test_the_default_disk_budget_is_capped_to_what_a_small_disk_holds(tiny_model, tmp_path):
    size = 6 * MiB
    with tmpfs(tmp_path / "disk", size) as disk:
        lowest = [free_bytes(disk)]
        running = True

        def watch() -> None:  # the disk's free space, sampled all along
            while running:
                lowest[0] = min(lowest[0], free_bytes(disk))
                time.sleep(0.002)

        watcher = threading.Thread(target=watch)
        watcher.start()
        try:
            # The default budget, 10 GiB: more than the disk by far.
            with InProcessServer(tiny_model, disk / "cache", log=tmp_path / "server.log") as s:
                warm = health(s)["warm_tier"]
                budget = warm["budget_bytes"]
                assert warm["status"] == "on" and "capped" in warm["note"], warm  # a fact of the disk, not a fault
                assert 0 < budget < size
                for i in range(8):  # ~8 blocks of ~130 KiB each: twice what the disk holds
                    ask(s.client(), conversation(f"agent-{i}", words=300), f"agent-{i}", max_tokens=2)
                    totals = listed(s)
                    assert totals["disk_budget_bytes"] == budget
                    assert totals["disk_bytes"] <= budget
        finally:
            running = False
            watcher.join()
        log = s.log()
        assert log.count("disk budget is capped") == 1
        assert "No space left" not in log
        assert lowest[0] > 0, "the disk was filled"
        files = sum(f.stat().st_size for f in (disk / "cache").rglob("*.safetensors"))
        assert 0 < files <= budget
        assert cache_cli(disk / "cache", "verify").exit_code == 0


# -- c: links and FIFOs --------------------------------------------------------------------


def snapshot(root: Path) -> dict[str, object]:
    """Every path under root: a file's bytes, a link's target, or the kind of thing it is."""
    out = {}
    for p in sorted(root.rglob("*")):
        st = p.lstat()
        if stat.S_ISLNK(st.st_mode):
            out[str(p)] = ("link", os.readlink(p))
        elif stat.S_ISREG(st.st_mode):
            out[str(p)] = (oct(st.st_mode), p.read_bytes())
        else:
            out[str(p)] = oct(st.st_mode)
    return out


def distinct_prefixes(hashes: list[str], n: int) -> list[str]:
    chosen: list[str] = []
    for h in hashes:
        if all(h[:2] != c[:2] for c in chosen):
            chosen.append(h)
    assert len(chosen) >= n, "the seeded blocks share hash prefixes; seed longer conversations"
    return chosen[:n]


@pytest.mark.timeout(120)
def test_links_and_fifos_in_the_cache_folder_never_lead_the_server_outside(tiny_model, tmp_path, seeded):
    cache, folder, manifests = copy_seeded(seeded, tmp_path / "cache")
    alice, bob = manifests["alice"], manifests["bob"]
    a_link, a_fifo, b_linked_dir, b_damaged = distinct_prefixes(
        [*alice.blocks[:-1], *bob.blocks[:-1]][::-1], 4
    )  # a file named like a block, a FIFO so named, a block under a linked folder, a bad file
    outside = tmp_path / "outside"
    (outside / "quarantine").mkdir(parents=True)
    (outside / "quarantine" / "keep.txt").write_text("someone else's\n")
    (outside / "precious.txt").write_text("not the cache's\n")
    decoys = outside / "blocks"
    decoys.mkdir()

    block = folder.block_path
    block(a_link).unlink()
    block(a_link).symlink_to(outside / "precious.txt")
    block(a_fifo).unlink()
    os.mkfifo(block(a_fifo))
    shutil.copy(block(b_linked_dir), decoys / block(b_linked_dir).name)  # a block file prune could take
    shutil.rmtree(block(b_linked_dir).parent)
    block(b_linked_dir).parent.symlink_to(decoys)
    with open(block(b_damaged), "r+b") as f:
        f.truncate(100)  # read back, it fails its checks: the server quarantines it
    os.mkfifo(folder.agents / ("0" * 32 + ".json"))  # named like a manifest
    os.mkfifo(folder.blocks / block(a_link).parent.name / ("f" * 32 + ".safetensors"))
    folder.quarantine_dir.symlink_to(outside / "quarantine")
    before = snapshot(outside)

    s = InProcessServer(tiny_model, cache, log=tmp_path / "server.log").start(timeout=60)  # no FIFO hangs the start
    try:
        client = s.client(timeout=60)
        for agent in SEEDED:  # reads, recomputes, writes again
            ask(client, conversation(agent), agent)
            ask(client, conversation(agent) + [{"role": "user", "content": "And then?"}], agent)
        for agent in SEEDED:
            assert httpx.delete(f"{s.base_url}/v1/agents/{agent}", timeout=30).status_code == 200
        ask(client, conversation("carol"), "carol")
        assert health(s)["status"] == "ok"
    finally:
        s.stop()
    assert snapshot(outside) == before
    assert "could not quarantine" in s.log()  # quarantine/ is a link: the bad file stays where it was
    # What the server did not write is said once at start, counted: not only `cache verify` sees it.
    assert s.log().count("5 entries (2 links, 3 FIFOs) the server did not write") == 1, s.log()

    for args in (["verify"], ["prune", "--quarantine", "--yes"], ["ls"], ["stats"]):
        done = cache_cli(cache, *args)  # none hangs on a FIFO (timeout) or follows a link
        assert done.exit_code in (0, 1), done.output
    assert snapshot(outside) == before
    assert stat.S_ISFIFO((folder.agents / ("0" * 32 + ".json")).lstat().st_mode)
    assert block(b_linked_dir).parent.is_symlink()


# -- d: permissions ------------------------------------------------------------------------


def modes(kv: Path) -> dict[str, str]:
    """Every folder and file under kv/ whose mode is not 0700 / 0600."""
    wrong = {}
    for p in [kv, *kv.rglob("*")]:
        try:
            st = p.lstat()
        except FileNotFoundError:  # a temp file renamed meanwhile
            continue
        want = 0o700 if stat.S_ISDIR(st.st_mode) else 0o600
        if stat.S_IMODE(st.st_mode) != want:
            wrong[str(p.relative_to(kv))] = oct(stat.S_IMODE(st.st_mode))
    return wrong


@pytest.mark.timeout(120)
def test_the_cache_folder_is_private_after_a_run_even_if_it_was_not(tiny_model, tmp_path, seeded):
    cache, folder, _ = copy_seeded(seeded, tmp_path / "cache")
    folder.quarantine_dir.mkdir()
    (folder.quarantine_dir / "1-00000000-x.json").write_text("{")
    (folder.quarantine_dir / "1-00000000-x.json.why").write_text("bad manifest\n")
    kv = cache / "kv"
    for p in [kv, *kv.rglob("*")]:  # as an older version, or a copy with a loose umask, left it
        p.chmod(0o755 if p.is_dir() else 0o644)
    assert len(modes(kv)) > 10

    with InProcessServer(tiny_model, cache) as s:
        wait_for(lambda: folder.server_json.exists())
        ask(s.client(), conversation("carol"), "carol")
        ask(s.client(), conversation("alice") + [{"role": "user", "content": "And then?"}], "alice")
        wait_for(lambda: folder.agent_path("carol").exists())
        assert modes(kv) == {}  # server.json, new and old files, folders new and old
    assert modes(kv) == {}
    assert (folder.root / "model.json").exists() and list(folder.quarantine_dir.iterdir())


# -- e: a delete racing a turn in flight ---------------------------------------------------


def eos_ban(model: Path) -> dict[str, int]:
    """logit_bias that keeps the tiny model talking until max_tokens."""
    eos = json.loads((model / "config.json").read_text())["eos_token_id"]
    return {str(t): -100 for t in (eos if isinstance(eos, list) else [eos])}


@pytest.mark.timeout(120)
def test_a_delete_wins_over_a_turn_in_flight(tiny_model, tmp_path):
    cache = tmp_path / "cache"

    def delete_through_api(server: InProcessServer, agent: str) -> None:
        assert httpx.delete(f"{server.base_url}/v1/agents/{agent}", timeout=30).status_code == 200

    def delete_with_the_cli(server: InProcessServer, agent: str) -> None:
        done = cache_cli(cache, "rm", agent, "--yes")
        assert done.exit_code == 0 and "through the server" in done.output, done.output

    with InProcessServer(tiny_model, cache) as s:
        folder = kv_folder(cache)
        wait_for(lambda: folder.read_server_json() is not None)
        # Long enough a turn that the delete lands in it.
        for agent, delete, length in (("x", delete_through_api, 200), ("y", delete_with_the_cli, 200)):
            ask(s.client(), [{"role": "user", "content": f"Remember me, I am {agent}."}], agent)
            wait_for(lambda: folder.agent_path(agent).exists())
            stream = s.client(timeout=60).chat.completions.create(
                model="tiny",
                messages=[{"role": "user", "content": f"Remember me, I am {agent}."}, {"role": "user", "content": "Tell me everything."}],
                max_tokens=length,
                temperature=0,
                stream=True,
                logit_bias=eos_ban(tiny_model),
                extra_body={"prompt_cache_key": agent},
            )
            chunks = iter(stream)
            for _ in range(5):
                next(chunks)
            delete(s, agent)
            rest = list(chunks)
            assert len(rest) > 20, "the turn ended before the delete: nothing was in flight"
            assert rest[-1].choices[0].finish_reason == "length"
            assert agent not in [a["id"] for a in listed(s)["data"]]
        ask(s.client(), [{"role": "user", "content": "hello"}], "z")  # the writer moves on
        wait_for(lambda: folder.agent_path("z").exists())
        assert not folder.agent_path("x").exists() and not folder.agent_path("y").exists()
    # After the shutdown's flush too, and for the next server.
    assert not folder.agent_path("x").exists() and not folder.agent_path("y").exists()
    with InProcessServer(tiny_model, cache) as s:
        assert [a["id"] for a in listed(s)["data"]] == ["z"]


# -- f: a file the writer cannot write -----------------------------------------------------


@pytest.mark.timeout(120)
def test_the_writer_lives_through_a_file_it_cannot_write(tiny_model, tmp_path, seeded):
    cache, folder, manifests = copy_seeded(seeded, tmp_path / "cache")
    stuck = manifests["alice"].blocks[1]
    folder.block_path(stuck).unlink()
    folder.block_path(stuck).mkdir()  # a folder where the block file goes: every write fails
    (folder.block_path(stuck) / "x").write_text("x")

    with InProcessServer(tiny_model, cache) as s:
        for turn in range(3):  # each turn asks for the block to be written again
            more = [{"role": "user", "content": f"And then, {i}?"} for i in range(turn)]
            ask(s.client(), conversation("alice") + more, "alice")
        ask(s.client(), conversation("carol"), "carol")
        wait_for(lambda: folder.agent_path("carol").exists())
        body = health(s)
        assert body["status"] == "ok" and body["warm_tier"]["failed_writes"] >= 3
    log = s.log()
    assert log.count("save_block failed") == 1, log
    assert folder.block_path(stuck).is_dir()
    for agent in ("alice", "carol"):  # every other block and manifest was written
        manifest = Manifest.read(folder.agent_path(agent))
        missing = [h for h in manifest.blocks if h != stuck and not folder.block_path(h).is_file()]
        assert not missing
    assert cache_cli(cache, "verify").exit_code == 1  # the folder is named as a stray

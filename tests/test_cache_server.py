"""`agent-memory cache rm/prune` and a running server agree: the server records itself in its
model folder (server.json) and the commands end its agents through its API; a crashed server
leaves no claim, and one that does not answer stops the command before anything is deleted.
The commands run in this process (CliRunner: what is tested is their logic; `cache` as its own
process is started in tests/test_cache_cli.py); the server is a process where its record is
what is tested (its pid, a SIGKILL), else it serves in this process."""

from __future__ import annotations

import json
import os
import stat
import subprocess
import sys
import time

import httpx
import pytest

from agent_memory.memory.hashing import BlockNames
from agent_memory.memory.warm.folder.paths import Folder, model_folders
from agent_memory.memory.warm.format.records import Manifest
from tests.support.chat import ask
from tests.support.cli import cache_cli
from tests.support.inprocess import InProcessServer
from tests.support.server import Server, Serving, free_port
from tests.support.warm_folders import DAY, FP_TINY, age, make_folder, write_agent, write_block

pytestmark = pytest.mark.process

KEY = "s3cret-key"


def wait_for(predicate, timeout: float = 30) -> None:
    deadline = time.monotonic() + timeout
    while not predicate():
        assert time.monotonic() < deadline, "timed out"
        time.sleep(0.05)


def server_agents(server: Serving, **headers) -> list[str]:
    with server.http() as http:
        response = http.get("/v1/agents", headers=headers)
    assert response.status_code == 200, response.text
    return [a["id"] for a in response.json()["data"]]


def turn(server: Serving, agent: str, text: str, **kw) -> None:
    ask(server.client(**kw), [{"role": "user", "content": text}], agent)


# -- server.json without a server ----------------------------------------------------------


def test_server_json_is_a_claim_only_while_its_process_lives(tmp_path):
    folder = Folder(tmp_path / "kv" / "m-0123456789ab-kv16")
    folder.make()
    assert folder.read_server_json() is None
    folder.write_server_json("http://127.0.0.1:8123")
    record = folder.read_server_json()
    assert (record.pid, record.url) == (os.getpid(), "http://127.0.0.1:8123")
    assert abs(record.started - time.time()) < 60
    assert stat.S_IMODE(folder.server_json.stat().st_mode) == 0o600

    done = subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"], capture_output=True, text=True)
    dead = int(done.stdout)
    for claim in ({"pid": dead, "url": "http://x", "started": 1.0}, {"pid": 0, "url": "u", "started": 1}, [1]):
        folder.server_json.write_text(json.dumps(claim))
        assert folder.read_server_json() is None  # a crash (or a damaged file) claims nothing
    folder.server_json.write_text(json.dumps({"pid": dead, "url": "http://x", "started": 1.0}))
    folder.remove_server_json()
    assert folder.server_json.exists()  # another process's record is not ours to remove
    folder.write_server_json("http://127.0.0.1:8123")
    folder.remove_server_json()
    assert not folder.server_json.exists()


def test_a_server_that_does_not_answer_stops_rm_and_prune_before_any_deletion(tmp_path):
    root = tmp_path / "cache"
    layout = make_folder(root, "tiny", FP_TINY)
    write_agent(layout, FP_TINY, 4, "alice", list(range(1, 15)), time.time() - 10 * DAY)
    orphan = BlockNames(FP_TINY, 4).block_hash(None, [7, 7, 7, 7])
    age(write_block(layout, FP_TINY, orphan, None, 0, [7, 7, 7, 7]), 2 * DAY)
    layout.write_server_json(f"http://127.0.0.1:{free_port()}")  # this (live) process, nothing listening
    before = {p: p.read_bytes() for p in root.rglob("*") if p.is_file()}

    for args in (["rm", "alice", "-y"], ["prune", "--older-than", "1d", "-y"]):
        result = cache_cli(root, *args)
        assert result.exit_code == 1, result.stdout
        assert "does not answer" in result.stderr and "nothing was deleted" in result.stderr
        assert str(layout.server_json) in result.stderr
        assert {p: p.read_bytes() for p in root.rglob("*") if p.is_file()} == before
    result = cache_cli(root, "prune", "--older-than", "1d", "--dry-run")
    assert result.exit_code == 0 and "would free" in result.stdout  # a dry run asks no server


# -- a real server -------------------------------------------------------------------------


def test_cache_rm_and_prune_end_agents_through_the_running_server(tiny_model, tmp_path):
    cache_dir = tmp_path / "cache"
    alice = "team/../alice c?#%."  # an id no URL path may mangle
    with Server(tiny_model, cache_dir) as server:
        (folder,) = model_folders(cache_dir / "kv")
        wait_for(lambda: folder.read_server_json() is not None)  # written just after /health turns ok
        record = folder.read_server_json()
        assert (record.pid, record.url) == (server.proc.pid, server.base_url)
        shared = "You are a careful planner. " * 30
        turn(server, alice, shared + "Plan a trip.")
        turn(server, "bob", shared + "Plan a party.")
        wait_for(lambda: folder.agent_path(alice).exists() and folder.agent_path("bob").exists())

        result = cache_cli(cache_dir, "rm", alice, "--yes", "--format", "json")
        assert result.exit_code == 0, result.output
        doc = json.loads(result.stdout)
        assert doc["server"] == server.base_url and doc["removed_blocks"] and doc["kept_shared_blocks"] > 0
        assert not folder.agent_path(alice).exists()
        assert server_agents(server) == ["bob"]
        assert not any(folder.block_path(h).exists() for h in doc["removed_blocks"])

        turn(server, "bob", shared + "Plan a party. Then tidy up.")  # another agent's next turn
        turn(server, "carol", shared + "Plan a picnic.")
        wait_for(lambda: folder.agent_path("carol").exists())
        assert not folder.agent_path(alice).exists() and alice not in server_agents(server)
        listed = json.loads(cache_cli(cache_dir, "ls", "--format", "json").stdout)["agents"]
        assert sorted(a["id"] for a in listed) == ["bob", "carol"]

        time.sleep(4)  # bob is 4 s old; carol, a moment: --older-than 3s tells them apart on a busy machine
        recent = time.time()
        turn(server, "carol", shared + "Plan a picnic. Bring bread.")  # carol stays recent
        wait_for(lambda: Manifest.read(folder.agent_path("carol")).last_used >= recent)
        result = cache_cli(cache_dir, "prune", "--older-than", "3s", "--yes", "--format", "json")
        assert result.exit_code == 0, result.output
        assert [i["name"] for i in json.loads(result.stdout)["removed"] if i["kind"] == "agent"] == ["bob"]
        assert server_agents(server) == ["carol"] and not folder.agent_path("bob").exists()
        assert cache_cli(cache_dir, "verify").exit_code == 0

        server.kill()  # SIGKILL: server.json stays, naming a dead process
        assert folder.server_json.exists() and folder.read_server_json() is None
        result = cache_cli(cache_dir, "rm", "carol", "--yes", "--format", "json")
        assert result.exit_code == 0, result.output
        assert json.loads(result.stdout)["server"] is None and not folder.agent_path("carol").exists()


def test_cache_rm_takes_the_servers_api_key_from_the_settings(tiny_model, tmp_path):
    cache_dir = tmp_path / "cache"
    with InProcessServer(tiny_model, cache_dir, "--api-key", KEY) as server:
        (folder,) = model_folders(cache_dir / "kv")
        wait_for(lambda: folder.read_server_json() is not None)
        turn(server, "dora", "Hello, remember me.", api_key=KEY)
        wait_for(lambda: folder.agent_path("dora").exists())

        result = cache_cli(cache_dir, "rm", "dora", "--yes")
        assert result.exit_code == 1 and "AGENT_MEMORY_API_KEY" in result.stderr
        assert "api_key" in result.stderr and folder.agent_path("dora").exists()
        assert server_agents(server, authorization=f"Bearer {KEY}") == ["dora"]

        result = cache_cli(cache_dir, "rm", "dora", "--yes", env={"AGENT_MEMORY_API_KEY": KEY})
        assert result.exit_code == 0, result.output
        assert "through the server" in result.stdout and not folder.agent_path("dora").exists()
        assert server_agents(server, authorization=f"Bearer {KEY}") == []
        server.stop()  # a clean shutdown, as at SIGTERM: uvicorn's exit, the app's lifespan ends
    assert not folder.server_json.exists()  # a clean shutdown takes the record away
    with pytest.raises(httpx.HTTPError):
        httpx.get(server.base_url + "/health", timeout=2)

"""The warm tier through real servers: restarts, kills during writes, damaged and foreign files,
and agent ids that try to become paths. A kill or a signal is a process's (`Server`); a graceful
restart is an in-process server stopped and another started on the same folder."""

from __future__ import annotations

import random
import signal
import threading
import time
from pathlib import Path

import httpx
import pytest

from agent_memory.memory.warm.format import blockfile
from agent_memory.memory.warm.format.records import Manifest
from tests.support.chat import ask, tiers
from tests.support.inprocess import InProcessServer
from tests.support.server import Server

pytestmark = pytest.mark.process
SYSTEM = "You keep the records of the lighthouse on the northern cape. " * 12


def conversation(i: int) -> list[dict]:
    return [
        {"role": "system", "content": SYSTEM},
        {"role": "user", "content": f"Entry {i}: what happened on the night of the storm number {i}?"},
    ]


def kv_folder(cache_dir: Path) -> Path:
    (folder,) = (cache_dir / "kv").iterdir()
    return folder


def check_folder(folder: Path) -> None:
    """What `cache verify` checks: every block and manifest reads back whole; no temp files."""
    for f in (folder / "blocks").rglob("*.safetensors"):
        blockfile.read(f, {"hash": f.stem}, None)
    for m in (folder / "agents").glob("*.json"):
        Manifest.read(m)
    assert not [p for p in folder.rglob("*") if p.name.endswith(".tmp")]


@pytest.fixture(scope="module")
def fresh_answers(tiny_model, tmp_path_factory):
    """Each conversation's answer from a server that never saw it."""
    with InProcessServer(tiny_model, tmp_path_factory.mktemp("fresh"), "--disk-budget-mb", "0") as s:
        return {i: ask(s.client(), conversation(i), None).choices[0].message.content for i in range(6)}


def test_restart_loads_agents_from_disk_with_unchanged_output(tiny_model, tmp_path, fresh_answers):
    with InProcessServer(tiny_model, tmp_path) as s:
        for i in range(3):
            ask(s.client(), conversation(i), f"agent-{i}")
    # A graceful stop flushes every pending write first.
    with InProcessServer(tiny_model, tmp_path) as s:
        listed = httpx.get(s.base_url + "/v1/agents").json()
        assert sorted(a["id"] for a in listed["data"]) == ["agent-0", "agent-1", "agent-2"]
        assert all(a["blocks"]["cold"] == 0 and a["blocks"]["warm"] > 0 for a in listed["data"])
        for i in range(3):
            r = ask(s.client(), conversation(i), f"agent-{i}")
            hot, warm = tiers(r)
            assert hot + warm >= r.usage.prompt_tokens - 2 and warm > 0
            # The first to return loads the shared system prompt; later agents find it hot.
            assert (hot == 0) if i == 0 else (hot > 0)
            assert r.choices[0].message.content == fresh_answers[i]
    check_folder(kv_folder(tmp_path))


def test_kills_during_writes_leave_a_consistent_cache(tiny_model, tmp_path, fresh_answers):
    """Four kills, each while two clients' turns are being written; each restart is checked and
    then is the next round's server (one start a round)."""
    rng = random.Random(7)
    s = Server(tiny_model, tmp_path).start()
    try:
        for round_ in range(4):

            def traffic(s=s, round_=round_):
                client = s.client(timeout=30)
                for i in range(6):
                    try:
                        ask(client, conversation(i) + [{"role": "user", "content": f"round {round_}"}], f"agent-{i}")
                    except Exception:  # the server is killed under it
                        return

            workers = [threading.Thread(target=traffic) for _ in range(2)]
            for w in workers:
                w.start()
            time.sleep(rng.uniform(0.2, 1.5))
            s.kill()
            for w in workers:
                w.join()
            s = Server(tiny_model, tmp_path).start()
            check_folder(kv_folder(tmp_path))  # the start removed temp files; everything left reads back
            for agent in httpx.get(s.base_url + "/v1/agents").json()["data"]:
                i = int(agent["id"].split("-")[1])
                r = ask(s.client(), conversation(i), agent["id"])
                assert r.choices[0].message.content == fresh_answers[i]
    finally:
        s.stop()


@pytest.mark.parametrize("damage", ["truncate", "flip", "swap", "foreign"])
def test_damaged_or_foreign_files_are_misses_and_quarantined(tiny_model, tmp_path, fresh_answers, damage):
    with InProcessServer(tiny_model, tmp_path) as s:
        ask(s.client(), conversation(0), "victim")
        ask(s.client(), conversation(1), "other")
    folder = kv_folder(tmp_path)
    victim = Manifest.read(next(m for m in (folder / "agents").glob("*.json") if Manifest.read(m).key.id == "victim"))
    other = Manifest.read(next(m for m in (folder / "agents").glob("*.json") if Manifest.read(m).key.id == "other"))
    private = [h for h in victim.blocks if h not in other.blocks]
    target = folder / "blocks" / private[0][:2] / f"{private[0]}.safetensors"
    data = bytearray(target.read_bytes())
    if damage == "truncate":
        target.write_bytes(bytes(data[: len(data) // 2]))
    elif damage == "flip":
        data[len(data) // 2] ^= 0x01
        target.write_bytes(bytes(data))
    elif damage == "swap":  # another block's file under this block's name
        donor = next(f for f in (folder / "blocks").rglob("*.safetensors") if f != target)
        target.write_bytes(donor.read_bytes())
    else:  # a block from another model, same name
        header_len = int.from_bytes(data[:8], "little")
        header = data[8 : 8 + header_len].decode().replace(victim.fingerprint, "0" * len(victim.fingerprint))
        target.write_bytes(bytes(data[:8]) + header.encode() + bytes(data[8 + header_len :]))
    with InProcessServer(tiny_model, tmp_path) as s:
        r = ask(s.client(), conversation(0), "victim")  # a 200, recomputing what was lost
        assert r.choices[0].message.content == fresh_answers[0]
        hot, warm = tiers(r)
        assert warm < r.usage.prompt_tokens - 1
        why = list((folder / "quarantine").glob("*.why"))
        assert len(why) == 1 and why[0].read_text().strip()
        assert "quarantined" in s.log()
    # The recomputed block was written again, whole this time.
    check_folder(folder)
    assert blockfile.read(target, {"hash": target.stem}, None)


def test_agent_ids_never_become_paths(tiny_model, tmp_path):
    cache = tmp_path / "cache"
    hostile = ["../../outside", "/etc/passwd", "a/../../b", "..", "con", "x" * 256, "名前 :*?<>|\\", "%2e%2e%2f"]
    with InProcessServer(tiny_model, cache) as s:
        for agent in hostile:  # as `user`: prompt_cache_key stops at 64 characters, as OpenAI's does
            s.client().chat.completions.create(
                model="tiny", messages=[{"role": "user", "content": "hi"}], max_tokens=2, temperature=0, user=agent
            )
        listed = {a["id"] for a in httpx.get(s.base_url + "/v1/agents").json()["data"]}
        assert listed == set(hostile)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["cache"]
    manifests = list((kv_folder(cache) / "agents").iterdir())
    assert len(manifests) == len(hostile)
    assert all(len(m.stem) == 32 and m.suffix == ".json" for m in manifests)
    assert {Manifest.read(m).key.id for m in manifests} == set(hostile)


def test_sigterm_flushes_pending_writes(tiny_model, tmp_path):
    s = Server(tiny_model, tmp_path).start()
    for i in range(4):
        ask(s.client(), conversation(i), f"agent-{i}")
    # uvicorn shuts down gracefully, then ends by the signal it caught.
    assert s.stop(signal.SIGTERM) == -signal.SIGTERM
    assert "flushing the warm tier" in s.log()
    folder = kv_folder(tmp_path)
    assert len(list((folder / "agents").glob("*.json"))) == 4
    named = {h for m in (folder / "agents").glob("*.json") for h in Manifest.read(m).blocks}
    files = {f.stem for f in (folder / "blocks").rglob("*.safetensors")}
    assert named == files


def test_a_server_at_another_precision_says_the_cached_kv_is_not_used(tiny_model, tmp_path):
    with InProcessServer(tiny_model, tmp_path, "--kv-bits", "16") as s:
        ask(s.client(), conversation(0), "agent-0")
    with InProcessServer(tiny_model, tmp_path, "--kv-bits", "4") as s:
        r = ask(s.client(), conversation(0), "agent-0")
        assert tiers(r) == (0, 0)  # 16-bit blocks are not read as 4-bit ones
        assert "also cached at other precisions" in s.log() and "kv16" in s.log()

"""The memory of a model split over two processes, sharded like the model (issue #38): each rank
writes its part of every block to its own folder (`-tp2r0`, `-tp2r1`), only rank 0 keeps
manifests; a restart of both ranks restores every rank's part, so the agent's next turn reads
its history from disk on every rank and answers as one process does (a block one rank lost is
recomputed by both, a file rank 0 does not hold is deleted on rank 1); folders whose parts were
swapped are not reused: one line says why, and every rank starts cold; nor are they by one
process on the same cache dir."""

from __future__ import annotations

import json
import os
import signal

import httpx
import pytest
from typer.testing import CliRunner

from agent_memory.cli.cache.commands import cache_app
from tests.support.distributed import Launched
from tests.support.inprocess import InProcessServer

pytestmark = pytest.mark.process

TURN_1 = [{"role": "user", "content": "Agent memory: " + " ".join(f"fact {i} is {i * 3 % 7}." for i in range(40))}]


def ask(base_url: str, messages: list) -> dict:
    body = {"model": "tiny", "messages": messages, "max_tokens": 12, "temperature": 0}
    answer = httpx.post(f"{base_url}/v1/chat/completions", json=body, headers={"X-Agent-Id": "keeper"}, timeout=300)
    assert answer.status_code == 200, answer.text
    return answer.json()


def turn_2(reply: str) -> list:
    return [*TURN_1, {"role": "assistant", "content": reply}, {"role": "user", "content": "And fact 7?"}]


def served(launched: Launched, messages: list) -> dict:
    """One answer from a fresh start of the two ranks, which are then stopped (their writes done)."""
    try:
        launched.health()
        answer = ask(f"http://127.0.0.1:{launched.port}", messages)
        os.kill(launched.rank_0_pid(), signal.SIGTERM)
        log = launched.ended()
        assert "rank 0 stopped: stopping" in log  # rank 1 too wrote what it was told before it exited
        return answer
    finally:
        launched.stop()


def test_a_restart_of_both_ranks_restores_every_ranks_part_and_swapped_parts_start_cold(tiny_model, tmp_path):
    with InProcessServer(tiny_model, tmp_path / "one", "--kv-bits", "16", "--speculation", "off") as one:
        first = ask(one.base_url, TURN_1)["choices"][0]["message"]["content"]
        expected = ask(one.base_url, turn_2(first))["choices"][0]["message"]["content"]

    cache = tmp_path / "cache"
    answer = served(Launched(tiny_model, cache), TURN_1)
    assert answer["choices"][0]["message"]["content"] == first
    rank_0, rank_1 = sorted((cache / "kv").glob("*-tp2r*"))
    assert (rank_0.name[-5:], rank_1.name[-5:]) == ("tp2r0", "tp2r1")
    blocks = {p.name for p in (rank_0 / "blocks").glob("*/*")}
    assert blocks and blocks == {p.name for p in (rank_1 / "blocks").glob("*/*")}  # each rank its part
    assert list((rank_0 / "agents").glob("*.json")) and not list((rank_1 / "agents").glob("*.json"))
    # `agent-memory cache` sees one agent; rank 1's blocks are rank 0's agents', not orphans to prune.
    stats = CliRunner().invoke(cache_app, ["stats", "--cache-dir", str(cache), "--format", "json"])
    rows = {row["folder"]: row for row in json.loads(stats.output)["models"]}
    assert [rows[f.name]["agents"] for f in (rank_0, rank_1)] == [1, 0]
    assert rows[rank_1.name]["block_files"] == len(blocks) and rows[rank_1.name]["orphan_blocks"] == 0
    for block in (rank_1 / "blocks").glob("*/*"):
        os.utime(block, (block.stat().st_atime, block.stat().st_mtime - 3600))  # past prune's grace
    pruned = CliRunner().invoke(cache_app, ["prune", "--cache-dir", str(cache), "--dry-run"])
    assert "0 items" in pruned.output, pruned.output

    stray = rank_1 / "blocks" / "ff" / ("ff" * 32 + ".safetensors")  # as a crash could leave: no manifest names it
    stray.parent.mkdir(exist_ok=True)
    stray.write_bytes(next((rank_1 / "blocks").glob("*/*")).read_bytes())

    lost = sorted((rank_1 / "blocks").glob("*/*"))[0]  # one block's part lost on rank 1 alone
    lost.unlink()

    launched = Launched(tiny_model, cache)
    answer = served(launched, turn_2(first))
    assert answer["choices"][0]["message"]["content"] == expected  # as one process answers
    assert not stray.exists()  # rank 0 told rank 1 the blocks it holds
    details = answer["usage"]["prompt_tokens_details"]
    assert details["warm_tokens"] > 0  # read from disk, on every rank: the others' parts
    assert details["cache_miss"]["reason"] == "unreadable"  # the lost one recomputed by both ranks
    log = launched.log()
    assert f"rank=1/2 agent_memory.engine.distributed.follower: block {lost.stem[:12]} unreadable here" in log
    assert f"block {lost.stem[:12]} unreadable (another rank could not read its part)" in log
    assert "not reused" not in log

    # The ranks' folders swapped: rank 0's now holds rank 1's heads.
    rank_0.rename(cache / "kv" / "swapping")
    rank_1.rename(rank_0)
    (cache / "kv" / "swapping").rename(rank_1)
    launched = Launched(tiny_model, cache)
    answer = served(launched, turn_2(first))
    assert answer["choices"][0]["message"]["content"] == expected
    assert answer["usage"]["prompt_tokens_details"]["cached_tokens"] == 0  # cold: nothing reused
    lines = [line for line in launched.log().splitlines() if "not reused" in line]
    assert len(lines) == 1, lines
    assert "rank=0/2" in lines[0]
    assert "starting cold: rank 0's folder holds the part of rank 1, not its own" in lines[0]

    # One process on the same cache dir: other folders, said once.
    with InProcessServer(tiny_model, cache, "--kv-bits", "16", "--speculation", "off") as alone:
        assert ask(alone.base_url, turn_2(first))["usage"]["prompt_tokens_details"]["cached_tokens"] == 0
        said = [line for line in alone.log().splitlines() if "not reused" in line]
    assert len(said) == 1 and f"{rank_0.name}, {rank_1.name}: memory of a 2-way tensor split" in said[0], said
    assert "this server is one process" in said[0]


def test_a_shared_redis_warm_tier_is_refused_split_with_the_reason():
    from agent_memory.cli.distributed import flag_refusal
    from agent_memory.config import Settings

    why = flag_refusal(Settings(model=["tiny"], warm_store="redis://127.0.0.1:6379"), 2)
    assert why.startswith("--warm-store: a model split over processes keeps its warm tier in each rank's own cache")
    assert flag_refusal(Settings(model=["tiny"], warm_store="redis://127.0.0.1:6379", disk_budget_mb=0), 2) is None

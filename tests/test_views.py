"""One truth in every view: /v1/agents (the dashboard's data), /metrics, `cache ls` and `cache
stats` count the same agents — on disk and held by the server, only in the server's memory, and
on disk with no server — and count stored Responses-API responses apart; `cache rm` of a stored
response leaves none of its files."""

from __future__ import annotations

import json
import time

import httpx

from tests.support.chat import ask
from tests.support.cli import cache_json
from tests.support.inprocess import InProcessServer
from tests.support.metrics import metric


def manifests(cache_dir) -> list:
    return sorted((cache_dir / "kv").glob("*/agents/*.json"))


def wait_for(condition, timeout: float = 30) -> None:
    deadline = time.monotonic() + timeout
    while not condition():
        assert time.monotonic() < deadline, "timed out"
        time.sleep(0.1)


def views(server, cache_dir) -> dict:
    listing = httpx.get(server.base_url + "/v1/agents").json()
    ls = cache_json(cache_dir, "ls")
    return {
        "/v1/agents": (len(listing["data"]), listing["stored_responses"]),
        "totals": (listing["agents"], listing["stored_responses"]),
        "/metrics": (metric(server, "agent_memory_agents"), metric(server, "agent_memory_stored_responses")),
        "cache ls": (len(ls["agents"]), ls["stored_responses"]),
    }


def test_every_view_counts_the_same_agents(tiny_model, tmp_path):
    cache_dir = tmp_path / "cache"
    with InProcessServer(tiny_model, cache_dir) as server:
        client = server.client()
        for agent in ("a", "b", "c"):
            ask(client, [{"role": "user", "content": f"hello {agent}"}], agent)
        response = client.responses.create(model="tiny", input="Remember me.", max_output_tokens=4, temperature=0)
        wait_for(lambda: len(manifests(cache_dir)) == 4)  # three agents and the response, written
        assert set(views(server, cache_dir).values()) == {(3, 1)}
        assert {a["where"] for a in cache_json(cache_dir, "ls")["agents"]} == {"disk+server"}

        # An agent only in the server's memory (its manifest not written, here: taken away).
        stem = next(p for p in manifests(cache_dir) if json.loads(p.read_text())["agent"] == "c")
        stem.unlink()
        assert set(views(server, cache_dir).values()) == {(3, 1)}
        where = {a["id"]: a["where"] for a in cache_json(cache_dir, "ls")["agents"]}
        assert where == {"a": "disk+server", "b": "disk+server", "c": "server"}

        # Removing the stored response through `cache rm` goes through the server: both its KV
        # and its conversation file go.
        assert list((cache_dir / "responses").glob("*.json"))
        cache_json(cache_dir, "rm", "-y", response.id)
        assert views(server, cache_dir)["/v1/agents"] == (3, 0)
        wait_for(lambda: not list((cache_dir / "responses").glob("*.json")))

    # No server: the disk's agents, in `ls` and `stats` alike.
    assert [(a["id"], a["where"]) for a in sorted(cache_json(cache_dir, "ls")["agents"], key=lambda a: a["id"])] == [
        ("a", "disk"),
        ("b", "disk"),
    ]
    assert (cache_json(cache_dir, "stats")["total"]["agents"], cache_json(cache_dir, "stats")["total"]["stored_responses"]) == (2, 0)


def test_cache_rm_of_a_stored_response_with_no_server_leaves_none_of_its_files(tiny_model, tmp_path):
    cache_dir = tmp_path / "cache"
    with InProcessServer(tiny_model, cache_dir) as server:
        response = server.client().responses.create(model="tiny", input="Hi.", max_output_tokens=4, temperature=0)
        wait_for(lambda: len(manifests(cache_dir)) == 1 and list((cache_dir / "responses").glob("*.json")))
    assert cache_json(cache_dir, "ls")["stored_responses"] == 1
    cache_json(cache_dir, "rm", "-y", response.id)
    assert manifests(cache_dir) == [] and list((cache_dir / "responses").glob("*.json")) == []

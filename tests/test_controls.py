"""The controls a request has over the memory (docs/usage.md, "Controls"): not to be remembered
(`remember: false` on every API, `Cache-Control: no-store`), OpenAI's `prompt_cache_retention`
and Anthropic's `cache_control` breakpoints, each against the real server on the tiny models."""

from __future__ import annotations

import json
import time

import anthropic
import httpx
import pytest
from tokenizers import Tokenizer

from agent_memory.agent_key import AgentKey, agent_file_stem
from agent_memory.memory.warm.format.records import Manifest
from agent_memory.models.tiny import build_tiny
from tests.support.inprocess import InProcessServer
from tests.support.metrics import metric

SYSTEM = "You are the clerk of the town archive. Answer briefly and cite the ledger's page. " * 4
QUESTION = "What is on page one?"


def settle(server, **model: str) -> None:
    """Wait until the engine holds no sequence (a turn's follow-up included)."""
    deadline = time.monotonic() + 60
    states = ("waiting", "prefilling", "decoding")
    while any(metric(server, "agent_memory_sequences", state=s, **model) for s in states):
        assert time.monotonic() < deadline, "the engine did not go idle"
        time.sleep(0.05)


def chat(server, messages, agent=None, model="tiny", headers=None, **extra):
    body = {"prompt_cache_key": agent, **extra} if agent else extra
    return server.client().chat.completions.create(
        model=model, messages=messages, max_tokens=4, temperature=0, extra_body=body, extra_headers=headers
    )


def cached(response) -> int:
    return response.usage.prompt_tokens_details.cached_tokens


def warm_files(server) -> dict[str, int]:
    """Every file of the warm folder, with its modification time."""
    files = [p for p in (server.cache_dir / "kv").rglob("*") if p.is_file() and p.name != "server.json"]
    return {str(p): p.stat().st_mtime_ns for p in files}


def memory(server) -> dict:
    """What /v1/agents shows, less the times a lookup touches."""
    listed = httpx.get(server.base_url + "/v1/agents").json()
    agents = {a["id"]: (a["tokens"], a["blocks"], a["snapshots"], a["bytes"]) for a in listed["data"]}
    totals = {k: v for k, v in listed.items() if k.endswith(("_bytes", "_blocks")) or k in ("agents", "snapshots")}
    return {"agents": agents, "totals": totals}


def written(server) -> dict:
    """memory(server) once the warm tier has written what the last turns queued (its disk bytes
    grow until then): two reads a moment apart alike."""
    deadline = time.monotonic() + 30
    last = memory(server)
    while True:
        time.sleep(0.2)
        if (now := memory(server)) == last:
            return now
        assert time.monotonic() < deadline, "the warm tier did not finish writing"
        last = now


def test_a_request_not_remembered_reuses_and_writes_nothing(server, tiny_model):
    first = [{"role": "system", "content": SYSTEM}, {"role": "user", "content": QUESTION}]
    reply = chat(server, first, "keeper")
    settle(server)
    second = first + [
        {"role": "assistant", "content": reply.choices[0].message.content},
        {"role": "user", "content": "And on page two?"},
    ]
    before = written(server)
    files = warm_files(server)
    assert files and "keeper" in before["agents"]
    anthropic_body = {
        "model": "tiny", "max_tokens": 4, "system": SYSTEM, "extra_body": {"remember": False},
        "messages": [{"role": "user", "content": QUESTION}],
    }
    sent = [
        chat(server, second, "keeper", remember=False),  # the agent's next turn, not kept
        chat(server, second, "keeper", headers={"Cache-Control": "max-age=0, No-Store"}),
        chat(server, second, "a-new-one", remember=False),  # a new agent, never made
        chat(server, second, remember=False),  # anonymous: no block shared
        anthropic.Anthropic(base_url=server.base_url, api_key="x").messages.create(
            **anthropic_body, extra_headers={"X-Agent-Id": "keeper"}
        ),
        server.client().responses.create(
            model="tiny", input=second, max_output_tokens=4, store=False, extra_body={"remember": False}
        ),
    ]
    settle(server)
    for response in sent[:4]:
        assert cached(response) > 60, response.usage
    assert sent[4].usage.cache_read_input_tokens > 60
    assert sent[5].usage.input_tokens_details.cached_tokens > 60
    assert memory(server) == before
    assert warm_files(server) == files
    assert httpx.get(server.base_url + "/v1/agents/a-new-one").status_code == 404
    # Remembered as usual once the control is left out: the same turn extends the agent.
    chat(server, second, "keeper")
    settle(server)
    assert memory(server)["agents"]["keeper"][0] > before["agents"]["keeper"][0]


def test_remember_false_with_a_prewarm_is_refused(server):
    body = {"model": "tiny", "max_tokens": 0, "remember": False, "messages": [{"role": "user", "content": "hi"}]}
    r = httpx.post(server.base_url + "/v1/messages", json=body)
    assert r.status_code == 400 and r.json()["type"] == "error"
    assert "remember" in r.json()["error"]["message"] and "max_tokens 0" in r.json()["error"]["message"]


@pytest.fixture(scope="module")
def tight(tiny_model, tmp_path_factory):
    """A hot budget of about four short agents (a 64-token block of the tiny model at 16 bits
    is about 256 KiB): a flood of equal agents cools the oldest first."""
    with InProcessServer(tiny_model, tmp_path_factory.mktemp("tight"), "--hot-budget-mb", "1") as s:
        yield s


def short(n: int, topic: str) -> list[dict]:
    """A short conversation of its own from its first token (no block shared with another)."""
    return [{"role": "user", "content": f"{topic} {n}: which ledger holds the deeds of the mill?"}]


def hot_blocks(server, agent: str) -> tuple[int, int]:
    info = httpx.get(server.base_url + f"/v1/agents/{agent}").json()
    return info["blocks"]["hot"], sum(info["blocks"].values())


def flood(server, topic: str, n: int = 12) -> None:
    """More equal agents than the budget holds: every older block not kept with priority cools."""
    for i in range(n):
        chat(server, short(i, topic), f"{topic}-{i}")
    settle(server)


def manifest(server, agent: str) -> dict:
    """The agent's manifest in the warm folder, once its writer has written it."""
    deadline = time.monotonic() + 30
    while True:
        found = [json.loads(p.read_text()) for p in (server.cache_dir / "kv").rglob("agents/*.json")]
        mine = [m for m in found if m["agent"] == agent]
        if mine or time.monotonic() > deadline:
            assert mine, f"no manifest for {agent}"
            return mine[0]
        time.sleep(0.05)


@pytest.mark.parametrize("retention", ["in_memory", "24h"])
def test_prompt_cache_retention_outlives_an_equal_flood(tight, retention):
    kept, plain = f"kept-{retention}", f"plain-{retention}"
    chat(tight, short(0, kept), kept, prompt_cache_retention=retention)  # the oldest: first to go without it
    chat(tight, short(0, plain), plain)
    settle(tight)
    flood(tight, f"flood-{retention}")
    held, total = hot_blocks(tight, kept)
    assert held == total > 0  # all of it still in memory
    assert hot_blocks(tight, plain)[0] < hot_blocks(tight, plain)[1]  # the equal agent after it cooled
    mine = manifest(tight, kept)
    if retention == "24h":  # kept on disk too, across restarts: in its manifest
        assert 86000 < mine["keep_until"] - time.time() <= 86400
    else:
        assert "keep_until" not in mine


def test_a_24h_retention_is_kept_across_a_restart_and_shown(tiny_model, tmp_path):
    with InProcessServer(tiny_model, tmp_path) as s:
        chat(s, short(0, "kept-restart"), "kept-restart", prompt_cache_retention="24h")
        chat(s, short(0, "plain-restart"), "plain-restart")
    with InProcessServer(tiny_model, tmp_path) as s:  # restored from its manifest
        kept = httpx.get(s.base_url + "/v1/agents/kept-restart").json()
        plain = httpx.get(s.base_url + "/v1/agents/plain-restart").json()
    assert 86000 < kept["kept_on_disk_until"] - time.time() <= 86400
    assert kept["kept_until"] == kept["kept_on_disk_until"]
    assert plain["kept_until"] is None and plain["kept_on_disk_until"] is None


def test_a_manifests_keep_until_is_written_only_when_asked_and_checked():
    key = AgentKey("kept")
    stem = agent_file_stem(key)
    plain = Manifest(key, "f" * 16, [1, 2, 3], [], 1.0)
    assert b"keep_until" not in plain.to_bytes()  # as older versions wrote it, and read as 0
    assert Manifest.parse(plain.to_bytes(), stem).keep_until == 0.0
    kept = Manifest(key, "f" * 16, [1, 2, 3], [], 1.0, keep_until=1.8e9)
    assert Manifest.parse(kept.to_bytes(), stem).keep_until == 1.8e9
    bad = kept.to_bytes().replace(b"1800000000.0", b'"tomorrow"')
    with pytest.raises(ValueError, match="keep_until"):
        Manifest.parse(bad, stem)


def test_a_bad_prompt_cache_retention_is_refused_in_each_apis_shape(tight):
    body = {"model": "tiny", "messages": short(0, "x"), "prompt_cache_retention": "7d"}
    r = tight.http().post("/v1/chat/completions", json=body)
    assert r.status_code == 400 and r.json()["error"]["param"] == "prompt_cache_retention"
    r = tight.http().post("/v1/responses", json={"model": "tiny", "input": "hi", "prompt_cache_retention": "forever"})
    assert r.status_code == 400 and "prompt_cache_retention" in r.json()["error"]["message"]
    ok = tight.client().chat.completions.create(
        model="tiny", messages=short(1, "x"), max_tokens=2, extra_body={"prompt_cache_retention": "in-memory"}
    )
    assert ok.choices


def anthropic_turn(server, system: str, question: str, model: str, ttl: str | None = None, agent: str | None = None):
    """An Anthropic request whose system block is a breakpoint when `ttl` is given."""
    block = {"type": "text", "text": system}
    if ttl is not None:
        block["cache_control"] = {"type": "ephemeral", "ttl": ttl}
    headers = {"X-Agent-Id": agent} if agent else {}
    body = {"model": model, "max_tokens": 4, "system": [block], "messages": [{"role": "user", "content": question}]}
    r = httpx.post(server.base_url + "/v1/messages", json=body, headers=headers, timeout=120)
    assert r.status_code == 200, r.text
    return r.json()["usage"]


def test_a_breakpoints_ttl_outlives_an_equal_flood(tight):
    kept, plain = "The mill's ledger. " * 10, "A bakery's ledger. " * 10
    anthropic_turn(tight, kept, QUESTION, "tiny", ttl="1h")  # anonymous, the oldest
    anthropic_turn(tight, plain, QUESTION, "tiny")
    settle(tight)
    flood(tight, "ttl-flood")
    assert anthropic_turn(tight, kept, "And page two?", "tiny")["cache_read_hot_input_tokens"] > 40
    # The equal request without one kept only what it shares with the kept one: the template's first tokens.
    assert anthropic_turn(tight, plain, "And page two?", "tiny")["cache_read_hot_input_tokens"] < 8


@pytest.fixture(scope="module")
def hybrid(tmp_path_factory):
    """The recurrent hybrid (qwen3_5): a prompt resumes only at a snapshot."""
    model = build_tiny(tmp_path_factory.mktemp("models") / "qwen3_5", arch="qwen3_5")
    with InProcessServer(model, tmp_path_factory.mktemp("hybrid"), "--disk-budget-mb", "0") as s:
        yield s, Tokenizer.from_file(str(model / "tokenizer.json"))


def test_a_breakpoint_takes_a_snapshot_where_the_next_agent_resumes(hybrid):
    server, tokenizer = hybrid
    system_tokens = len(tokenizer.encode(SYSTEM, add_special_tokens=False).ids)
    # Without a breakpoint the second agent shares the system prompt's blocks, but no snapshot
    # was taken where they part: its state cannot resume there.
    other = SYSTEM.replace("clerk", "keeper")
    anthropic_turn(server, other, QUESTION, "qwen3_5", agent="plain-1")
    settle(server)
    unmarked = anthropic_turn(server, other, "Who signed page two?", "qwen3_5", agent="plain-2")
    assert unmarked["cache_read_input_tokens"] == 0
    anthropic_turn(server, SYSTEM, QUESTION, "qwen3_5", ttl="5m", agent="marked-1")
    settle(server)
    usage = anthropic_turn(server, SYSTEM, "Who signed page two?", "qwen3_5", ttl="5m", agent="marked-2")
    assert usage["cache_read_input_tokens"] >= system_tokens


def test_five_breakpoints_are_refused_as_anthropic_refuses_them(hybrid):
    server, _ = hybrid
    mark = {"type": "ephemeral"}
    system = [{"type": "text", "text": f"Rule {i}.", "cache_control": mark} for i in range(4)]
    body = {"model": "qwen3_5", "max_tokens": 4, "system": system, "messages": [{"role": "user", "content": "hi"}]}
    r = httpx.post(server.base_url + "/v1/messages", json={**body, "cache_control": mark})
    assert r.status_code == 400 and r.json()["type"] == "error"
    assert r.json()["error"]["message"] == "A maximum of 4 blocks with cache_control may be provided. Found 5."
    late = [*system[:2], {**system[2], "cache_control": {"type": "ephemeral", "ttl": "1h"}}]
    r = httpx.post(server.base_url + "/v1/messages", json={**body, "system": late})
    assert r.status_code == 400 and "ttl='1h'" in r.json()["error"]["message"]
    two_hours = {**body, "system": system[:1], "cache_control": {"type": "ephemeral", "ttl": "2h"}}
    r = httpx.post(server.base_url + "/v1/messages", json=two_hours)
    assert r.status_code == 400 and "cache_control.ttl" in r.json()["error"]["message"]

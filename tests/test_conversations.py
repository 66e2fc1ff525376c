"""Unnamed conversations (docs/usage.md, "Name your agent"): a request that names no agent joins
the conversation its prompt continues (memory/index/conversations.py) — its next turn, or its
latest turn sent again — else starts one; a fork never moves another's record; tenants and cache
salts never meet. Then the conversation is an agent: listed, deleted, written to the warm tier,
read back after a restart, and a one-off is the first to go under the budgets."""

from __future__ import annotations

import json

import httpx
import pytest
from typer.testing import CliRunner

from agent_memory.agent_key import AGENT, UNNAMED, AgentKey
from agent_memory.cli.cache.commands import cache_app
from agent_memory.memory.hashing import namespace
from agent_memory.memory.index.eviction import ONE_OFF_WEIGHT
from agent_memory.memory.index.snapshots import TURN_START
from agent_memory.memory.index.store import AgentCacheStore
from tests.support.fake_kv import BYTES_PER_TOKEN, FINGERPRINT, FakeKV, commit, make_store
from tests.support.inprocess import InProcessServer

PROMPT = list(range(100, 140))  # a first prompt of 40 tokens
REPLY = list(range(500, 530))  # its reply, 30 tokens


def root(store: AgentCacheStore, tenant: str = "", salt: str = "") -> str | None:
    return store.names.root(namespace(tenant, salt))


def turn(store: AgentCacheStore, prompt: list[int], reply: list[int], tenant: str = "") -> AgentKey:
    """A client turn as the engine runs it: recognised, its prompt committed before decoding
    (its turn start), then prompt and reply."""
    key = store.recognise(prompt, root(store, tenant), tenant)
    commit(store, key, prompt[:-1], role=TURN_START)
    commit(store, key, prompt + reply)
    return key


@pytest.fixture
def store(tmp_path):
    store, disk = make_store(tmp_path, block_tokens=8)
    yield store
    disk.close()


def test_a_next_turn_joins_the_conversation_however_its_reply_came_back(store):
    first = turn(store, PROMPT, REPLY)
    assert first.kind == UNNAMED and len(first.id) == 16
    # The client sends the reply back with its last tokens written otherwise, then its message.
    second = PROMPT + REPLY[:-3] + [901, 902, 903] + list(range(200, 220))
    assert store.recognise(second, root(store), "") == first
    assert turn(store, second, REPLY) == first
    assert store.agents[first].turns == 2


def test_a_resend_or_a_retry_joins_the_turn_it_repeats(store):
    first = turn(store, PROMPT, REPLY)
    assert store.recognise(PROMPT, root(store), "") == first  # after its reply
    commit(store, first, PROMPT[:-1], role=TURN_START)  # a retry after a crash mid-turn
    assert store.recognise(PROMPT, root(store), "") == first
    assert store.agents[first].turns == 1  # a resend is not another turn


def test_a_fork_starts_a_conversation_and_leaves_the_old_one_as_it_was(store):
    first = turn(store, PROMPT, REPLY)
    held = list(store.agents[first].tokens)
    forked = PROMPT[:20] + list(range(300, 330))  # the same start, another history
    other = turn(store, forked, REPLY)
    assert other != first and other.kind == UNNAMED
    assert store.agents[first].tokens == held
    assert store.recognise(PROMPT + REPLY + [7, 8, 9], root(store), "") == first


def test_conversations_opened_alike_stay_apart(store):
    """Two chats opened with the same first prompt: the second joins the first while it is that
    prompt again, and is its own conversation once the first has moved on."""
    a = turn(store, PROMPT, REPLY)
    a2 = PROMPT + REPLY + list(range(200, 220))
    turn(store, a2, REPLY)
    b = turn(store, PROMPT, REPLY)  # the first has a second turn now: this one is not a resend of it
    assert b != a and b.kind == UNNAMED
    assert store.recognise(PROMPT + REPLY + list(range(250, 270)), root(store), "") == b
    assert store.recognise(a2 + REPLY + [1, 2, 3], root(store), "") == a


def test_tenants_and_cache_salts_never_meet(store):
    first = turn(store, PROMPT, REPLY, tenant="alice")
    next_turn = PROMPT + REPLY + list(range(200, 220))
    assert store.recognise(next_turn, root(store, "alice"), "alice") == first
    bob = store.recognise(next_turn, root(store, "bob"), "bob")
    assert bob != first and bob.tenant == "bob"
    salted = store.recognise(next_turn, root(store, "alice", "salt"), "alice")
    assert salted != first


def test_a_one_off_is_the_first_to_go_and_its_record_with_it():
    """Blocks of a one-off count ONE_OFF_WEIGHT against eviction; with no warm tier, once they
    have left memory its record goes too, while an agent's stays (its tokens, for the next turn)."""
    store = AgentCacheStore(block_tokens=8, salt=FINGERPRINT, hot_budget_bytes=10**9, attention_tokens=50.0)
    named = AgentKey("named")
    commit(store, named, list(range(1000, 1040)))
    one_off = turn(store, PROMPT, REPLY)
    assert {store.pool.blocks[h].weight for h in store.agents[one_off].blocks} == {ONE_OFF_WEIGHT}
    store.set_hot_budget(0)
    assert one_off not in store.agents and named in store.agents


def test_over_the_disk_budget_a_one_off_goes_first_manifest_and_all(tmp_path):
    store, disk = make_store(tmp_path, hot_tokens=0, block_tokens=8)  # every block leaves memory once written
    tokens = list(range(1000, 1070))  # as long as the one-off's turn: blocks of equal cost
    commit(store, AgentKey("older"), tokens)
    one_off = turn(store, PROMPT, REPLY)
    disk.flush()
    store.evictor.disk_budget_bytes = store.pool.disk_bytes  # full: the next agents' blocks push others out
    for n in (1, 2):  # a block's value grows with its position: the one-off's last block outvalues an agent's first
        commit(store, AgentKey(f"newer-{n}"), [t + 100 * n for t in tokens])
        disk.flush()
    assert one_off not in store.agents and AgentKey("older") in store.agents
    disk.close()
    again, disk = make_store(tmp_path, block_tokens=8)
    try:
        assert one_off not in again.agents and AgentKey("older") in again.agents
    finally:
        disk.close()


def test_an_unnamed_conversation_is_read_back_after_a_restart(tmp_path):
    store, disk = make_store(tmp_path, block_tokens=8)
    first = turn(store, PROMPT, REPLY)
    turn(store, PROMPT + REPLY + [7, 8, 9], REPLY)
    disk.flush()
    disk.close()
    again, disk = make_store(tmp_path, block_tokens=8)
    try:
        record = again.agents[first]
        assert (record.turn_start, record.turns) == (len(PROMPT + REPLY) + 2, 2)
        assert again.recognise(PROMPT + REPLY + [7, 8, 9], root(again), "") == first  # a resend, after it
    finally:
        disk.close()


# -- through the server ------------------------------------------------------------------

MESSAGES = [{"role": "user", "content": "Tell me about the archive, then about the ledger."}]


def ask(http: httpx.Client, messages: list[dict], **extra) -> httpx.Response:
    body = {"model": "tiny", "messages": messages, "max_tokens": 24, "temperature": 0, **extra}
    response = http.post("/v1/chat/completions", json=body)
    assert response.status_code == 200, response.text
    return response


def next_messages(response: httpx.Response) -> list[dict]:
    reply = response.json()["choices"][0]["message"]["content"]
    return [*MESSAGES, {"role": "assistant", "content": reply}, {"role": "user", "content": "And then?"}]


def reused(response: httpx.Response) -> tuple[int, int, int]:
    """(cached, hot, warm) prompt tokens."""
    d = response.json()["usage"]["prompt_tokens_details"]
    return d["cached_tokens"], d["hot_tokens"], d["warm_tokens"]


def whole_turn(response: httpx.Response) -> int:
    u = response.json()["usage"]
    return u["prompt_tokens"] + u["completion_tokens"]


def test_an_unnamed_chat_is_an_agent_listed_and_deleted(tiny_model, tmp_path):
    with InProcessServer(tiny_model, tmp_path / "cache") as server, httpx.Client(base_url=server.base_url) as http:
        first = ask(http, MESSAGES)
        agent_id = first.headers["X-Agent-Id"]
        assert agent_id.startswith("~")
        second = ask(http, next_messages(first))
        assert second.headers["X-Agent-Id"] == agent_id
        assert reused(second)[0] >= whole_turn(first) - 1  # its prompt and its whole reply
        named = ask(http, MESSAGES, user="someone")
        assert "X-Agent-Id" not in named.headers  # a named request's agent is its own name
        listed = {a["display_id"]: a for a in http.get("/v1/agents").json()["data"]}
        assert listed[agent_id]["kind"] == UNNAMED and listed[agent_id]["turns"] == 2
        assert listed["someone"]["kind"] == AGENT
        shown = http.get(f"/v1/agents/{agent_id}").json()
        assert shown["id"] == agent_id[1:] and shown["tokens"] >= whole_turn(first)
        assert http.delete(f"/v1/agents/{agent_id}").json()["deleted"] is True
        assert http.get(f"/v1/agents/{agent_id}").status_code == 404
        assert f"agent={agent_id}" in server.log()


def test_an_unnamed_chat_survives_a_restart(tiny_model, tmp_path):
    with InProcessServer(tiny_model, tmp_path / "cache") as server, httpx.Client(base_url=server.base_url) as http:
        first = ask(http, MESSAGES)
    agent_id = first.headers["X-Agent-Id"]
    listed = CliRunner().invoke(cache_app, ["ls", "--cache-dir", str(tmp_path / "cache"), "--format", "json"])
    assert [(a["id"], a["kind"]) for a in json.loads(listed.stdout)["agents"]] == [(agent_id[1:], UNNAMED)]
    quiet = ["ls", "--cache-dir", str(tmp_path / "cache"), "--format", "quiet", "--filter", "kind=unnamed"]
    assert CliRunner().invoke(cache_app, quiet).stdout.split() == [agent_id]
    with InProcessServer(tiny_model, tmp_path / "cache") as server, httpx.Client(base_url=server.base_url) as http:
        second = ask(http, next_messages(first))
    assert second.headers["X-Agent-Id"] == first.headers["X-Agent-Id"]
    assert reused(second)[2] >= 0.9 * whole_turn(first)

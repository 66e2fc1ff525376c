"""Why a request missed (docs/usage.md, "Why a request missed"): each reason caused by what
causes it, and shown where the docs say — every API's usage, the access log line,
`/v1/agents/ID`, `/metrics` — with a rewrite's text to the agent's own tenant only."""

from __future__ import annotations

import time

import httpx
import pytest

from agent_memory.agent_key import AgentKey
from agent_memory.cache_miss import ANOTHER_IMAGE, Miss
from agent_memory.memory.hashing import SpanKey
from agent_memory.memory.index.misses import explain
from agent_memory.memory.index.store import AgentCacheStore
from tests.support.inprocess import InProcessServer
from tests.support.metrics import metric

SYSTEM = "You are the clerk of the town archive. Answer briefly and cite the ledger's page. " * 4


def turn(client, messages, agent=None, model="tiny", **extra):
    """One greedy turn of `agent` (None: anonymous); `extra`: more body fields."""
    body = {"prompt_cache_key": agent, **extra} if agent else extra
    return client.chat.completions.create(model=model, messages=messages, max_tokens=6, temperature=0, extra_body=body)


def miss(response) -> dict:
    return response.usage.prompt_tokens_details.model_extra["cache_miss"]


def cached(response) -> int:
    return response.usage.prompt_tokens_details.cached_tokens


def at_clock(clock: str, system: str = SYSTEM) -> list[dict]:
    """A conversation whose system prompt holds the time: a line that changes every request."""
    system = {"role": "system", "content": f"{system}\nCurrent time: {clock}."}
    return [system, {"role": "user", "content": "What is on page one?"}]


def settle(server) -> None:
    """Wait until the engine holds no sequence: a reply can come back before the follow-up its
    turn queued (the reply's canonical tokens) has changed the agent's record."""
    deadline = time.monotonic() + 60
    while any(metric(server, "agent_memory_sequences", state=s) for s in ("waiting", "prefilling", "decoding")):
        assert time.monotonic() < deadline, "the engine did not go idle"
        time.sleep(0.05)


def logged(server, text: str) -> str:
    """The access log line holding `text` (written just after its response is sent)."""
    deadline = time.monotonic() + 30
    while True:
        lines = [line for line in server.log().splitlines() if "agent_memory.requests" in line and text in line]
        if lines or time.monotonic() > deadline:
            assert lines, f"no access log line with {text!r}"
            return lines[-1]
        time.sleep(0.05)


def test_a_new_conversation_then_its_resend_misses_nothing(server, client):
    conversation = at_clock("09:00:00", "You index the harbour's logbooks by ship and date. " * 5)
    first = turn(client, conversation, "newcomer")
    assert miss(first) == {"reason": "new_conversation", "at": cached(first), "lost": 0}  # at most a template's header
    settle(server)
    again = turn(client, conversation, "newcomer")  # a resend: the prompt is a prefix of what it left
    assert cached(again) == again.usage.prompt_tokens - 1
    assert miss(again) == {"reason": "none", "at": cached(again), "lost": 0}
    unnamed = turn(client, conversation)  # no name: all of its prompt reused, or new
    assert miss(unnamed) == {"reason": "none", "at": unnamed.usage.prompt_tokens - 1, "lost": 0}
    other = turn(client, conversation[:1] + [{"role": "user", "content": "And page two?"}])
    assert miss(other) == {"reason": "new_conversation", "at": cached(other), "lost": 0} and cached(other) > 0


def test_a_rewritten_history_says_where_and_shows_the_text(server, client):
    first = turn(client, at_clock("10:42:01"), "clerk")
    settle(server)
    held = httpx.get(server.base_url + "/v1/agents/clerk").json()["tokens"]
    second = turn(client, at_clock("10:43:17"), "clerk")
    m = miss(second)
    assert m["reason"] == "rewritten"
    assert m["at"] == cached(second) > 0  # reused up to the first token that changed
    assert m["lost"] == held - m["at"]
    assert "42:01" in m["detail"]["cached"] and "43:17" in m["detail"]["sent"]
    assert "43:17" not in m["detail"]["cached"] and miss(first)["reason"] == "new_conversation"

    line = logged(server, f"miss=rewritten@{m['at']}+{m['lost']}")
    assert "43:17" not in line and "42:01" not in line  # the log is the operator's: no text

    agent = httpx.get(server.base_url + "/v1/agents/clerk").json()
    assert agent["misses"][-1] == {**m, "time": agent["misses"][-1]["time"]}
    assert agent["misses"][0]["reason"] == "new_conversation"
    listed = next(a for a in httpx.get(server.base_url + "/v1/agents").json()["data"] if a["id"] == "clerk")
    when = agent["misses"][-1]["time"]
    assert listed["last_miss"] == {"reason": "rewritten", "at": m["at"], "lost": m["lost"], "time": when}  # no text
    assert metric(server, "agent_memory_cache_misses_total", reason="rewritten") >= 1
    assert metric(server, "agent_memory_cache_miss_lost_tokens_total", reason="rewritten") >= m["lost"]
    assert metric(server, "agent_memory_cache_misses_total", reason="none") == 0  # not a miss


def test_an_agent_under_another_cache_salt(server, client):
    conversation = at_clock("11:00:00")
    turn(client, conversation, "salted", cache_salt="s1")
    settle(server)
    moved = turn(client, conversation, "salted", cache_salt="s2")
    assert cached(moved) == 0
    assert miss(moved)["reason"] == "another_namespace" and miss(moved)["lost"] > 0


def test_every_api_reports_its_miss_beside_its_cached_tokens(server, client):
    system = "You answer for the harbour master about berths and tides. " * 5
    http = server.http()
    body = {"model": "tiny", "max_tokens": 4, "system": system, "messages": [{"role": "user", "content": "Berth 4?"}]}
    anthropic = http.post("/v1/messages", json=body, headers={"X-Agent-Id": "harbour"}).json()["usage"]
    reused = anthropic["cache_read_input_tokens"]
    assert anthropic["cache_miss"] == {"reason": "new_conversation", "at": reused, "lost": 0}
    response = client.responses.create(
        model="tiny",
        instructions=system,
        input="Berth 4?",
        max_output_tokens=4,
        extra_body={"prompt_cache_key": "harbour-r"},
    )
    details = response.usage.input_tokens_details
    assert details.model_extra["cache_miss"] == {"reason": "new_conversation", "at": details.cached_tokens, "lost": 0}
    text = client.completions.create(
        model="tiny", prompt=system, max_tokens=2, extra_body={"prompt_cache_key": "harbour-t"}
    )
    assert text.usage.prompt_tokens_details.model_extra["cache_miss"]["reason"] == "new_conversation"


def test_evicted_by_a_tiny_hot_budget_with_no_disk(tiny_model, tmp_path):
    with InProcessServer(tiny_model, tmp_path, "--hot-budget-mb", "1", "--disk-budget-mb", "0") as s:
        client = s.client()
        conversation = at_clock("12:00:00", SYSTEM * 2)
        turn(client, conversation, "returning")
        for i in range(4):  # ~1 MiB holds a few hundred tokens of the tiny model's KV
            turn(client, at_clock("12:00:00", f"Persona {i}. " + SYSTEM * 2), f"other{i}")
        settle(s)
        assert httpx.get(s.base_url + "/v1/agents/returning").json()["blocks"]["cold"] > 0
        back = turn(client, conversation, "returning")
        m = miss(back)
        # Reused up to its first evicted block (later ones still hot are reused past the gap).
        assert m["reason"] == "evicted_hot" and m["at"] <= cached(back)
        assert m["lost"] == back.usage.prompt_tokens - 1 - cached(back) > 0
        assert metric(s, "agent_memory_cache_misses_total", reason="evicted_hot") >= 1


@pytest.fixture(scope="module")
def hybrid(tmp_path_factory):
    from agent_memory.models.tiny import build_tiny

    return build_tiny(tmp_path_factory.mktemp("models") / "qwen3_5", arch="qwen3_5")


def test_no_snapshot_where_a_recurrent_model_could_have_resumed(hybrid, tmp_path):
    with InProcessServer(hybrid, tmp_path, "--disk-budget-mb", "0") as s:
        client = s.client()
        asked = lambda question, agent: turn(  # noqa: E731
            client, [{"role": "system", "content": SYSTEM}, {"role": "user", "content": question}], agent, "qwen3_5"
        )
        asked("What is on page one?", "first")
        settle(s)
        # The second agent's prompt follows the first's blocks through the system prompt, but
        # no snapshot was taken where they part: its state cannot resume there (one is now).
        second = asked("Who signed page two?", "second")
        assert cached(second) == 0
        assert miss(second)["reason"] == "no_snapshot" and miss(second)["at"] == 0 and miss(second)["lost"] >= 64
        settle(s)
        third = asked("When was page three torn?", "third")
        assert miss(third) == {"reason": "new_conversation", "at": cached(third), "lost": 0} and cached(third) > 0


def test_other_tenants_never_see_a_rewrite_text(tiny_model, tmp_path):
    keys = tmp_path / "keys"
    keys.write_text("alice key-alice\nbob key-bob\n")
    with InProcessServer(tiny_model, tmp_path / "cache", "--api-keys-file", str(keys)) as s:
        alice, bob = s.client(api_key="key-alice"), s.client(api_key="key-bob")
        turn(alice, at_clock("13:42:01"), "same-id")
        settle(s)
        theirs = turn(bob, at_clock("13:43:17"), "same-id")  # bob's agent of that name is bob's own
        assert miss(theirs)["reason"] == "new_conversation" and "detail" not in miss(theirs)
        mine = turn(alice, at_clock("13:43:17"), "same-id")
        assert miss(mine)["reason"] == "rewritten" and "42:01" in miss(mine)["detail"]["cached"]
        as_bob = httpx.get(s.base_url + "/v1/agents/same-id", headers={"Authorization": "Bearer key-bob"}).json()
        assert "42:01" not in str(as_bob) and [m["reason"] for m in as_bob["misses"]] == ["new_conversation"]


def test_the_same_tokens_with_another_image_miss_where_the_image_is():
    # The store driven as the engine drives it; over HTTP: tests/test_images_http.py.
    store = AgentCacheStore(block_tokens=4, salt="test", hot_budget_bytes=1 << 20, attention_tokens=50.0)
    agent, tokens = AgentKey("pictures"), list(range(100, 120))
    cut = lambda start, end: (object(), (end - start) * 10, False)  # noqa: E731
    store.commit(agent, tokens, cut, extras=[SpanKey(6, 10, b"a cat")])
    prompt, dog = tokens[:-1], [SpanKey(6, 10, b"a dog")]
    lease = store.lookup(prompt, None, dog)
    with store.lock:
        found = explain(store, agent, prompt, None, dog, lease, str, False)
    detail = {"cached": b"a cat".hex(), "sent": b"a dog".hex(), "image_at": "6"}
    assert found == Miss(ANOTHER_IMAGE, 6, len(prompt) - 6, detail)  # the image starts at 6


def test_an_agent_another_models_folder_holds(tiny_model, tmp_path):
    conversation = at_clock("14:00:00")
    with InProcessServer(tiny_model, tmp_path) as s:  # at 16 bits: its own warm folder
        turn(s.client(), conversation, "wanderer")
    (folder,) = [p.name for p in (tmp_path / "kv").iterdir()]
    with InProcessServer(tiny_model, tmp_path, "--kv-bits", "4") as s:  # another folder of the same cache
        elsewhere = turn(s.client(), conversation, "wanderer")
        expected = {"reason": "another_model", "at": cached(elsewhere), "lost": 0, "detail": {"folder": folder}}
        assert miss(elsewhere) == expected
        assert miss(turn(s.client(), conversation, "stranger"))["reason"] == "new_conversation"


def test_evicted_by_a_tiny_disk_budget(tiny_model, tmp_path):
    args = ("--hot-budget-mb", "1", "--disk-budget-mb", "1")
    conversation = at_clock("15:00:00", SYSTEM * 2)
    with InProcessServer(tiny_model, tmp_path, *args) as s:
        turn(s.client(), conversation, "returning")
        for i in range(6):  # several MiB of files against 1 MiB: the oldest agent's go first
            turn(s.client(), at_clock("15:00:00", f"Persona {i}. " + SYSTEM * 4), f"other{i}")
    with InProcessServer(tiny_model, tmp_path, *args) as s:  # a restart: its manifest names blocks with no file
        back = turn(s.client(), conversation, "returning")
        m = miss(back)
        assert m["reason"] == "evicted_disk" and m["at"] <= cached(back)
        assert m["lost"] == back.usage.prompt_tokens - 1 - cached(back) > 0


def test_a_block_file_that_cannot_be_read_back(tiny_model, tmp_path):
    conversation = at_clock("16:00:00", SYSTEM * 2)
    with InProcessServer(tiny_model, tmp_path) as s:
        turn(s.client(), conversation, "returning")
    for path in (tmp_path / "kv").rglob("*.safetensors"):  # damage every block file
        data = bytearray(path.read_bytes())
        data[-8:] = bytes(255 - b for b in data[-8:])
        path.write_bytes(bytes(data))
    with InProcessServer(tiny_model, tmp_path) as s:
        back = turn(s.client(), conversation, "returning")
        assert cached(back) == 0
        assert miss(back) == {"reason": "unreadable", "at": 0, "lost": back.usage.prompt_tokens - 1}
        assert metric(s, "agent_memory_cache_misses_total", reason="unreadable") == 1

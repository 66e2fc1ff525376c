"""Requests a careless or hostile client sends: none of them may stop the engine or the disk
writer, and each gets a clear 400 naming the field (or is mapped, as documented)."""

from __future__ import annotations

import json
import signal

import httpx
import pytest

from tests.conftest import Server, ask, chat

PROMPT = "Tell me about the harbour at night."


def _post(server, body: dict | bytes, headers: dict | None = None) -> httpx.Response:
    content = body if isinstance(body, bytes) else json.dumps(body).encode()
    return httpx.post(
        server.base_url + "/v1/chat/completions",
        content=content,
        headers={"content-type": "application/json", **(headers or {})},
        timeout=60,
    )


def _healthy(server) -> bool:
    return httpx.get(server.base_url + "/health").status_code == 200


@pytest.mark.parametrize("seed", [-1, -(2**70), 2**64, 2**64 + 7, 2**200])
def test_any_integer_seed_is_served_and_the_engine_lives_on(server, client, seed):
    body = {"messages": [{"role": "user", "content": PROMPT}], "max_tokens": 6, "seed": seed, "temperature": 1.0}
    r = _post(server, body)
    assert r.status_code == 200, r.text
    assert r.json()["choices"][0]["message"]["content"] is not None
    assert chat(client, "still there?", max_tokens=2).choices  # the engine thread is alive
    assert _healthy(server)


def test_large_seeds_are_reproducible_modulo_two_to_the_64(server):
    def sample(seed: int) -> str:
        body = {"messages": [{"role": "user", "content": PROMPT}], "max_tokens": 12, "seed": seed, "temperature": 1.0}
        return _post(server, body).json()["choices"][0]["message"]["content"]

    assert sample(2**64 + 5) == sample(5) == sample(5)


@pytest.mark.parametrize(
    "body, param",
    [
        ({"messages": [{"role": "user", "content": "bad\ud800"}]}, "messages.0.content"),
        ({"messages": [{"role": "user", "content": [{"type": "text", "text": "x\udfff"}]}]}, "messages.0.content.0.text"),
        ({"messages": [{"role": "user", "content": "hi"}], "prompt_cache_key": "bad\ud800"}, "prompt_cache_key"),
        ({"messages": [{"role": "user", "content": "hi"}], "user": "\udc80"}, "user"),
        ({"messages": [{"role": "user", "content": "hi"}], "stop": ["\ud800"]}, "stop.0"),
        ({"messages": [{"role": "user", "content": "hi"}], "metadata": {"user_id": "\ud800"}}, "metadata.user_id"),
    ],
)
def test_text_that_is_not_valid_unicode_is_400_naming_the_field(server, body, param):
    # json.dumps writes lone surrogates as \\uXXXX escapes, as a hostile client would.
    r = _post(server, {**body, "max_tokens": 2})
    assert r.status_code == 400, r.text
    error = r.json()["error"]
    assert error["param"] == param and error["code"] == "invalid_unicode"
    assert _healthy(server)


def test_after_hostile_ids_the_writer_lives_on_and_sigterm_is_prompt(tiny_model, tmp_path):
    s = Server(tiny_model, tmp_path).start()
    try:
        _post(s, {"messages": [{"role": "user", "content": "hi"}], "prompt_cache_key": "bad\ud800", "max_tokens": 2})
        _post(s, {"messages": [{"role": "user", "content": "hi"}], "max_tokens": 2}, {"x-agent-id": b"\xed\xa0\x80"})  # a surrogate, UTF-8-encoded
        ask(s.client(), [{"role": "user", "content": "hi"}], "good-agent", max_tokens=2)
        listed = httpx.get(s.base_url + "/v1/agents")
        assert listed.status_code == 200
        assert [a["id"] for a in listed.json()["data"]] == ["good-agent"]
    finally:
        assert s.stop(signal.SIGTERM, timeout=30) == -signal.SIGTERM
    assert "flushing the warm tier" in s.log()


def test_header_agent_ids_are_read_as_utf8(server):
    agent = "agent-ünïcødé-名前"
    r = _post(server, {"messages": [{"role": "user", "content": "hi"}], "max_tokens": 2}, {"X-Agent-Id": agent.encode()})
    assert r.status_code == 200, r.text
    ids = {a["id"] for a in httpx.get(server.base_url + "/v1/agents").json()["data"]}
    assert agent in ids
    bad = _post(server, {"messages": [{"role": "user", "content": "hi"}], "max_tokens": 2}, {"X-Agent-Id": b"\xff\xfe"})
    assert bad.status_code == 400 and bad.json()["error"]["param"] == "X-Agent-Id"

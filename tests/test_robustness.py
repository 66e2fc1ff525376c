"""Requests a careless or hostile client sends: none of them may stop the engine or the disk
writer, and each gets a clear 400 naming the field (or is mapped, as documented)."""

from __future__ import annotations

import json
import signal

import httpx
import pytest

from tests.support.chat import ask, chat
from tests.support.server import Server

pytestmark = pytest.mark.process
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


HI = [{"role": "user", "content": "hi"}]
CHAT, MESSAGES, RESPONSES = "/v1/chat/completions", "/v1/messages", "/v1/responses"
SMALLEST = {  # each route's smallest valid body
    CHAT: {"messages": HI, "max_tokens": 2},
    "/v1/completions": {"prompt": "hi", "max_tokens": 2},
    MESSAGES: {"model": "tiny", "messages": HI, "max_tokens": 2},
    RESPONSES: {"input": "hi", "max_output_tokens": 2},
}


def _named(r: httpx.Response) -> str:
    """What a 400 names: OpenAI's `param`, or the start of Anthropic's message (its field)."""
    assert r.status_code == 400, r.text
    body = r.json()
    if "type" in body:  # Anthropic's shape: the message names the field
        assert body["type"] == "error" and body["error"]["type"] == "invalid_request_error"
        return body["error"]["message"].split(":")[0]
    assert body["error"]["type"] == "invalid_request_error"
    return body["error"]["param"]


@pytest.mark.parametrize("path", [CHAT, MESSAGES, RESPONSES])
def test_a_lone_surrogate_in_a_key_is_400_and_the_connection_serves_on(server, path):
    """The key itself is not valid Unicode: the error quotes it escaped (it was a 500, raised
    while writing the error, and the keep-alive connection was closed under the client)."""
    with server.http() as http:
        bad = {**SMALLEST[path], "metadata": {"\ud800": "v"}}
        r = http.post(path, content=json.dumps(bad).encode(), headers={"content-type": "application/json"})
        assert _named(r) == "metadata.\\ud800"
        if path != MESSAGES:
            assert r.json()["error"]["code"] == "invalid_unicode"
        assert http.post(path, json=SMALLEST[path]).status_code == 200
    assert _healthy(server)


TOOL_RESULT = {"type": "tool_result", "tool_use_id": "toolu_9", "content": "x"}
TOOL_MESSAGE = {"role": "tool", "content": "x"}
THINKING = {"type": "enabled"}


def _calls_then(result: dict) -> list[dict]:
    """A chat history with one tool call (id call_1), then `result`."""
    call = {"id": "call_1", "type": "function", "function": {"name": "f", "arguments": "{}"}}
    return [*HI, {"role": "assistant", "content": None, "tool_calls": [call]}, result]


@pytest.mark.parametrize(
    "path, change, named",
    [
        # content that says nothing
        (CHAT, {"messages": [{"role": "user", "content": []}]}, "messages.0.content"),
        (CHAT, {"messages": [{"role": "user", "content": ""}]}, "messages.0.content"),
        (CHAT, {"messages": [{"role": "system", "content": []}, *HI]}, "messages.0.content"),
        (MESSAGES, {"messages": [{"role": "user", "content": []}]}, "messages.0.content"),
        (MESSAGES, {"messages": [{"role": "user", "content": ""}]}, "messages.0.content"),
        (RESPONSES, {"input": ""}, "input"),
        (RESPONSES, {"input": [{"role": "user", "content": []}]}, "input.0.content"),
        (RESPONSES, {"input": [{"role": "user", "content": ""}]}, "input.0.content"),
        # a result for a call never made
        (CHAT, {"messages": [*HI, {**TOOL_MESSAGE, "tool_call_id": "call_9"}]}, "messages.1.tool_call_id"),
        (CHAT, {"messages": [*HI, TOOL_MESSAGE]}, "messages.1.tool_call_id"),
        (CHAT, {"messages": _calls_then({**TOOL_MESSAGE, "tool_call_id": "call_9"})}, "messages.2.tool_call_id"),
        (MESSAGES, {"messages": [{"role": "user", "content": [TOOL_RESULT]}]}, "messages.0.content.0"),
        (
            RESPONSES,
            {"input": [*HI, {"type": "function_call_output", "call_id": "call_9", "output": "x"}]},
            "input.1.call_id",
        ),
        # lax coercion: a string or a boolean is no number, and "yes" no boolean
        (CHAT, {"max_tokens": "10"}, "max_tokens"),
        (CHAT, {"max_tokens": True}, "max_tokens"),
        (CHAT, {"stream": "yes"}, "stream"),
        (CHAT, {"temperature": "1"}, "temperature"),
        ("/v1/completions", {"max_tokens": "10"}, "max_tokens"),
        (MESSAGES, {"max_tokens": "10"}, "max_tokens"),
        (MESSAGES, {"max_tokens": True}, "max_tokens"),
        (MESSAGES, {"stream": "yes"}, "stream"),
        (RESPONSES, {"max_output_tokens": "10"}, "max_output_tokens"),
        (RESPONSES, {"max_output_tokens": True}, "max_output_tokens"),
        (RESPONSES, {"stream": "yes"}, "stream"),
        # a thinking budget Anthropic refuses: at least 1024, less than max_tokens
        (MESSAGES, {"thinking": {**THINKING, "budget_tokens": 0}}, "thinking.budget_tokens"),
        (MESSAGES, {"thinking": {**THINKING, "budget_tokens": -5}}, "thinking.budget_tokens"),
        (MESSAGES, {"thinking": {**THINKING, "budget_tokens": 10**15}}, "thinking.budget_tokens"),
        (MESSAGES, {"thinking": {**THINKING, "budget_tokens": 1024}, "max_tokens": 1024}, "thinking.budget_tokens"),
        (MESSAGES, {"thinking": THINKING}, "thinking.budget_tokens"),
        # OpenAI's cap on prompt_cache_key
        (RESPONSES, {"prompt_cache_key": "k" * 10_000}, "prompt_cache_key"),
        (CHAT, {"prompt_cache_key": "k" * 65}, "prompt_cache_key"),
    ],
)
def test_what_the_reference_apis_refuse_is_400_naming_the_field(server, path, change, named):
    r = httpx.post(server.base_url + path, json={**SMALLEST[path], **change}, timeout=60)
    assert _named(r) == named


@pytest.mark.parametrize(
    "path, change, code",
    [
        (CHAT, {"max_tokens": True}, "invalid_type"),
        (RESPONSES, {"stream": "yes"}, "invalid_type"),
        (RESPONSES, {"prompt_cache_key": "k" * 65}, "string_above_max_length"),
    ],
)
def test_openais_codes_say_what_is_wrong_with_the_value(server, path, change, code):
    r = httpx.post(server.base_url + path, json={**SMALLEST[path], **change}, timeout=60)
    assert r.status_code == 400 and r.json()["error"]["code"] == code


@pytest.mark.parametrize(
    "path, change",
    [
        (CHAT, {"prompt_cache_key": "k" * 64}),
        (RESPONSES, {"prompt_cache_key": "k" * 64}),
        (CHAT, {"messages": _calls_then({"role": "tool", "tool_call_id": "call_1", "content": ""})}),
        # an empty assistant turn (a reply that wrote nothing, resent) is taken
        (MESSAGES, {"messages": [*HI, {"role": "assistant", "content": []}, {"role": "user", "content": "and?"}]}),
        (CHAT, {"messages": [*HI, {"role": "assistant", "content": ""}, {"role": "user", "content": "and?"}]}),
        (CHAT, {"temperature": 1, "max_tokens": 2}),  # an integer is a number
    ],
)
def test_what_the_reference_apis_take_is_served(server, path, change):
    r = httpx.post(server.base_url + path, json={**SMALLEST[path], **change}, timeout=60)
    assert r.status_code == 200, r.text


@pytest.mark.parametrize(
    "item, named",
    [
        ({"type": "reasoning", "content": 5}, "input.0.content"),
        ({"type": "reasoning", "content": "a thought"}, "input.0.content"),
        ({"type": "reasoning", "summary": 5}, "input.0.summary"),
        ({"type": "reasoning", "summary": ["a thought"]}, "input.0.summary.0"),
    ],
)
def test_a_reasoning_item_whose_parts_are_no_list_is_400_naming_them(server, item, named):
    body = {"input": [item, {"role": "user", "content": "hi"}], "max_output_tokens": 2}
    assert _named(httpx.post(server.base_url + RESPONSES, json=body, timeout=60)) == named
    assert _healthy(server)

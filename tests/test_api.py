"""The OpenAI-compatible API against a real server process, through the official SDK."""

from __future__ import annotations

import json

import httpx
import openai
import pytest
from tokenizers import Tokenizer

from tests.support.chat import chat
from tests.support.inprocess import InProcessServer

pytestmark = pytest.mark.process
PROMPT = "Write a short story about a lighthouse keeper."


def test_health_and_models(server, client):
    r = httpx.get(server.base_url + "/health")
    assert r.status_code == 200
    health = r.json()
    assert health["status"] == "ok"
    assert health["kv"] == {"hot": "kv16", "working": "kv16", "disk": "kv16"}  # the fixture's --kv-bits 16
    assert health["warm_tier"]["status"] == "on"
    assert str(server.cache_dir) not in r.text  # /health needs no key: it names no path
    models = client.models.list()
    assert [m.id for m in models.data] == ["tiny"]


def test_chat_completion_shape_and_usage(client):
    r = chat(client, PROMPT, max_tokens=16)
    assert r.object == "chat.completion"
    assert r.choices[0].message.role == "assistant"
    assert r.choices[0].message.content
    assert r.choices[0].finish_reason in ("stop", "length")
    u = r.usage
    assert 0 < u.completion_tokens <= 16
    assert u.total_tokens == u.prompt_tokens + u.completion_tokens
    details = u.prompt_tokens_details
    assert details.cached_tokens == details.model_extra["hot_tokens"] + details.model_extra["warm_tokens"]
    assert details.cached_tokens < u.prompt_tokens


def test_max_completion_tokens_limits_output(client):
    r = client.chat.completions.create(
        model="tiny", messages=[{"role": "user", "content": PROMPT}], max_completion_tokens=5, temperature=0
    )
    assert r.usage.completion_tokens <= 5
    if r.usage.completion_tokens == 5:
        assert r.choices[0].finish_reason == "length"


def test_developer_role_and_text_parts(client):
    as_parts = client.chat.completions.create(
        model="tiny",
        messages=[
            {"role": "developer", "content": "Be brief."},
            {"role": "user", "content": [{"type": "text", "text": "Hello "}, {"type": "text", "text": "there"}]},
        ],
        max_tokens=12,
        temperature=0,
    )
    as_text = client.chat.completions.create(
        model="tiny",
        messages=[{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Hello there"}],
        max_tokens=12,
        temperature=0,
    )
    assert as_parts.choices[0].message.content == as_text.choices[0].message.content
    assert as_parts.usage.prompt_tokens == as_text.usage.prompt_tokens


def test_streaming_matches_non_streaming_and_reports_usage(client):
    whole = chat(client, PROMPT, max_tokens=20)
    stream = client.chat.completions.create(
        model="tiny",
        messages=[{"role": "user", "content": PROMPT}],
        max_tokens=20,
        temperature=0,
        stream=True,
        stream_options={"include_usage": True},
    )
    chunks = list(stream)
    assert chunks[0].choices[0].delta.role == "assistant"
    text = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    assert text == whole.choices[0].message.content
    finish = [c.choices[0].finish_reason for c in chunks if c.choices and c.choices[0].finish_reason]
    assert finish == [whole.choices[0].finish_reason]
    usage_chunks = [c for c in chunks if c.usage is not None]
    assert len(usage_chunks) == 1 and usage_chunks[0] is chunks[-1] and not chunks[-1].choices
    assert usage_chunks[0].usage.completion_tokens == whole.usage.completion_tokens
    assert "hot_tokens" in usage_chunks[0].usage.prompt_tokens_details.model_extra


def test_stream_without_usage_option_has_no_usage(client):
    chunks = list(
        client.chat.completions.create(
            model="tiny", messages=[{"role": "user", "content": "Hi"}], max_tokens=4, stream=True
        )
    )
    assert all(c.usage is None for c in chunks)


def test_completions_text_and_token_ids_agree(client, tiny_model):
    text = "The old lighthouse stood on the rocks"
    ids = Tokenizer.from_file(str(tiny_model / "tokenizer.json")).encode(text, add_special_tokens=False).ids
    by_text = client.completions.create(model="tiny", prompt=text, max_tokens=16, temperature=0)
    by_ids = client.completions.create(model="tiny", prompt=ids, max_tokens=16, temperature=0)
    assert by_text.object == "text_completion"
    assert by_text.choices[0].text == by_ids.choices[0].text
    assert by_text.usage.prompt_tokens == len(ids) == by_ids.usage.prompt_tokens
    streamed = client.completions.create(model="tiny", prompt=text, max_tokens=16, temperature=0, stream=True)
    assert "".join(c.choices[0].text for c in streamed if c.choices) == by_text.choices[0].text


def _token_boundaries(tiny_model, text: str) -> list[int]:
    """Character offsets in `text` where one generated token ends and the next begins."""
    tok = Tokenizer.from_file(str(tiny_model / "tokenizer.json"))
    ids = tok.encode(text, add_special_tokens=False).ids
    return [len(tok.decode(ids[:i])) for i in range(1, len(ids))]


def test_stop_string_across_tokens_is_enforced_and_excluded(client, tiny_model):
    full = chat(client, PROMPT, max_tokens=40).choices[0].message.content
    cuts = [b for b in _token_boundaries(tiny_model, full) if 6 <= b <= len(full) - 4]
    assert cuts, f"output too short to test stops: {full!r}"
    at = cuts[len(cuts) // 2]
    stop = full[at - 3 : at + 3]  # spans a token boundary
    expected = full[: full.index(stop)]
    r = chat(client, PROMPT, max_tokens=40, stop=[stop, "zzz-never"])
    assert r.choices[0].message.content == expected
    assert r.choices[0].finish_reason == "stop"
    stream = client.chat.completions.create(
        model="tiny", messages=[{"role": "user", "content": PROMPT}], max_tokens=40, temperature=0, stop=stop, stream=True
    )
    assert "".join(c.choices[0].delta.content or "" for c in stream if c.choices) == expected


def test_seed_makes_sampling_reproducible(client):
    def sample(seed):
        return chat(client, PROMPT, max_tokens=24, seed=seed, temperature=1.0, top_p=0.95).choices[0].message.content

    assert sample(1234) == sample(1234)
    assert len({sample(s) for s in range(4)}) > 1


def test_unknown_fields_are_ignored(client):
    r = chat(client, "Hi", max_tokens=4, extra_body={"frobnicate": True, "logit_bias": {}, "tools": []})
    assert r.choices[0].message.content is not None


# -- errors --------------------------------------------------------------------------------


def _error(server, method: str, path: str, **kw) -> tuple[int, dict]:
    r = httpx.request(method, server.base_url + path, timeout=60, **kw)
    body = r.json()
    assert set(body) == {"error"}
    assert set(body["error"]) == {"message", "type", "param", "code"}
    assert body["error"]["message"]
    return r.status_code, body["error"]


def test_context_length_exceeded_by_prompt(client):
    with pytest.raises(openai.BadRequestError) as e:
        chat(client, "lighthouse " * 20_000, max_tokens=1)
    assert e.value.code == "context_length_exceeded"


@pytest.mark.parametrize(
    "body, param_part",
    [
        ({"messages": [{"role": "user", "content": "Hi"}], "temperature": "hot"}, "temperature"),
        ({"messages": [{"role": "user", "content": "Hi"}], "temperature": 3}, "temperature"),
        ({"messages": [{"role": "user", "content": "Hi"}], "max_tokens": 0}, "max_tokens"),
        ({"messages": "Hi"}, "messages"),
        ({"messages": []}, "messages"),
        ({"messages": [{"role": "wizard", "content": "Hi"}]}, "role"),
        ({"messages": [{"role": "user", "content": "Hi"}], "n": 0}, "n"),
        ({"messages": [{"role": "user", "content": "Hi"}], "n": 17}, "n"),
        ({"model": "tiny"}, "messages"),
    ],
)
def test_bad_chat_requests_are_400_with_a_reason(server, body, param_part):
    status, error = _error(server, "POST", "/v1/chat/completions", json=body)
    assert status == 400
    assert error["type"] == "invalid_request_error"
    assert param_part in (error["param"] or "") + error["message"]


def test_an_image_url_is_400_unless_the_operator_allows_fetching(client):
    """tests/test_images_input.py: images in every API, and every way one is refused."""
    with pytest.raises(openai.BadRequestError) as e:
        client.chat.completions.create(
            model="tiny",
            messages=[{"role": "user", "content": [{"type": "image_url", "image_url": {"url": "http://x/y.png"}}]}],
        )
    assert e.value.body["param"] == "messages.0.content.0" and "--image-urls" in e.value.message


@pytest.mark.parametrize(
    "path, body, param",
    [
        ("/v1/chat/completions", {"messages": [{"role": "user", "content": "x"}]}, "messages.1.content.1"),
        ("/v1/messages", {"model": "tiny", "max_tokens": 4, "messages": [{"role": "user", "content": "x"}]}, "messages.1.content.1"),
        ("/v1/responses", {"input": [{"role": "user", "content": "x"}]}, "input.1.content.1"),
    ],
)
def test_an_unknown_content_part_is_a_400_naming_its_path(server, path, body, param):
    """The part itself is named (its index in its message's content), in each API's shape."""
    parts = [{"type": "text", "text": "look:"}, {"type": "hologram", "data": "..."}]
    key = "input" if path == "/v1/responses" else "messages"
    body = {**body, key: [*body[key], {"role": "user", "content": parts}]}
    r = httpx.post(server.base_url + path, json=body, timeout=60)
    error = r.json()["error"]  # Anthropic's shape has no param: the message names the path
    assert r.status_code == 400, error
    assert error.get("param", param) == param and param in error["message"] and "hologram" in error["message"]


def test_malformed_json_is_400(server):
    status, error = _error(
        server, "POST", "/v1/chat/completions", content=b'{"messages": [', headers={"content-type": "application/json"}
    )
    assert status == 400 and "JSON" in error["message"]


def test_completion_token_ids_out_of_vocab_are_400(server):
    status, error = _error(server, "POST", "/v1/completions", json={"prompt": [1, 2, 10**9], "max_tokens": 2})
    assert status == 400 and error["param"] == "prompt"


def test_completion_unsupported_options_are_400(server):
    for extra in ({"echo": True}, {"best_of": 3}, {"prompt": ["a", "b"]}, {"n": 0}):
        status, _ = _error(server, "POST", "/v1/completions", json={"prompt": "a", "max_tokens": 2, **extra})
        assert status == 400, extra


def test_agent_id_too_long_is_400(client):
    with pytest.raises(openai.BadRequestError) as e:
        chat(client, "Hi", max_tokens=2, user="a" * 257)  # prompt_cache_key stops at 64, as OpenAI's
    assert "256" in e.value.message


def test_unknown_route_and_method_keep_the_error_shape(server):
    assert _error(server, "GET", "/v1/nothing-here")[0] == 404
    assert _error(server, "GET", "/v1/chat/completions")[0] == 405


def test_foreign_host_header_is_refused(server):
    status, error = _error(server, "GET", "/v1/models", headers={"host": "evil.example:8000"})
    assert status == 400 and error["code"] == "invalid_host"


def test_body_over_limit_is_413(server):
    big = json.dumps({"messages": [{"role": "user", "content": "x" * (17 << 20)}]}).encode()
    status, _ = _error(server, "POST", "/v1/chat/completions", content=big, headers={"content-type": "application/json"})
    assert status == 413


def test_api_key_is_required_when_set(tiny_model, tmp_path):
    with InProcessServer(tiny_model, tmp_path, "--api-key", "s3cret") as s:
        assert httpx.get(s.base_url + "/health").status_code == 200
        status, error = _error(s, "GET", "/v1/models")
        assert status == 401 and error["code"] == "invalid_api_key"
        assert httpx.get(s.base_url + "/v1/models", headers={"x-api-key": "s3cret"}).status_code == 200
        with pytest.raises(openai.AuthenticationError):
            s.client(api_key="wrong").models.list()
        assert chat(s.client(api_key="s3cret"), "Hi", max_tokens=2).choices


def test_non_loopback_host_without_key_refuses_to_start(tiny_model, tmp_path):
    import subprocess
    import sys

    r = subprocess.run(
        [sys.executable, "-m", "agent_memory", "serve", "--model", str(tiny_model), "--host", "0.0.0.0"],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert r.returncode == 2
    assert "--api-key" in r.stderr

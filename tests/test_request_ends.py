"""How a request's output ends, the same on every API, on a tiny model with a 1024-token context:
a limit over the room the prompt leaves is the room (the reply ends with `length` there and
the log says `clamped=`), only a prompt with no room is refused, a request that sends no limit
gets its model's `--default-max-tokens`, and a client that leaves is logged as `status=499`."""

from __future__ import annotations

import json
import socket
import time

import httpx
import pytest

from tests.support.inprocess import InProcessServer, refused_start

CONTEXT = 1024
DEFAULT = 6  # --default-max-tokens tight=6 (beating the 8 every model gets)
# Fills most of the context: each API's prompt leaves a little room (its template's few tokens aside).
NEARLY_FULL = "the " * 990  # one token each in the tiny tokenizer
ASKED = 32000  # what opencode asks of a model it does not know


@pytest.fixture(scope="module")
def tight(tmp_path_factory):
    from agent_memory.models.tiny import build_tiny

    root = tmp_path_factory.mktemp("tight")
    model = build_tiny(root / "tiny-1024", config={"max_position_embeddings": CONTEXT})
    args = ["--default-max-tokens", "8", "--default-max-tokens", f"tight={DEFAULT}"]
    with InProcessServer(f"tight={model}", root / "cache", *args) as server:
        yield server


# API: (path, the body for a prompt and a limit (None: none sent), the tokens it generated and its end)
def _chat(prompt, limit):
    return {"messages": [{"role": "user", "content": prompt}], **({"max_tokens": limit} if limit else {})}


def _completions(prompt, limit):
    return {"prompt": prompt, **({"max_tokens": limit} if limit else {})}


def _responses(prompt, limit):
    return {"input": prompt, **({"max_output_tokens": limit} if limit else {})}


def _messages(prompt, limit):
    return {"messages": [{"role": "user", "content": prompt}], "max_tokens": limit}


APIS = {
    "chat": ("/v1/chat/completions", _chat),
    "completions": ("/v1/completions", _completions),
    "responses": ("/v1/responses", _responses),
    "messages": ("/v1/messages", _messages),
}


def ended(api: str, body: dict) -> tuple[int, int, str]:
    """(prompt tokens, generated tokens, how it ended) of a JSON reply."""
    usage = body["usage"]
    if api == "responses":
        end = body["incomplete_details"]["reason"] if body["incomplete_details"] else body["status"]
        return usage["input_tokens"], usage["output_tokens"], end
    if api == "messages":
        prompt = usage["input_tokens"] + usage["cache_creation_input_tokens"] + usage["cache_read_input_tokens"]
        return prompt, usage["output_tokens"], body["stop_reason"]
    return usage["prompt_tokens"], usage["completion_tokens"], body["choices"][0]["finish_reason"]


LENGTH = {"chat": "length", "completions": "length", "responses": "max_output_tokens", "messages": "max_tokens"}
ROOM_ENDED = {**LENGTH, "messages": "model_context_window_exceeded"}


def post(server, api: str, body: dict, request_id: str) -> httpx.Response:
    path, _ = APIS[api]
    headers = {"X-Request-Id": request_id}
    body = {"model": "tight", "temperature": 0, **body}
    return httpx.post(server.base_url + path, json=body, headers=headers, timeout=120)


def decoding(server) -> float:
    """How many sequences the engine is decoding now (/metrics)."""
    for line in httpx.get(server.base_url + "/metrics").text.splitlines():
        if line.startswith('agent_memory_sequences{state="decoding"}'):
            return float(line.rpartition(" ")[2])
    raise AssertionError("no agent_memory_sequences in /metrics")


def logged(server, request_id: str) -> str:
    """The request's log line, once written (after its response, or after its client left)."""
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        for line in server.log().splitlines():
            if "agent_memory.requests" in line and f"request_id={request_id} " in line + " ":
                return line
        time.sleep(0.1)
    raise AssertionError(f"no log line for {request_id}")


@pytest.mark.parametrize("api", sorted(APIS))
def test_a_limit_over_the_room_left_is_the_room(tight, api):
    """opencode's max_tokens 32000 on a 1024-token model: answered, to the end of the context."""
    _, make = APIS[api]
    r = post(tight, api, make(NEARLY_FULL, ASKED), f"clamp-{api}")
    assert r.status_code == 200, r.text
    prompt, generated, end = ended(api, r.json())
    assert 0 < CONTEXT - prompt < 64, prompt  # a prompt that leaves a little room
    assert (generated, end) == (CONTEXT - prompt, ROOM_ENDED[api])
    assert f"clamped={ASKED}->{CONTEXT - prompt}" in logged(tight, f"clamp-{api}").split()


@pytest.mark.parametrize("api", sorted(APIS))
def test_only_a_prompt_with_no_room_left_is_refused(tight, api):
    _, make = APIS[api]
    r = post(tight, api, make(NEARLY_FULL + "the " * 60, ASKED), f"full-{api}")
    assert r.status_code == 400, r.text
    body = r.json()
    if api == "messages":
        assert body["type"] == "error" and "prompt is too long" in body["error"]["message"]
    else:
        error = body["error"]
        assert error["code"] == "context_length_exceeded" and "no room is left" in error["message"], error


@pytest.mark.parametrize("api", ["chat", "completions", "responses"])
def test_a_request_that_sends_no_limit_gets_its_models_default(tight, api):
    _, make = APIS[api]
    r = post(tight, api, make("Tell me about the harbour.", None), f"default-{api}")
    assert r.status_code == 200, r.text
    _, generated, end = ended(api, r.json())
    assert (generated, end) == (DEFAULT, LENGTH[api])
    r = post(tight, api, make("Tell me about the harbour.", DEFAULT + 3), f"own-{api}")
    assert ended(api, r.json())[1:] == (DEFAULT + 3, LENGTH[api])  # a limit sent wins


def test_the_models_list_shows_the_default_limit(tight):
    (model,) = [m for m in httpx.get(tight.base_url + "/v1/models").json()["data"] if m["id"] == "tight"]
    assert model["max_model_len"] == CONTEXT and model["sampling_defaults"]["max_tokens"] == DEFAULT


def test_a_default_limit_for_no_served_model_is_refused_at_start(tight):
    said = refused_start(tight.model, tight.cache_dir / "refused", "--default-max-tokens", "other=5")
    assert "--default-max-tokens other=…: not a served model's name" in said, said


def _leave(server, api: str, stream: bool, request_id: str) -> None:
    """Send a long request over a raw connection and close it: after the first event of a
    stream, or once the engine decodes a JSON reply's tokens."""
    path, make = APIS[api]
    payload = json.dumps({"model": "tight", "temperature": 0, "stream": stream, **make("Hello.", 900)}).encode()
    head = (
        f"POST {path} HTTP/1.1\r\nHost: 127.0.0.1:{server.port}\r\nContent-Type: application/json\r\n"
        f"Content-Length: {len(payload)}\r\nX-Request-Id: {request_id}\r\n\r\n"
    )
    with socket.create_connection(("127.0.0.1", server.port), timeout=60) as sock:
        sock.sendall(head.encode() + payload)
        if stream:
            received = b""
            while b"data:" not in received or not received.split(b"data:", 1)[1].count(b"\n\n"):
                chunk = sock.recv(65536)
                assert chunk, received
                received += chunk
            assert received.startswith(b"HTTP/1.1 200")
        else:
            deadline = time.monotonic() + 60
            while decoding(server) < 1:
                assert time.monotonic() < deadline, "the request never started decoding"
                time.sleep(0.05)


@pytest.mark.parametrize("stream", [True, False], ids=["stream", "json"])
@pytest.mark.parametrize("api", sorted(APIS))
def test_a_client_that_leaves_is_logged_as_499(tight, api, stream):
    request_id = f"left-{api}-{'stream' if stream else 'json'}"
    _leave(tight, api, stream, request_id)
    line = logged(tight, request_id)
    assert "status=499" in line.split(), line
    deadline = time.monotonic() + 60  # and its generation was cancelled: the engine is idle again
    while decoding(tight) > 0 and time.monotonic() < deadline:
        time.sleep(0.05)
    assert decoding(tight) == 0

"""Reasoning handed to clients sealed (api/sealing.py): a Responses reasoning item's
`encrypted_content` and an Anthropic thinking block's `signature` are the text encrypted and
authenticated under the server's key, for one tenant. Sent back, they give the model its
reasoning again; altered, foreign or another tenant's, they are a 400 naming the item. The key
is a private file that outlives a restart, and servers given one file open each other's blobs.
A real server on Qwen3.5's template (its prompt opens the reasoning) with two tenants."""

from __future__ import annotations

import base64

import anthropic
import openai
import pytest

from tests.support.inprocess import InProcessServer, refused_start
from tests.support.templates import templated_model


KEYS = {"alice": "key-alice", "bob": "key-bob"}
TOOL = {
    "type": "function",
    "name": "get_weather",
    "description": "The forecast.",
    "parameters": {
        "type": "object",
        "properties": {"city": {"type": "string", "enum": ["Oslo", "Lima"]}},
        "required": ["city"],
    },
}
QUESTION = "What is the weather in Oslo?"
ASK = dict(model="m", tools=[TOOL], max_output_tokens=64, temperature=0, store=False)
ASK["include"] = ["reasoning.encrypted_content"]


@pytest.fixture(scope="module")
def model(tmp_path_factory):
    return templated_model(tmp_path_factory.getbasetemp() / "templated", "qwen3_5")


@pytest.fixture(scope="module")
def keys_file(tmp_path_factory):
    path = tmp_path_factory.mktemp("keys") / "keys"
    path.write_text("".join(f"{name} {key}\n" for name, key in KEYS.items()))
    return path


@pytest.fixture(scope="module")
def server(model, keys_file, tmp_path_factory):
    with InProcessServer(model, tmp_path_factory.mktemp("cache-sealed"), "--api-keys-file", str(keys_file)) as s:
        yield s


@pytest.fixture(scope="module")
def turn(server):
    """Alice's first turn: its reasoning item (sealed) and its call."""
    first = server.client(api_key=KEYS["alice"]).responses.create(input=QUESTION, tool_choice="required", **ASK)
    thought = next(i for i in first.output if i.type == "reasoning")
    call = next(i for i in first.output if i.type == "function_call")
    assert thought.content[0].text and thought.encrypted_content
    return thought, call


def follow_up(turn, reasoning: dict | None) -> list[dict]:
    """The next turn's input: the question, the reasoning item as given, the call and its result."""
    thought, call = turn
    items = [{"type": "message", "role": "user", "content": QUESTION}]
    items += [{"type": "reasoning", "id": thought.id, "summary": [], **reasoning}] if reasoning is not None else []
    items.append({"type": "function_call", "call_id": call.call_id, "name": call.name, "arguments": call.arguments})
    items.append({"type": "function_call_output", "call_id": call.call_id, "output": "Sunny, 21 C."})
    return items


def send(server, items, key="alice"):
    return server.client(api_key=KEYS[key]).responses.create(input=items, **ASK)


def refusal(server, items, key="alice") -> dict:
    """The error object of a refused request (the SDK gives its `error` field)."""
    with pytest.raises(openai.BadRequestError) as refused:
        send(server, items, key)
    return refused.value.body


def flipped(blob: str) -> str:
    """The blob with one bit of its ciphertext flipped, still well-formed base64."""
    prefix, body = blob.split(".", 1)
    raw = bytearray(base64.urlsafe_b64decode(body))
    raw[len(raw) // 2] ^= 1
    return f"{prefix}." + base64.urlsafe_b64encode(bytes(raw)).decode()


def test_encrypted_content_round_trips_and_hides_the_text(server, turn):
    """Only `encrypted_content` sent back: the prompt holds the reasoning exactly as when its
    text is sent; the blob holds no readable trace of the text."""
    thought, _ = turn
    text = thought.content[0].text
    sealed = send(server, follow_up(turn, {"encrypted_content": thought.encrypted_content}))
    in_clear = send(server, follow_up(turn, {"content": [{"type": "reasoning_text", "text": text}]}))
    without = send(server, follow_up(turn, None))
    assert sealed.usage.input_tokens == in_clear.usage.input_tokens > without.usage.input_tokens
    raw = base64.urlsafe_b64decode(thought.encrypted_content.split(".", 1)[1])
    assert text.encode() not in raw and text not in thought.encrypted_content
    assert thought.encrypted_content.startswith("am2.")


def test_an_altered_or_foreign_blob_is_refused_naming_the_item(server, turn):
    thought, _ = turn
    for blob in (
        flipped(thought.encrypted_content),
        thought.encrypted_content[:-8],  # cut short
        "am1." + base64.urlsafe_b64encode(b'{"reasoning": "forged", "sha256": "..."}').decode(),  # the old format
        "gAAAAABforeign",  # not this server's
        7,
    ):
        error = refusal(server, follow_up(turn, {"encrypted_content": blob}))
        assert (error["param"], error["code"], error["type"]) == (
            "input.1.encrypted_content",
            "invalid_encrypted_content",
            "invalid_request_error",
        )
        assert error["message"].startswith("input.1.encrypted_content is not valid")
    old = refusal(server, follow_up(turn, {"encrypted_content": "am1.e30="}))["message"]
    assert "am1." in old and "no longer accepted" in old


def test_another_tenants_blob_is_refused(server, turn):
    thought, _ = turn
    error = refusal(server, follow_up(turn, {"encrypted_content": thought.encrypted_content}), key="bob")
    assert error["param"] == "input.1.encrypted_content" and "another tenant" in error["message"]


def claude(server, key="alice") -> anthropic.Anthropic:
    return anthropic.Anthropic(base_url=server.base_url, api_key=KEYS[key], max_retries=0)


def test_a_thinking_block_is_accepted_only_with_its_own_signature(server):
    """The signature is the thinking sealed: sent back whole, the block is the turn's reasoning
    (the prompt is longer by it); altered, moved to other text, left out or another tenant's,
    it is Anthropic's invalid_request_error naming it."""
    tool = {"name": TOOL["name"], "description": TOOL["description"], "input_schema": TOOL["parameters"]}
    question = {"role": "user", "content": QUESTION}
    ask = dict(model="m", tools=[tool])
    first = claude(server).messages.create(**ask, max_tokens=64, messages=[question], tool_choice={"type": "any"})
    block = next(b for b in first.content if b.type == "thinking")
    call = next(b for b in first.content if b.type == "tool_use")
    assert block.thinking and block.thinking not in block.signature and block.signature.startswith("am2.")

    def turn(thinking: dict | None) -> list[dict]:
        use = {"type": "tool_use", "id": call.id, "name": call.name, "input": call.input}
        answer = {"role": "assistant", "content": ([{"type": "thinking", **thinking}] if thinking else []) + [use]}
        result = {"type": "tool_result", "tool_use_id": call.id, "content": "Sunny, 21 C."}
        return [question, answer, {"role": "user", "content": [result]}]

    good = {"thinking": block.thinking, "signature": block.signature}
    count = claude(server).messages.count_tokens
    assert count(**ask, messages=turn(good)).input_tokens > count(**ask, messages=turn(None)).input_tokens
    assert claude(server).messages.create(**ask, max_tokens=16, messages=turn(good)).stop_reason
    for bad, key in (
        ({**good, "signature": flipped(block.signature)}, "alice"),
        ({**good, "thinking": block.thinking + " (edited)"}, "alice"),
        ({"thinking": block.thinking}, "alice"),
        (good, "bob"),
    ):
        with pytest.raises(anthropic.BadRequestError) as refused:
            claude(server, key).messages.create(**ask, max_tokens=16, messages=turn(bad))
        error = refused.value.body["error"]
        assert error["type"] == "invalid_request_error"
        assert error["message"].startswith("messages.1.content.0.signature")


def test_the_key_is_private_outlives_a_restart_and_can_be_shared(server, turn, model, keys_file, tmp_path):
    """The key file is 0600; after a restart on the same cache folder, and on another server
    given the same file (`--seal-key-file`, as servers behind a router are), the blob opens."""
    thought, _ = turn
    key_file = server.cache_dir / "seal.key"
    assert key_file.stat().st_mode & 0o777 == 0o600
    key = key_file.read_text()
    items = follow_up(turn, {"encrypted_content": thought.encrypted_content})
    before = send(server, items).usage.input_tokens
    server.stop()
    server.start()
    assert key_file.read_text() == key and send(server, items).usage.input_tokens == before
    shared = ("--api-keys-file", str(keys_file), "--seal-key-file", str(key_file))
    with InProcessServer(model, tmp_path / "other", *shared) as other:
        assert send(other, items).usage.input_tokens == before
        assert not (other.cache_dir / "seal.key").exists()


def test_a_missing_operator_key_file_stops_the_start(model, tmp_path):
    """A --seal-key-file that does not exist is not made (servers meant to share it would each
    make their own): the start stops, naming it."""
    missing = tmp_path / "absent.key"
    said = refused_start(model, tmp_path, "--seal-key-file", str(missing))
    assert str(missing) in said and not missing.exists()

"""Retries keep everything, on every layer kind (issue #35, point 2): a named agent's turn sent
again — as it was (a client's resend after a timeout), after the client left mid-reply, and after
the server was killed mid-reply — reuses all of its prompt but the last token, on full attention
(llama), sliding-window (gemma3_text) and recurrent hybrid (qwen3_5) layers. The prompt is
committed for its agent as soon as it is prefilled (engine/commit.py `start_turn`), and a model
with state layers keeps that snapshot as its `turn_start`, which no follow-up replaces
(memory/index/snapshots.py). The tiny models, at `--kv-bits 16` (the in-process and process
servers' default in the tests)."""

from __future__ import annotations

import contextlib
import json
import time
from pathlib import Path

import httpx
import pytest

from agent_memory.models.tiny import build_tiny
from tests.support.chat import tiers
from tests.support.inprocess import InProcessServer
from tests.support.metrics import metric
from tests.support.server import Server

ARCHS = ["llama", "qwen3_5", "gemma3_text"]  # full attention, recurrent hybrid, sliding window
SYSTEM = (
    "You keep the logbook of the lighthouse on the northern cape. You answer questions about ships, "
    "storms, the lamp, the fog bell and the supply boat, in a few words, and say plainly when the log "
    "has no entry. The log is kept in ink, one page a night, and every page names the keeper on duty, "
    "the weather at dusk and at dawn, the ships that passed and any lights seen at sea. "
) * 3
QUESTIONS = ["What happened on the night of the great storm?", "Which ship ran aground near the rocks?"]
REPLY_TOKENS = 24  # long enough for a random model's reply to re-tokenize otherwise (a follow-up)


@pytest.fixture(scope="module")
def models(tmp_path_factory):
    root = tmp_path_factory.mktemp("retry-families")
    return lambda arch: build_tiny(root / arch, arch=arch)


def model_flags(models) -> list[str]:
    """The families after the first, as more `--model`s of one server."""
    return [arg for arch in ARCHS[1:] for arg in ("--model", str(models(arch)))]


@pytest.fixture(scope="module")
def families(models, tmp_path_factory):
    with InProcessServer(models(ARCHS[0]), tmp_path_factory.mktemp("retries"), *model_flags(models)) as s:
        yield s


def turn(client, arch: str, agent: str, messages: list[dict], **kw):
    kw.setdefault("max_tokens", REPLY_TOKENS)
    return client.chat.completions.create(
        model=arch, messages=messages, temperature=0, extra_body={"prompt_cache_key": agent}, **kw
    )


def second_turn(client, arch: str, agent: str) -> list[dict]:
    """The agent's first turn; the messages of its second."""
    messages = [{"role": "system", "content": SYSTEM}, {"role": "user", "content": QUESTIONS[0]}]
    first = turn(client, arch, agent, messages)
    assert first.usage.completion_tokens > 0, first
    return messages + [
        {"role": "assistant", "content": first.choices[0].message.content},
        {"role": "user", "content": QUESTIONS[1]},
    ]


def idle(server, **model: str) -> None:
    """Wait until the engine (of `model=ID` on a server of several) holds no sequence, a
    follow-up included: what a turn leaves behind is then all in its memory. A deadline, not an
    assertion on time."""
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline:
        states = ("waiting", "prefilling", "decoding")
        if not sum(metric(server, "agent_memory_sequences", state=state, **model) for state in states):
            return
        time.sleep(0.05)
    raise AssertionError(f"the engine {model} never became idle")


def until_first_token(stream) -> None:
    """Read a stream up to its first generated token's chunk (or its end, if that came first)."""
    next(c for c in stream if c.choices and (c.choices[0].delta.content or c.choices[0].finish_reason))


def reused(response) -> int:
    return sum(tiers(response))


def all_but_the_last(arch: str, response, what: str) -> None:
    prompt = response.usage.prompt_tokens
    assert reused(response) >= prompt - 1, f"{arch}: {what} reused {tiers(response)} (hot, warm) of {prompt}"


@pytest.mark.parametrize("arch", ARCHS)
def test_the_same_turn_sent_again_reuses_all_of_its_prompt(families, arch):
    """The 243-of-451 case: the first send's reply re-tokenizes otherwise, so a follow-up computes
    its canonical tokens after it; the resend still resumes at the first send's prompt end."""
    client = families.client()
    messages = second_turn(client, arch, "resend")
    first = turn(client, arch, "resend", messages)
    idle(families, model=arch)  # the follow-up, if any, has run
    again = turn(client, arch, "resend", messages)
    all_but_the_last(arch, again, "a resend")
    assert again.choices[0].message.content == first.choices[0].message.content


@pytest.mark.parametrize("arch", ARCHS)
def test_a_retry_after_the_client_left_mid_reply_reuses_all_of_its_prompt(families, arch):
    client = families.client()
    messages = second_turn(client, arch, "leaves")
    stream = turn(client, arch, "leaves", messages, max_tokens=2000, stream=True)
    until_first_token(stream)
    stream.close()
    idle(families, model=arch)  # the server saw it leave and kept what it computed
    retry = turn(client, arch, "leaves", messages)
    all_but_the_last(arch, retry, "a retry after a disconnect")


def manifest_of(cache_dir: Path, agent: str) -> dict | None:
    """The agent's manifest on disk (in any model folder) if every file it names is there too."""
    for path in (cache_dir / "kv").glob("*/agents/*.json"):
        with contextlib.suppress(FileNotFoundError, json.JSONDecodeError):  # replaced meanwhile
            manifest = json.loads(path.read_text())
            if manifest["agent"] == agent:
                names = {f.stem for f in (path.parent.parent / "blocks").rglob("*.safetensors")}
                named = {*manifest["blocks"], *(h for _, h in manifest.get("snapshots", []))}
                return manifest if named <= names else None
    return None


@pytest.mark.process
def test_a_retry_after_the_server_was_killed_mid_reply_reuses_all_of_its_prompt_from_disk(models, tmp_path):
    """Each family's second turn is killed (SIGKILL) once its first token has come and its prompt's
    commit is on disk; after a restart the retry reuses all of its prompt but the last token."""
    server = Server(models(ARCHS[0]), tmp_path, *model_flags(models)).start()
    try:
        client = server.client()
        turns = {}
        for arch in ARCHS:
            messages = second_turn(client, arch, f"{arch}-crash")
            probe = client.chat.completions.create(  # its length, in a namespace of its own
                model=arch, messages=messages, max_tokens=1, extra_body={"cache_salt": f"probe-{arch}"}
            )
            stream = turn(client, arch, f"{arch}-crash", messages, max_tokens=2000, stream=True)
            until_first_token(stream)
            turns[arch] = (messages, probe.usage.prompt_tokens, stream)
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline:  # the writer thread puts the prompts on disk meanwhile
            held = {arch: manifest_of(tmp_path, f"{arch}-crash") for arch in ARCHS}
            if all(m is not None and len(m["tokens"]) >= turns[a][1] - 1 for a, m in held.items()):
                break
            time.sleep(0.05)
        server.kill()
        for _, _, stream in turns.values():
            with contextlib.suppress(Exception):  # its connection was cut by the kill
                stream.close()
        server = Server(models(ARCHS[0]), tmp_path, *model_flags(models)).start()
        client = server.client()
        for arch, (messages, prompt, _) in turns.items():
            retry = turn(client, arch, f"{arch}-crash", messages)
            assert retry.usage.prompt_tokens == prompt
            warm = tiers(retry)[1]
            assert warm >= prompt - 1, f"{arch}: a retry after a crash reused {tiers(retry)} (hot, warm) of {prompt}"
    finally:
        server.stop()


def test_a_turn_with_no_agent_leaves_no_snapshot_pinned(models, tmp_path):
    """A hybrid's anonymous turn takes a snapshot where it ends, held for the sequence: let go of
    when it ends, it cools under a hot budget of nothing like every other block."""
    with InProcessServer(models("qwen3_5"), tmp_path, "--hot-budget-mb", "0") as s:
        client = s.client()
        for question in QUESTIONS:
            messages = [{"role": "system", "content": SYSTEM}, {"role": "user", "content": question}]
            client.chat.completions.create(model="qwen3_5", messages=messages, max_tokens=8, temperature=0)
        idle(s)
        totals = httpx.get(s.base_url + "/v1/agents").json()
        assert totals["snapshot_hot_bytes"] == 0 and totals["hot_bytes"] == 0, totals

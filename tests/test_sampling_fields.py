"""Every sampling field honoured, through the real server and the openai SDK: logprobs on chat,
completions and Responses (streamed and not), frequency/presence/repetition penalties, n > 1
samples sharing one prefill — each the same with prompt-lookup speculation (the default) as
without it, outputs and logprobs."""

from __future__ import annotations

import json
import math

import pytest

# `models`: the tied tiny model, whose greedy output repeats itself.
from tests.support.inprocess import InProcessServer
from tests.support.tied import ANSWER, FEW, PROMPTS, models  # noqa: F401


TOLERANCE = 1e-3  # a verify pass computes a position in a wider matmul than a one-token step


@pytest.fixture(scope="module")
def pair(models, tmp_path_factory):  # noqa: F811
    """The model served without speculation, and with prompt lookup (the default)."""
    model, _ = models
    with InProcessServer(model, tmp_path_factory.mktemp("off"), "--speculation", "off") as off:
        with InProcessServer(model, tmp_path_factory.mktemp("lookup")) as lookup:
            yield off, lookup


def chat(prompt: str, max_tokens: int = 24, **kw) -> dict:
    return dict(model="tiny", messages=[{"role": "user", "content": prompt}], max_tokens=max_tokens, **kw)


def entries(logprobs) -> list[tuple]:
    """Chat or Responses logprobs as (token, logprob, [(token, logprob), ...]) tuples."""
    return [(e.token, e.logprob, [(t.token, t.logprob) for t in e.top_logprobs]) for e in logprobs]


def close(a: list[tuple], b: list[tuple]) -> bool:
    """The same tokens (and alternatives), logprobs equal within TOLERANCE."""
    if [(t, [x for x, _ in top]) for t, _, top in a] != [(t, [x for x, _ in top]) for t, _, top in b]:
        return False
    pairs = []
    for (_, lx, tx), (_, ly, ty) in zip(a, b):
        pairs += [(lx, ly), *zip([v for _, v in tx], [v for _, v in ty])]
    return all(abs(x - y) <= TOLERANCE for x, y in pairs)


def streamed_chat(client, body: dict) -> tuple[dict[int, str], dict[int, list]]:
    """A stream's text and logprob entries by choice index."""
    texts: dict[int, str] = {}
    logprobs: dict[int, list] = {}
    for chunk in client.chat.completions.create(**body, stream=True):
        for choice in chunk.choices:
            texts[choice.index] = texts.get(choice.index, "") + (choice.delta.content or "")
            if choice.logprobs is not None:
                logprobs.setdefault(choice.index, []).extend(entries(choice.logprobs.content))
    return texts, logprobs


def test_chat_logprobs(pair):
    off, lookup = pair
    body = chat(PROMPTS[1], 24, temperature=0, logprobs=True, top_logprobs=3, **FEW)
    got = {}
    for server in pair:
        reply = server.client().chat.completions.create(**body)
        choice = reply.choices[0]
        content = entries(choice.logprobs.content)
        assert choice.finish_reason == "length" and len(content) == reply.usage.completion_tokens == 24
        for entry, raw in zip(content, choice.logprobs.content):
            token, logprob, top = entry
            assert len(top) == 3 and [v for _, v in top] == sorted((v for _, v in top), reverse=True)
            assert top[0][0] == token and math.isclose(math.exp(logprob), math.exp(top[0][1]), abs_tol=1e-6)
            assert logprob <= 0 and raw.bytes == list(token.encode())
        assert "".join(t for t, _, _ in content) == choice.message.content
        texts, streamed = streamed_chat(server.client(), body)
        assert texts[0] == choice.message.content and close(streamed[0], content)
        got[server] = (choice.message.content, content)
    assert got[off][0] == got[lookup][0] and close(got[off][1], got[lookup][1])


def test_logprobs_refused_out_of_range(pair):
    http = pair[0].http()
    limits = (("top_logprobs", 21), ("frequency_penalty", 2.5), ("presence_penalty", -3), ("repetition_penalty", 0))
    for field, value in limits:
        extra = {"logprobs": True} if field == "top_logprobs" else {}
        r = http.post("/v1/chat/completions", json=chat("hi", 4, **{field: value}, **extra))
        assert r.status_code == 400 and field in r.json()["error"]["message"]
    r = http.post("/v1/chat/completions", json=chat("hi", 4, top_logprobs=2))
    assert r.status_code == 400 and "top_logprobs needs logprobs" in r.json()["error"]["message"]
    r = http.post("/v1/completions", json={"model": "tiny", "prompt": "hi", "max_tokens": 4, "logprobs": 21})
    assert r.status_code == 400


def test_completion_logprobs_legacy_shape(pair):
    body = dict(model="tiny", prompt=PROMPTS[1], max_tokens=16, temperature=0, logprobs=2, **FEW)
    got = []
    for server in pair:
        client = server.client()
        choice = client.completions.create(**body).choices[0]
        lp = choice.logprobs
        assert len(lp.tokens) == len(lp.token_logprobs) == len(lp.top_logprobs) == len(lp.text_offset) == 16
        assert "".join(lp.tokens) == choice.text
        assert lp.text_offset == [sum(len(t) for t in lp.tokens[:i]) for i in range(16)]
        for token, logprob, top in zip(lp.tokens, lp.token_logprobs, lp.top_logprobs):
            assert 1 <= len(top) <= 2 and math.isclose(logprob, max(top.values()), abs_tol=1e-6) and token in top
        tokens, offsets = [], []
        for chunk in client.completions.create(**body, stream=True):
            if chunk.choices and chunk.choices[0].logprobs is not None:
                tokens += chunk.choices[0].logprobs.tokens
                offsets += chunk.choices[0].logprobs.text_offset
        assert tokens == lp.tokens and offsets == lp.text_offset
        got.append((choice.text, lp.token_logprobs))
    assert got[0][0] == got[1][0] and all(abs(a - b) <= TOLERANCE for a, b in zip(got[0][1], got[1][1]))


def test_responses_logprobs(pair):
    got = []
    for server in pair:
        client = server.client()
        kw = dict(model="tiny", input=PROMPTS[1], max_output_tokens=16, temperature=0)
        response = client.responses.create(**kw, include=["message.output_text.logprobs"], top_logprobs=2)
        part = response.output[-1].content[0]
        assert part.logprobs and all(len(e.top_logprobs) == 2 for e in part.logprobs)
        assert "".join(e.token for e in part.logprobs) == part.text
        assert all(math.isclose(e.logprob, e.top_logprobs[0].logprob, abs_tol=1e-6) for e in part.logprobs)
        plain = client.responses.create(**kw)
        assert plain.output[-1].content[0].logprobs == [] and plain.output_text == response.output_text
        deltas = []
        stream = client.responses.create(**kw, include=["message.output_text.logprobs"], top_logprobs=2, stream=True)
        for event in stream:
            if event.type == "response.output_text.delta":
                deltas += entries(event.logprobs)
        assert close(deltas, entries(part.logprobs))
        got.append(entries(part.logprobs))
    assert close(*got)


def test_penalties(pair):
    off, lookup = pair
    # Its greedy output repeats one token (".__" over and over): every penalty changes it.
    plain = off.client().chat.completions.create(**chat(PROMPTS[2], 32, temperature=0))
    plain = plain.choices[0].message.content
    outputs = {}
    for server in pair:
        client = server.client()
        for name, kw in (
            ("zero", {"frequency_penalty": 0.0, "presence_penalty": 0.0}),
            ("frequency", {"frequency_penalty": 2.0}),
            ("presence", {"presence_penalty": 2.0}),
            ("repetition", {"extra_body": {"repetition_penalty": 1.5}}),  # vLLM's: not in the SDK
        ):
            body = chat(PROMPTS[2], 32, temperature=0, **kw)
            text = client.chat.completions.create(**body).choices[0].message.content
            assert streamed_chat(client, body)[0][0] == text
            outputs[server, name] = text
    assert outputs[off, "zero"] == plain
    for name in ("frequency", "presence", "repetition"):
        assert outputs[off, name] != plain  # the repeating greedy output changes
    assert all(outputs[off, name] == outputs[lookup, name] for name in ("zero", "frequency", "presence", "repetition"))


def test_n_samples(pair):
    off, lookup = pair
    body = chat(PROMPTS[3], 20, temperature=2.0, seed=7, n=3)
    got = {}
    for server in pair:
        client = server.client()
        reply = client.chat.completions.create(**body)
        assert [c.index for c in reply.choices] == [0, 1, 2]
        texts = [c.message.content for c in reply.choices]
        assert len(set(texts)) > 1  # samples, not one answer thrice
        again = client.chat.completions.create(**body)
        assert [c.message.content for c in again.choices] == texts
        single = client.chat.completions.create(**{**body, "n": 1})
        assert single.choices[0].message.content == texts[0]
        assert reply.usage.prompt_tokens == single.usage.prompt_tokens  # the prompt once, the samples added up
        assert all(c.finish_reason == "length" for c in reply.choices) and reply.usage.completion_tokens == 60
        streamed, _ = streamed_chat(client, {**body, "stream_options": {"include_usage": True}})
        assert [streamed[i] for i in range(3)] == texts
        completions = client.completions.create(
            model="tiny", prompt=PROMPTS[0], max_tokens=8, n=2, seed=3, temperature=1.0
        )
        assert [c.index for c in completions.choices] == [0, 1]
        got[server] = texts
    assert got[off] == got[lookup]


def test_n_samples_each_follow_the_grammar(pair):
    """Each sample has its own copy of the grammar's matcher: each choice is a valid answer."""
    fmt = {"type": "json_schema", "json_schema": {"name": "answer", "schema": ANSWER}}
    body = chat(PROMPTS[3], 60, temperature=1.0, seed=5, n=3, response_format=fmt)
    for server in pair:
        reply = server.client().chat.completions.create(**body)
        answers = [json.loads(c.message.content) for c in reply.choices]
        assert all(set(a) == {"city", "days"} and isinstance(a["days"], int) for a in answers)

"""Exact while hot: at the default precision (Q4 at rest), an agent active recently keeps its
KV as computed, so a repeated temperature-0 request answers token for token like the first;
under the hot budget's pressure its blocks are quantized, still hits, and count less."""

from __future__ import annotations

import asyncio

import httpx
import pytest

from tests.support.chat import tiers
from tests.support.inprocess import InProcessServer

SYSTEM = "You keep the harbour's tide tables and answer the pilots' questions. " * 10
QUESTIONS = [f"When is high water at pier {i}, and what should a pilot watch for?" for i in range(8)]


def conversation(question: str) -> list[dict]:
    return [{"role": "system", "content": SYSTEM}, {"role": "user", "content": question}]


@pytest.fixture(scope="module")
def q4(tiny_model, tmp_path_factory):
    with InProcessServer(tiny_model, tmp_path_factory.mktemp("q4"), "--kv-bits", "4") as s:  # the defaults
        yield s


def agent(server, agent_id: str) -> dict:
    return httpx.get(f"{server.base_url}/v1/agents/{agent_id}").json()


def test_a_repeat_to_a_hot_agent_answers_like_the_first(q4):
    client = q4.client()

    def chat(stream: bool = False):
        kw = dict(model="tiny", messages=conversation(QUESTIONS[0]), max_tokens=24, temperature=0)
        kw["extra_body"] = {"prompt_cache_key": "pilot"}
        if not stream:
            return client.chat.completions.create(**kw).choices[0].message.content
        return "".join(c.choices[0].delta.content or "" for c in client.chat.completions.create(stream=True, **kw))

    first = chat()
    assert chat() == first and chat(stream=True) == first
    info = agent(q4, "pilot")
    assert info["bytes"]["hot_exact"] > 0 and info["bytes"]["hot_quantized"] == 0

    def complete():
        r = client.completions.create(
            model="tiny", prompt=SYSTEM + QUESTIONS[1], max_tokens=16, temperature=0, extra_body={"prompt_cache_key": "text"}
        )
        return r.choices[0].text, r.usage.prompt_tokens_details.cached_tokens

    (once, _), (twice, cached) = complete(), complete()
    assert twice == once and cached > 0


def test_eight_repeats_in_a_batch_answer_like_their_first_runs(q4):
    client = q4.client()
    first = [
        client.chat.completions.create(
            model="tiny", messages=conversation(q), max_tokens=16, temperature=0, extra_body={"prompt_cache_key": f"b{i}"}
        ).choices[0].message.content
        for i, q in enumerate(QUESTIONS)
    ]

    async def together():
        aclient = q4.async_client()
        rs = await asyncio.gather(
            *(
                aclient.chat.completions.create(
                    model="tiny", messages=conversation(q), max_tokens=16, temperature=0, extra_body={"prompt_cache_key": f"b{i}"}
                )
                for i, q in enumerate(QUESTIONS)
            )
        )
        return [r.choices[0].message.content for r in rs], [tiers(r)[0] for r in rs]

    again, hot = asyncio.run(together())
    assert again == first and all(h > 0 for h in hot)


def test_under_pressure_blocks_cool_to_q4_and_still_hit(tiny_model, tmp_path):
    # About 2 MB of exact KV per conversation against a 1 MiB hot budget: quantized, they fit.
    with InProcessServer(tiny_model, tmp_path, "--kv-bits", "4", "--hot-budget-mb", "1", "--disk-budget-mb", "0") as s:
        client = s.client()
        messages = conversation(QUESTIONS[2])
        r1 = client.chat.completions.create(
            model="tiny", messages=messages, max_tokens=8, temperature=0, extra_body={"prompt_cache_key": "cooled"}
        )
        totals = httpx.get(s.base_url + "/v1/agents").json()
        assert totals["hot_bytes"] <= totals["hot_budget_bytes"]
        info = agent(s, "cooled")
        assert info["bytes"]["hot_quantized"] > 0 and info["bytes"]["hot_exact"] < info["bytes"]["hot"]
        turn2 = messages + [
            {"role": "assistant", "content": r1.choices[0].message.content},
            {"role": "user", "content": "And at low water?"},
        ]
        r2 = client.chat.completions.create(
            model="tiny", messages=turn2, max_tokens=8, temperature=0, extra_body={"prompt_cache_key": "cooled"}
        )
        hot, warm = tiers(r2)
        assert hot >= r1.usage.prompt_tokens - 64 and warm == 0  # read back from quantized blocks


@pytest.fixture(scope="module")
def llama4_q4(tmp_path_factory):
    from agent_memory.models.tiny import build_tiny

    model = build_tiny(tmp_path_factory.mktemp("llama4-model") / "llama4", arch="llama4")
    with InProcessServer(model, tmp_path_factory.mktemp("llama4-q4"), "--kv-bits", "4") as s:
        yield s


def test_llama4_repeats_answer_like_their_first_runs_alone_and_together(llama4_q4):
    """Llama 4's chunked layers come back from a snapshot of their last chunk (never quantized),
    its global layer from exact blocks; its sequences each decode in a batch of their own, side by side."""
    client = llama4_q4.client()

    def chat(i: int):
        return client.chat.completions.create(
            model="llama4",
            messages=conversation(QUESTIONS[i]),
            max_tokens=24,
            temperature=0,
            extra_body={"prompt_cache_key": f"pilot-{i}"},
        )

    # The second computes the system prompt again, leaving a snapshot where it ends; the later ones resume there.
    first = [chat(i) for i in range(4)]
    assert tiers(first[0]) == (0, 0) and all(tiers(r)[0] > 0 for r in first[2:]), [tiers(r) for r in first]

    async def together():
        aclient = llama4_q4.async_client()
        return await asyncio.gather(
            *(
                aclient.chat.completions.create(
                    model="llama4",
                    messages=conversation(QUESTIONS[i]),
                    max_tokens=24,
                    temperature=0,
                    extra_body={"prompt_cache_key": f"pilot-{i}"},
                )
                for i in range(4)
            )
        )

    again = asyncio.run(together())
    assert [r.choices[0].message.content for r in again] == [r.choices[0].message.content for r in first]
    assert all(tiers(r)[0] > r.usage.prompt_tokens - 64 for r in again), [(tiers(r), r.usage.prompt_tokens) for r in again]
    assert "Traceback" not in llama4_q4.log()

"""Agent memory in RAM, through the real server: reuse across turns, shared prefixes, branches,
eviction and return, and ending agents."""

from __future__ import annotations

import asyncio
import time

import httpx
import pytest
from tokenizers import Tokenizer

from tests.support.inprocess import InProcessServer
from tests.support.metrics import metric

SYSTEM = (
    "You are the archivist of a coastal town. You answer questions about its lighthouse, its "
    "harbour, its fishing fleet and the storms of the last hundred years. Keep answers short, "
    "cite the year when you know it, and say plainly when the archive has no record. "
) * 3
QUESTIONS = [
    "When was the lighthouse built?",
    "Which storm damaged the harbour wall?",
    "How many boats were in the fleet in 1950?",
    "Who kept the light during the war?",
]


def ask(client, messages, agent=None, max_tokens=16):
    extra = {"prompt_cache_key": agent} if agent else {}
    return client.chat.completions.create(
        model="tiny", messages=messages, max_tokens=max_tokens, temperature=0, extra_body=extra
    )


def details(response) -> dict:
    d = response.usage.prompt_tokens_details
    return {"cached": d.cached_tokens, "hot": d.model_extra["hot_tokens"], "warm": d.model_extra["warm_tokens"]}


def agents(server) -> dict:
    return httpx.get(server.base_url + "/v1/agents").json()


def settled_agents(server) -> dict:
    """/v1/agents once the engine holds no sequence: a reply can come back before the follow-up
    prefill its turn queued (the reply's canonical tokens, engine/commit.py) has stored its KV."""
    deadline = time.monotonic() + 60
    states = ("waiting", "prefilling", "decoding")
    while any(metric(server, "agent_memory_sequences", state=s) for s in states):
        assert time.monotonic() < deadline, "the engine did not go idle"
        time.sleep(0.05)
    return agents(server)


@pytest.fixture(scope="module")
def fresh(tiny_model, tmp_path_factory):
    """Answers from a server that has never seen anything: the uncached reference."""

    def answer(messages, max_tokens=16):
        with InProcessServer(tiny_model, tmp_path_factory.mktemp("fresh"), "--disk-budget-mb", "0") as s:
            return ask(s.client(), messages, max_tokens=max_tokens).choices[0].message.content

    return answer


def whole_word_bias(tiny_model, n: int = 64) -> dict[str, int]:
    """logit_bias that makes the tiny model answer in whole-word tokens (" the", " of", ...).
    Re-encoding such a reply gives back exactly the generated tokens, as a real model's
    replies mostly do; random weights otherwise produce token runs BPE would merge."""
    tokenizer = Tokenizer.from_file(str(tiny_model / "tokenizer.json"))
    words = sorted(
        i
        for t, i in tokenizer.get_vocab().items()
        if t.startswith("Ġ") and t[1:].isalpha() and tokenizer.encode(tokenizer.decode([i])).ids == [i]
    )
    return {str(i): 100 for i in words[:n]}


def two_turns(client, agent, reply_bias=None):
    turn1 = [{"role": "system", "content": SYSTEM}, {"role": "user", "content": QUESTIONS[0]}]
    r1 = client.chat.completions.create(
        model="tiny",
        messages=turn1,
        max_tokens=16,
        temperature=0,
        extra_body={"prompt_cache_key": agent, "logit_bias": reply_bias or {}},
    )
    turn2 = turn1 + [
        {"role": "assistant", "content": r1.choices[0].message.content},
        {"role": "user", "content": QUESTIONS[1]},
    ]
    return r1, turn2, ask(client, turn2, agent=agent)


def test_second_turn_reuses_prompt_and_reply_and_matches_uncached(server, fresh, tiny_model):
    r1, turn2, r2 = two_turns(server.client(), "alice", whole_word_bias(tiny_model))
    assert details(r1)["cached"] < r1.usage.prompt_tokens
    d = details(r2)
    # All of turn 1, its reply included, is reused from memory.
    assert d["cached"] >= r1.usage.prompt_tokens + r1.usage.completion_tokens - 2
    assert d["hot"] == d["cached"] and d["warm"] == 0
    assert r2.choices[0].message.content == fresh(turn2)


def test_a_reply_that_retokenizes_differently_is_reused_up_to_the_first_changed_token(server, fresh):
    """Without the bias the reply's text encodes to other tokens than were generated: reuse
    stops exactly where the two token sequences part, and the output is still the fresh one."""
    r1, turn2, r2 = two_turns(server.client(), "carol")
    assert details(r2)["cached"] >= r1.usage.prompt_tokens
    assert r2.choices[0].message.content == fresh(turn2)


def test_regenerate_and_branch_reuse_up_to_the_first_changed_token(server):
    client = server.client()
    base = [{"role": "system", "content": SYSTEM}, {"role": "user", "content": QUESTIONS[2]}]
    first = ask(client, base, agent="bob")
    again = ask(client, base, agent="bob")  # regenerate: all but the last prompt token
    assert details(again)["cached"] == first.usage.prompt_tokens - 1
    assert again.choices[0].message.content == first.choices[0].message.content
    edited = [base[0], {"role": "user", "content": QUESTIONS[2].replace("1950", "1960")}]
    branch = ask(client, edited, agent="bob")
    shared_chars = QUESTIONS[2].index("1950")
    # The system prompt and the unchanged start of the question are reused.
    assert details(branch)["cached"] >= first.usage.prompt_tokens - shared_chars // 2 - 8
    assert details(branch)["cached"] < branch.usage.prompt_tokens


def test_shared_system_prompt_is_stored_once_and_reused_by_a_new_agent(tiny_model, tmp_path):
    with InProcessServer(tiny_model, tmp_path, "--disk-budget-mb", "0") as s:
        client = s.client()
        ask(client, [{"role": "system", "content": SYSTEM}, {"role": "user", "content": QUESTIONS[0]}], "a0")
        one = agents(s)["hot_bytes"]
        tokenizer = Tokenizer.from_file(str(tiny_model / "tokenizer.json"))
        shared = f"<|im_start|>system\n{SYSTEM}<|im_end|>\n<|im_start|>user\n"
        system_tokens = len(tokenizer.encode(shared, add_special_tokens=False).ids) - 1
        for i in range(1, 4):
            r = ask(client, [{"role": "system", "content": SYSTEM}, {"role": "user", "content": QUESTIONS[i]}], f"a{i}")
            assert details(r)["cached"] >= system_tokens  # the newcomer skips the shared prefill
        total = agents(s)["hot_bytes"]
        # Four agents cost far less than four copies: the shared blocks are held once.
        assert total < 2.2 * one


def test_an_agent_arriving_while_another_decodes_reuses_their_shared_prompt(tiny_model, tmp_path):
    """The first agent's prompt blocks are offered for reuse once its prefill ends, not when
    its reply does: a newcomer arriving mid-reply skips the shared prefill."""
    vocab = Tokenizer.from_file(str(tiny_model / "tokenizer.json")).get_vocab()
    no_end = {str(vocab[t]): -100 for t in ("<|im_end|>", "<|endoftext|>")}
    system = [{"role": "system", "content": SYSTEM * 2}]
    with InProcessServer(tiny_model, tmp_path, "--disk-budget-mb", "0") as s:
        client = s.client()
        stream = client.chat.completions.create(
            model="tiny",
            messages=system + [{"role": "user", "content": QUESTIONS[0]}],
            max_tokens=400,
            temperature=0,
            stream=True,
            extra_body={"prompt_cache_key": "first", "logit_bias": no_end},
        )
        next(c for c in stream if c.choices and c.choices[0].delta.content)  # it is decoding
        newcomer = ask(client, system + [{"role": "user", "content": QUESTIONS[1]}], "second")
        still_running = sum(1 for _ in stream)
        assert still_running > 0  # the first reply was not over when the newcomer came
        assert details(newcomer)["cached"] >= newcomer.usage.prompt_tokens - 64 - 16


def test_an_agent_that_moves_on_frees_the_blocks_only_its_old_turn_used(tiny_model, tmp_path):
    """Editing the question leaves the old question's and reply's blocks unreachable: they are
    freed at once, so memory holds one copy of the conversation, not one per attempt."""
    vocab = Tokenizer.from_file(str(tiny_model / "tokenizer.json")).get_vocab()
    no_end = {str(vocab[t]): -100 for t in ("<|im_end|>", "<|endoftext|>")}
    with InProcessServer(tiny_model, tmp_path, "--disk-budget-mb", "0") as s:
        client = s.client()
        for i, question in enumerate(QUESTIONS):  # each time a different question, same length of reply
            client.chat.completions.create(
                model="tiny",
                messages=[{"role": "system", "content": SYSTEM}, {"role": "user", "content": question}],
                max_tokens=200,
                temperature=0,
                extra_body={"prompt_cache_key": "solo", "logit_bias": no_end},
            )
            if i == 0:
                once = settled_agents(s)["hot_bytes"]
        assert settled_agents(s)["hot_bytes"] <= once * 1.1


def test_concurrent_agents_get_exactly_their_own_answers(server, fresh):
    personas = ["a sailor", "a baker", "a judge", "a child"]
    convs = [
        [{"role": "system", "content": f"You are {p}. " + SYSTEM[:200]}, {"role": "user", "content": q}]
        for p, q in zip(personas, QUESTIONS)
    ]

    async def run_all():
        client = server.async_client()

        async def two_turns(i):
            r1 = await client.chat.completions.create(
                model="tiny", messages=convs[i], max_tokens=12, temperature=0, extra_body={"prompt_cache_key": f"p{i}"}
            )
            turn2 = convs[i] + [
                {"role": "assistant", "content": r1.choices[0].message.content},
                {"role": "user", "content": "And then?"},
            ]
            r2 = await client.chat.completions.create(
                model="tiny", messages=turn2, max_tokens=12, temperature=0, extra_body={"prompt_cache_key": f"p{i}"}
            )
            return turn2, r2

        return await asyncio.gather(*(two_turns(i) for i in range(4)))

    for turn2, r2 in asyncio.run(run_all()):
        assert details(r2)["cached"] > 0
        assert r2.choices[0].message.content == fresh(turn2, max_tokens=12)


def test_evicted_agent_returns_with_identical_output(tiny_model, tmp_path):
    # ~1 MiB holds a few hundred tokens of the tiny model's KV: other agents push the first out.
    with InProcessServer(tiny_model, tmp_path, "--hot-budget-mb", "1", "--disk-budget-mb", "0") as s:
        client = s.client()
        conv = [{"role": "system", "content": SYSTEM}, {"role": "user", "content": QUESTIONS[0]}]
        before = ask(client, conv, "returning")
        for i in range(4):
            ask(client, [{"role": "system", "content": f"Persona {i}. " + SYSTEM}, {"role": "user", "content": "Hi"}], f"other{i}")
        mine = httpx.get(s.base_url + "/v1/agents/returning").json()
        assert mine["blocks"]["cold"] > 0, mine
        assert agents(s)["hot_bytes"] <= 1 << 20
        after = ask(client, conv, "returning")
        assert after.choices[0].message.content == before.choices[0].message.content
        assert details(after)["cached"] < after.usage.prompt_tokens - 1


def test_delete_agent_frees_its_own_blocks_and_keeps_shared_ones(tiny_model, tmp_path):
    with InProcessServer(tiny_model, tmp_path, "--disk-budget-mb", "0") as s:
        client = s.client()
        ask(client, [{"role": "system", "content": SYSTEM}, {"role": "user", "content": QUESTIONS[0]}], "keep")
        ask(client, [{"role": "system", "content": SYSTEM}, {"role": "user", "content": QUESTIONS[1] * 8}], "drop")
        before = agents(s)
        kept = httpx.get(s.base_url + "/v1/agents/keep").json()
        r = httpx.delete(s.base_url + "/v1/agents/drop")
        assert r.status_code == 200 and r.json()["deleted"] is True
        assert httpx.get(s.base_url + "/v1/agents/drop").status_code == 404
        assert httpx.delete(s.base_url + "/v1/agents/drop").status_code == 404
        after = agents(s)
        assert [a["id"] for a in after["data"]] == ["keep"]
        assert after["hot_bytes"] < before["hot_bytes"]
        assert httpx.get(s.base_url + "/v1/agents/keep").json()["bytes"] == kept["bytes"]


def test_agent_id_sources_in_order(server):
    client = server.client()
    conv = [{"role": "user", "content": "Which source names me?"}]
    ask(client, conv, max_tokens=2, agent=None)
    client.chat.completions.create(
        model="tiny", messages=conv, max_tokens=2, user="by-user", extra_headers={"X-Agent-Id": "by-header"}
    )
    client.chat.completions.create(model="tiny", messages=conv, max_tokens=2, user="by-user")
    client.chat.completions.create(
        model="tiny", messages=conv, max_tokens=2, metadata={"user_id": "by-metadata"}
    )
    client.chat.completions.create(
        model="tiny",
        messages=conv,
        max_tokens=2,
        extra_body={"prompt_cache_key": "by-key"},
        extra_headers={"X-Agent-Id": "not-me"},
    )
    ids = {a["id"] for a in agents(server)["data"]}
    assert {"by-header", "by-user", "by-metadata", "by-key"} <= ids
    assert "not-me" not in ids

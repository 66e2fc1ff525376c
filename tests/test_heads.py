"""Shared heads and pins (issue #35, point 5): a system prompt and tool set computed once — from
`--warm-prompts` at start or `POST /v1/heads` — so that the first request of every new agent that
starts with them already reuses them, on full attention (llama) and a recurrent hybrid (qwen3_5,
which resumes only at a snapshot: one sits where the head ends); a head listed, pinned, on disk
and restored by a restart, deletable. And agents pinned against eviction within half the hot
budget: a pinned agent outlives a flood that evicts the others, a pin over the budget is a 409
with the numbers, an unpinned agent is evictable again. The real server in-process, the tiny
models, the OpenAI SDK and httpx."""

from __future__ import annotations

import json
import time

import httpx
import pytest

from agent_memory.config import ConfigError
from agent_memory.models.tiny import build_tiny
from tests.support.inprocess import InProcessServer

SYSTEM = (
    "You are the harbour master's assistant. You answer questions about berths, tides, pilots, cargo "
    "manifests and the harbour's rules, briefly and exactly, and you say when you do not know. "
) * 3
TOOLS = [
    {
        "type": "function",
        "function": {
            "name": "tide_table",
            "description": "The tide table for a day at the harbour.",
            "parameters": {"type": "object", "properties": {"day": {"type": "string"}}, "required": ["day"]},
        },
    }
]
HEAD = {"messages": [{"role": "system", "content": SYSTEM}], "tools": TOOLS}


@pytest.fixture(scope="module")
def hybrid(tmp_path_factory):
    return build_tiny(tmp_path_factory.mktemp("models") / "qwen3_5", arch="qwen3_5")


def first_turn(server, agent: str, question: str, model: str = "tiny"):
    """A new agent's first request: the head's system prompt and tools, then its own question."""
    messages = [*HEAD["messages"], {"role": "user", "content": question}]
    return server.client().chat.completions.create(
        model=model, messages=messages, tools=TOOLS, max_tokens=4, temperature=0,
        extra_body={"prompt_cache_key": agent},
    )


def cached(response) -> int:
    return response.usage.prompt_tokens_details.cached_tokens


def heads(server) -> dict[str, dict]:
    answer = httpx.get(server.base_url + "/v1/heads")
    assert answer.status_code == 200, answer.text
    return {(h["model"], h["id"]): h for h in answer.json()["data"]}


def wait_for_heads(server, n: int) -> dict[str, dict]:
    """The --warm-prompts heads, once computed (after the model loads); fails after 60 s."""
    deadline = time.monotonic() + 60
    while len(found := heads(server)) < n:
        assert time.monotonic() < deadline, server.log()
        time.sleep(0.1)
    return found


def test_warm_prompts_are_reused_by_every_new_agent(tiny_model, hybrid, tmp_path):
    warm = tmp_path / "warm.jsonl"
    lines = [{**HEAD, "name": "harbour", "model": "tiny"}, {**HEAD, "name": "harbour-hybrid", "model": "qwen3_5"}]
    warm.write_text("\n".join(json.dumps(line) for line in lines) + "\n")
    args = ("--model", f"qwen3_5={hybrid}", "--warm-prompts", str(warm))
    with InProcessServer(tiny_model, tmp_path / "cache", *args) as s:
        found = wait_for_heads(s, 2)
        for model, name in (("tiny", "harbour"), ("qwen3_5", "harbour-hybrid")):
            head = found[model, name]
            assert head["pinned"] and head["object"] == "head" and head["tokens"] > 100
            for agent, question in (("first", "Where is berth 4?"), ("second", "When is high tide?")):
                answer = first_turn(s, f"{model}-{agent}", question, model)
                assert cached(answer) >= head["tokens"], (model, agent, head)
        listed = httpx.get(s.base_url + "/v1/agents").json()
        assert {h["id"] for h in listed["heads"]} == {"harbour", "harbour-hybrid"}
        assert "harbour" not in {a["id"] for a in listed["data"]}  # a head is not an agent


def test_a_head_over_http_is_reused_listed_restored_and_deleted(tiny_model, tmp_path):
    with InProcessServer(tiny_model, tmp_path) as s:
        made = httpx.post(s.base_url + "/v1/heads", json={**HEAD, "model": "tiny"}, timeout=60)
        assert made.status_code == 200, made.text
        head = made.json()
        assert head["id"].startswith("head_") and head["pinned"] and head["tokens"] > 100
        assert ("tiny", head["id"]) in heads(s)
        bad = httpx.post(s.base_url + "/v1/heads", json={"model": "tiny", "name": "empty", "messages": []})
        assert bad.status_code == 400 and bad.json()["error"]["param"] == "messages", bad.text
        assert cached(first_turn(s, "first", "Where is berth 4?")) >= head["tokens"]
    with InProcessServer(tiny_model, tmp_path) as s:  # a restart: the head is read back from disk
        restored = heads(s)[("tiny", head["id"])]
        assert restored["pinned"] and restored["tokens"] == head["tokens"]
        answer = first_turn(s, "second", "When is high tide?")
        assert answer.usage.prompt_tokens_details.model_extra["warm_tokens"] >= head["tokens"]
        unpinned = httpx.delete(f"{s.base_url}/v1/heads/{head['id']}/pin")
        assert unpinned.status_code == 200 and unpinned.json()["pinned"] is False
        assert heads(s)[("tiny", head["id"])]["pinned"] is False
        assert httpx.post(f"{s.base_url}/v1/heads/{head['id']}/pin").json()["pinned"]
    # A restart with a budget its pin no longer fits (half of 1 MiB): the pin is undone, said once.
    with InProcessServer(tiny_model, tmp_path, "--hot-budget-mb", "1") as s:
        assert heads(s)[("tiny", head["id"])]["pinned"] is False
        assert f"pins undone at start, over 50% of the hot budget now: head '{head['id']}'" in s.log()
        gone = httpx.delete(f"{s.base_url}/v1/heads/{head['id']}")
        assert gone.status_code == 200 and gone.json()["deleted"]
        assert heads(s) == {}
        again = httpx.delete(f"{s.base_url}/v1/heads/{head['id']}")
        assert again.status_code == 404 and again.json()["error"]["code"] == "head_not_found"


def test_a_bad_warm_prompts_line_refuses_the_start_naming_it(tiny_model, tmp_path):
    warm = tmp_path / "warm.jsonl"
    warm.write_text(json.dumps(HEAD) + "\n\n" + '{"messages": "not a list"}\n')
    with pytest.raises(ConfigError, match=r"warm\.jsonl, line 3: not a chat completions body"):
        InProcessServer(tiny_model, tmp_path / "cache", "--warm-prompts", str(warm)).start()


def agent_turn(server, agent: str, persona: str, repeat: int = 2):
    """A turn of ~280 tokens (1.1 MiB of the tiny model's KV at --kv-bits 16) per `repeat`."""
    messages = [{"role": "system", "content": persona + SYSTEM * repeat}, {"role": "user", "content": "Berth 4?"}]
    return server.client().chat.completions.create(
        model="tiny", messages=messages, max_tokens=4, temperature=0, extra_body={"prompt_cache_key": agent}
    )


def cold_blocks(server, agent: str) -> int:
    return httpx.get(f"{server.base_url}/v1/agents/{agent}").json()["blocks"]["cold"]


def pin(server, agent: str, on: bool = True) -> httpx.Response:
    return (httpx.post if on else httpx.delete)(f"{server.base_url}/v1/agents/{agent}/pin")


def test_a_pinned_agent_outlives_a_flood_within_half_the_budget(tiny_model, tmp_path):
    with InProcessServer(tiny_model, tmp_path, "--hot-budget-mb", "4", "--disk-budget-mb", "0") as s:
        agent_turn(s, "keeper", "Keeper. ", repeat=1)
        pinned = pin(s, "keeper")
        assert pinned.status_code == 200 and pinned.json()["pinned"], pinned.text
        assert httpx.get(s.base_url + "/v1/agents/keeper").json()["pinned"]
        for i in range(4):  # 9 MiB against 4
            agent_turn(s, f"other{i}", f"Persona {i}. ")
        assert cold_blocks(s, "keeper") == 0
        assert cold_blocks(s, "other0") > 0  # the flood evicted the unpinned
        agent_turn(s, "big", "Big. ")  # 2.2 MiB more than the 1 MiB left to pins
        over = pin(s, "big")
        assert over.status_code == 409, over.text
        error = over.json()["error"]
        assert error["code"] == "pin_over_budget"
        assert "pinning agent 'big' needs" in error["message"] and "of the 2 MiB they may (50% of the 4 MiB hot budget)" in error["message"]
        assert pin(s, "keeper", on=False).json()["pinned"] is False
        for i in range(4):
            agent_turn(s, f"again{i}", f"Again {i}. ")
        assert cold_blocks(s, "keeper") > 0  # evictable again
        missing = pin(s, "nobody")
        assert missing.status_code == 404 and missing.json()["error"]["code"] == "agent_not_found"

"""A model split over two processes serves as one process does (issue #38): `mlx.launch --backend
ring -n 2` on 127.0.0.1, a tensor-parallel family (the tiny llama) and a pipeline family (a tiny
qwen2). Each starts as asked (tensor where the family shards, pipeline where asked): rank 0
alone serves HTTP, rank 1 follows. At 16 bits the greedy answers of requests running side by
side — a stop string, n = 2, a JSON schema, a forced tool call, the Responses and Anthropic APIs
— equal a one-process server's on the same model; an agent's second turn reuses its first; a
follower killed mid-answer stops the server with one line, and the answers in flight end with
an error in their API's shape.

The memory is sharded like the model: each rank writes its part of every block to its own
folder (`-tp2r0`, `-tp2r1`, or its layers'), only rank 0 keeps manifests; a restart of both
ranks restores every rank's part, so the agent's next turn reads its history from disk on every
rank and answers as one process does (a block one rank lost is recomputed by both, a file rank 0
does not hold is deleted on rank 1); folders whose parts were swapped are not reused: one line
says why, and every rank starts cold; nor are they by one process on the same cache dir.

One launch per family serves the module (a start is seconds of both cores), stopped and launched
again on its folders by the tests of its memory; the killed follower has a launch of its own."""

from __future__ import annotations

import json
import os
import re
import signal
import threading
import time
from concurrent.futures import ThreadPoolExecutor

import anthropic
import httpx
import pytest
from typer.testing import CliRunner

from agent_memory.cli.cache.commands import cache_app
from tests.support.chat import WEATHER
from tests.support.distributed import Launched, Pair
from tests.support.inprocess import InProcessServer

pytestmark = pytest.mark.process

FLAGS = ("--disk-budget-mb", "64")
PLAN = "Plan a trip to the coast, step by step."
TOOL = {"type": "function", "function": {"name": "get_weather", "description": "The forecast", "parameters": WEATHER}}
TURN_1 = [{"role": "user", "content": "Agent memory: " + " ".join(f"fact {i} is {i * 3 % 7}." for i in range(40))}]


@pytest.fixture(scope="module", params=["tensor", "pipeline"])
def pair(request, tiny_model, tmp_path_factory):
    model = tiny_model
    args = [*FLAGS, "--distributed-timeout", "30"]
    if request.param == "pipeline":
        from agent_memory.models.tiny import build_tiny

        model = build_tiny(tmp_path_factory.mktemp("models") / "qwen2", arch="qwen2")
        args += ["--distributed", "pipeline"]
    with InProcessServer(model, tmp_path_factory.mktemp("one"), *FLAGS, "--speculation", "off") as one:
        both = Pair(model, tmp_path_factory.mktemp("split"), args, one)  # starting while the reference does
        try:
            assert both.split.health()["ranks"]["mode"] == request.param
            yield both
        finally:
            both.split.stop()


@pytest.mark.parametrize("pair", ["tensor"], indirect=True)
def test_tensor_split_rank_0_serves_and_rank_1_follows(pair):
    """The tiny llama's 2 KV heads, one a rank; rank 1 binds no port (its stop when rank 0 stops:
    `Pair.stop`, in the tests of the memory)."""
    split = pair.serving()
    health = split.health()
    assert health["status"] == "ok"
    assert health["ranks"] == {
        "size": 2,
        "mode": "tensor",
        "layout": "tensor 2×: kv heads 0 | 1",
        "parts": [{"rank": 0, "kv_heads": [0, 1], "layers": [0, 4]}, {"rank": 1, "kv_heads": [1, 2], "layers": [0, 4]}],
    }
    split.wait_for(r"rank=0/2 agent_memory\.api\.app: ready at .*; 2 ranks, tensor 2×: kv heads 0 \| 1")
    follows = r"rank=1/2 agent_memory\.cli\.distributed: rank 1 follows rank 0: tensor 2×: kv heads 0 \| 1, 4 l"
    log = split.wait_for(follows)
    assert "rank=1/2 uvicorn" not in log
    assert "speculation off: not yet run split over processes" in log


@pytest.mark.parametrize("pair", ["pipeline"], indirect=True)
def test_pipeline_split_where_asked(pair):
    split = pair.serving()
    # mlx-lm's pipeline gives rank 0 the last layers; each rank keeps caches for its own only
    assert split.health()["ranks"]["layout"] == "pipeline 2×: layers 2-3 | 0-1"
    split.wait_for(r"rank 1 follows rank 0: pipeline 2×: layers 2-3 \| 0-1, 2 layers here")


def answers(server) -> dict[str, object]:
    """Every request's greedy answer, the requests sent side by side."""
    chat = server.client()

    def ask(content: str, max_tokens: int = 16, **kw) -> list:
        """Each choice's text and its first tool call's arguments."""
        messages = [{"role": "user", "content": content}]
        reply = chat.chat.completions.create(
            model="tiny", messages=messages, max_tokens=max_tokens, temperature=0, **kw
        )
        calls = [c.message.tool_calls and c.message.tool_calls[0].function.arguments for c in reply.choices]
        return [(c.message.content, call) for c, call in zip(reply.choices, calls)]

    def respond() -> str:
        reply = chat.responses.create(model="tiny", input="Name a colour.", max_output_tokens=16, temperature=0)
        return reply.output_text

    def anthropic_message() -> str:
        client = anthropic.Anthropic(base_url=server.base_url, api_key="unused", max_retries=0)
        messages = [{"role": "user", "content": "Say hello."}]
        reply = client.messages.create(model="tiny", max_tokens=16, extra_body={"temperature": 0}, messages=messages)
        return reply.content[0].text

    schema = {"type": "json_schema", "json_schema": {"name": "weather", "schema": WEATHER, "strict": True}}
    work = {
        "plain 1": lambda: ask("Tell me about the sea."),
        "plain 2": lambda: ask("What is 2+2?"),
        "long": lambda: ask("A long " + "word " * 150),
        "stop": lambda: ask("Count: one two three", stop=["e"]),
        "n=2": lambda: ask("Write a word.", n=2),
        "schema": lambda: ask("The weather in Oslo?", response_format=schema, max_tokens=64),
        "tool": lambda: ask("Weather in Lima?", tools=[TOOL], tool_choice="required", max_tokens=64),
        "responses": respond,
        "anthropic": anthropic_message,
    }
    with ThreadPoolExecutor(len(work)) as pool:
        running = {name: pool.submit(fn) for name, fn in work.items()}
        return {name: future.result() for name, future in running.items()}


def test_greedy_answers_equal_one_process(pair):
    split, one = pair.serving(), pair.one
    got, expected = answers(split), answers(one)
    assert got == expected
    json.loads(got["schema"][0][0])  # constrained on rank 0 alone, yet a whole object
    assert json.loads(got["tool"][0][1])["city"] in {"Paris", "Oslo", "Lima"}


def turns(server, agent: str, follow_ups: tuple[str | None, ...]) -> tuple[list[str], object]:
    """An agent's turns (its history sent back each time): what it said, the last turn's usage."""
    chat = server.client()
    messages, said = [{"role": "user", "content": PLAN}], []
    for follow in follow_ups:
        reply = chat.chat.completions.create(
            model="tiny", messages=messages, max_tokens=12, temperature=0, extra_body={"prompt_cache_key": agent}
        )
        said.append(reply.choices[0].message.content)
        messages += [{"role": "assistant", "content": said[-1]}, {"role": "user", "content": follow}]
    return said, reply.usage


def test_turn_2_reuses_turn_1(pair):
    follow_ups = ("And the second day?", None)
    (said, usage), (expected, _) = turns(pair.serving(), "trip", follow_ups), turns(pair.one, "trip", follow_ups)
    assert said == expected
    assert usage.prompt_tokens_details.cached_tokens > 0  # every rank kept its part of turn 1's KV
    agents = httpx.get(pair.split.base_url + "/v1/agents").json()["data"]
    assert [a["id"] for a in agents].count("trip") == 1  # one agent, not one a rank


@pytest.mark.parametrize("pair", ["pipeline"], indirect=True)
def test_after_a_restart_of_both_ranks_turn_2_reads_turn_1_from_disk(pair):
    """Each rank wrote its layers' part of turn 1 to its own folder; both started again, turn 2
    reads it back on each and answers as one process does (tensor: the test below)."""
    (first,), _ = turns(pair.serving(), "voyage", (None,))
    pair.stop()
    pair.start()
    messages = [
        {"role": "user", "content": PLAN},
        {"role": "assistant", "content": first},
        {"role": "user", "content": "And the second day?"},
    ]
    second = pair.split.client().chat.completions.create(
        model="tiny", messages=messages, max_tokens=12, temperature=0, extra_body={"prompt_cache_key": "voyage"}
    )
    expected, _ = turns(pair.one, "voyage", ("And the second day?", None))
    assert [first, second.choices[0].message.content] == expected
    assert second.usage.prompt_tokens_details.model_extra["warm_tokens"] > 0, second.usage



def ask_as_keeper(base_url: str, messages: list) -> dict:
    body = {"model": "tiny", "messages": messages, "max_tokens": 12, "temperature": 0}
    answer = httpx.post(f"{base_url}/v1/chat/completions", json=body, headers={"X-Agent-Id": "keeper"}, timeout=300)
    assert answer.status_code == 200, answer.text
    return answer.json()


def turn_2(reply: str) -> list:
    return [*TURN_1, {"role": "assistant", "content": reply}, {"role": "user", "content": "And fact 7?"}]


@pytest.mark.parametrize("pair", ["tensor"], indirect=True)
def test_a_restart_of_both_ranks_restores_every_ranks_part_and_swapped_parts_start_cold(pair):
    first = ask_as_keeper(pair.one.base_url, TURN_1)["choices"][0]["message"]["content"]
    expected = ask_as_keeper(pair.one.base_url, turn_2(first))["choices"][0]["message"]["content"]

    split = pair.serving()
    assert ask_as_keeper(split.base_url, TURN_1)["choices"][0]["message"]["content"] == first
    held = [a["id"] for a in httpx.get(split.base_url + "/v1/agents").json()["data"]]
    pair.stop()  # rank 1 too wrote what it was told before it exited
    cache = pair.folder
    rank_0, rank_1 = sorted((cache / "kv").glob("*-tp2r*"))
    assert (rank_0.name[-5:], rank_1.name[-5:]) == ("tp2r0", "tp2r1")
    blocks = {p.name for p in (rank_0 / "blocks").glob("*/*")}
    assert blocks and blocks == {p.name for p in (rank_1 / "blocks").glob("*/*")}  # each rank its part
    manifests = [json.loads(p.read_text()) for p in (rank_0 / "agents").glob("*.json")]
    assert "keeper" in [m["agent"] for m in manifests] and not list((rank_1 / "agents").glob("*.json"))
    # `agent-memory cache` sees the server's agents once; rank 1's blocks are rank 0's agents', not orphans.
    stats = CliRunner().invoke(cache_app, ["stats", "--cache-dir", str(cache), "--format", "json"])
    rows = {row["folder"]: row for row in json.loads(stats.output)["models"]}
    assert [rows[f.name]["agents"] for f in (rank_0, rank_1)] == [len(held), 0]
    assert rows[rank_1.name]["block_files"] == len(blocks) and rows[rank_1.name]["orphan_blocks"] == 0
    for block in (rank_1 / "blocks").glob("*/*"):
        os.utime(block, (block.stat().st_atime, block.stat().st_mtime - 3600))  # past prune's grace
    pruned = CliRunner().invoke(cache_app, ["prune", "--cache-dir", str(cache), "--dry-run"])
    assert "0 items" in pruned.output, pruned.output

    stray = rank_1 / "blocks" / "ff" / ("ff" * 32 + ".safetensors")  # as a crash could leave: no manifest names it
    stray.parent.mkdir(exist_ok=True)
    stray.write_bytes(next((rank_1 / "blocks").glob("*/*")).read_bytes())

    (keeper,) = [m["blocks"] for m in manifests if m["agent"] == "keeper"]
    lost = rank_1 / "blocks" / keeper[-1][:2] / f"{keeper[-1]}.safetensors"  # the agent's part lost on rank 1 alone
    lost.unlink()

    split = pair.start()
    answer = ask_as_keeper(split.base_url, turn_2(first))
    log = pair.stop()
    assert answer["choices"][0]["message"]["content"] == expected  # as one process answers
    assert not stray.exists()  # rank 0 told rank 1 the blocks it holds
    details = answer["usage"]["prompt_tokens_details"]
    assert details["warm_tokens"] > 0  # read from disk, on every rank: the others' parts
    assert details["cache_miss"]["reason"] == "unreadable"  # the lost one recomputed by both ranks
    assert f"rank=1/2 agent_memory.engine.distributed.follower: block {lost.stem[:12]} unreadable here" in log
    assert f"block {lost.stem[:12]} unreadable (another rank could not read its part)" in log
    assert "not reused" not in log

    # The ranks' folders swapped: rank 0's now holds rank 1's heads.
    rank_0.rename(cache / "kv" / "swapping")
    rank_1.rename(rank_0)
    (cache / "kv" / "swapping").rename(rank_1)
    split = pair.start()
    answer = ask_as_keeper(split.base_url, turn_2(first))
    log = pair.stop()
    assert answer["choices"][0]["message"]["content"] == expected
    assert answer["usage"]["prompt_tokens_details"]["cached_tokens"] == 0  # cold: nothing reused
    lines = [line for line in log.splitlines() if "not reused" in line]
    assert len(lines) == 1, lines
    assert "rank=0/2" in lines[0]
    assert "starting cold: rank 0's folder holds the part of rank 1, not its own" in lines[0]

    # One process on the same cache dir: other folders, said once.
    with InProcessServer(pair.model, cache, "--kv-bits", "16", "--speculation", "off") as alone:
        assert ask_as_keeper(alone.base_url, turn_2(first))["usage"]["prompt_tokens_details"]["cached_tokens"] == 0
        said = [line for line in alone.log().splitlines() if "not reused" in line]
    assert len(said) == 1 and f"{rank_0.name}, {rank_1.name}: memory of a 2-way tensor split" in said[0], said
    assert "this server is one process" in said[0]


def test_a_killed_follower_stops_the_server_and_fails_the_answers_in_flight(tiny_model, tmp_path):
    """Rank 0's step waits for the killed rank in a collective that never returns (faults.py): the
    watchdog ends it after --distributed-timeout, 3 s here (a tiny model's step takes ms)."""
    launched = Launched(tiny_model, tmp_path / "cache", *FLAGS, "--distributed-timeout", "3")
    try:
        launched.health()
        streams: dict[str, list[str]] = {"openai": [], "anthropic": []}
        body = {"model": "tiny", "max_tokens": 2000, "temperature": 0, "stream": True}
        body["messages"] = [{"role": "user", "content": "go"}]
        routes = {"openai": "/v1/chat/completions", "anthropic": "/v1/messages"}

        def read(api: str) -> None:
            with httpx.stream("POST", launched.base_url + routes[api], json=body, timeout=120) as r:
                streams[api].extend(line for line in r.iter_lines() if line)

        readers = [threading.Thread(target=read, args=(api,)) for api in streams]
        for reader in readers:
            reader.start()
        while sum(line.startswith("data: {") for line in streams["openai"]) < 3:  # both streaming by now
            assert readers[0].is_alive(), streams
            time.sleep(0.01)
        os.kill(launched.rank_1_pid(), signal.SIGKILL)
        for reader in readers:
            reader.join(60)
        log = launched.ended()
    finally:
        launched.stop()
    said = r"rank=0/2 \S+: rank 0: the group failed \(.+\): 2 requests in flight end with an error; stopping \(exit 75"
    assert re.search(said, log)
    assert "Node with rank 0 exited with code 75" in log  # the launcher's line: it exits 0 itself
    openai_error = json.loads(streams["openai"][-2].removeprefix("data: "))["error"]
    assert openai_error["code"] == "rank_lost" and "a rank of the distributed server stopped" in openai_error["message"]
    assert streams["openai"][-1] == "data: [DONE]"
    event, data = streams["anthropic"][-2:]
    assert event == "event: error"
    assert json.loads(data.removeprefix("data: "))["error"]["type"] == "overloaded_error"

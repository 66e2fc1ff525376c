"""Several models in one server: the request's `model` picks one, each loads on demand, its
agents and blocks are its own, and one memory limit holds them all (an idle model unloads for
another, and its agents come back warm). Two tiny models of different families, through the
real server and SDKs."""

from __future__ import annotations

import concurrent.futures
import os
import re
import shutil
import time
from pathlib import Path

import anthropic
import httpx
import openai
import pytest

from agent_memory.models.tiny import build_tiny
from tests.support.cli import cache_json
from tests.support.inprocess import InProcessServer, refused_start
from tests.support.metrics import metric
from tests.support.server import Server

pytestmark = pytest.mark.process

SYSTEM = "You are a careful assistant who answers in one short sentence. " * 6


@pytest.fixture(scope="module")
def small(tmp_path_factory):
    """A second model of another family (qwen3; the session's tiny model is llama)."""
    return build_tiny(tmp_path_factory.mktemp("models") / "qwen3", arch="qwen3")


def turn(client, model: str, agent: str, question: str, history: list | None = None, system: str = SYSTEM):
    messages = [{"role": "system", "content": system}, *(history or []), {"role": "user", "content": question}]
    return client.chat.completions.create(
        model=model, messages=messages, max_tokens=8, temperature=0, extra_body={"prompt_cache_key": agent}
    )


def follow(first, question: str) -> list:
    return [{"role": "user", "content": question}, {"role": "assistant", "content": first.choices[0].message.content}]


def loaded(server) -> dict[str, bool]:
    return {m["id"]: m["loaded"] for m in httpx.get(server.base_url + "/health").json()["models"]}


def test_two_models_each_with_its_own_agents(tiny_model, small, tmp_path):
    with InProcessServer(tiny_model, tmp_path / "cache", "--model", f"small={small}") as s:
        client = s.client()
        assert loaded(s) == {"tiny": True, "small": False}  # the second loads on its first request
        # Named `small=`: listed as small, its folder's name an alias of it (its warm folder keeps that name).
        listed = [(m["id"], m["root"], m["max_model_len"]) for m in client.models.list().model_dump()["data"]]
        assert listed == [("tiny", "tiny", 4096), ("small", "small", 4096), ("qwen3", "small", 4096)]

        # The same agent id on both models, interleaved: two agents, each reusing its own turn.
        first = {m: turn(client, m, "alice", "Where is Paris?") for m in ("tiny", "small")}
        assert loaded(s) == {"tiny": True, "small": True} and "loading small for a request" in s.log()
        assert {m: r.model for m, r in first.items()} == {"tiny": "tiny", "small": "small"}
        assert all(r.usage.prompt_tokens_details.cached_tokens == 0 for r in first.values())
        with concurrent.futures.ThreadPoolExecutor(2) as pool:  # both engines at once
            second = dict(
                zip(
                    ("tiny", "small"),
                    pool.map(
                        lambda m: turn(client, m, "alice", "And Oslo?", follow(first[m], "Where is Paris?")),
                        ("tiny", "small"),
                    ),
                )
            )
        for model, reply in second.items():
            assert reply.usage.prompt_tokens_details.cached_tokens >= first[model].usage.prompt_tokens, model
            alone = turn(client, model, None, "And Oslo?", follow(first[model], "Where is Paris?"))
            assert reply.choices[0].message.content == alone.choices[0].message.content  # exact, cached or not

        # No match across models: a prompt the first model holds is new to the second, but for
        # the template's opening that the second's own agents sent before.
        other = "You answer questions about cities of the southern hemisphere. " * 6
        turn(client, "tiny", "bob", "What is Lima?", system=other)
        reused = {
            m: turn(client, m, agent, "What is Lima?", system=other).usage.prompt_tokens_details.cached_tokens
            for m, agent in (("tiny", "dave"), ("small", "carol"))
        }
        assert reused["tiny"] > 128 and reused["small"] < 16, reused

        agents = httpx.get(s.base_url + "/v1/agents").json()
        assert sorted((a["id"], a["model"]) for a in agents["data"] if a["id"] == "alice") == [
            ("alice", "small"),
            ("alice", "tiny"),
        ]
        # Each model's named agents, and the unnamed conversation its request with no agent began.
        assert [(m["id"], m["loaded"], m["agents"]) for m in agents["models"]] == [
            ("tiny", True, 4),
            ("small", True, 3),
        ]
        assert sorted(a["model"] for a in agents["data"] if a["kind"] == "unnamed") == ["small", "tiny"]
        # The cache commands see each model's folder, and end an agent in its own model only.
        listed = cache_json(s.cache_dir, "ls")["agents"]
        assert sorted((a["id"], a["model"]) for a in listed if a["id"] == "alice") == [
            ("alice", "qwen3"),
            ("alice", "tiny"),
        ]
        cache_json(s.cache_dir, "rm", "alice", "--model", "qwen3", "--yes")
        held = [(a["id"], a["model"]) for a in httpx.get(s.base_url + "/v1/agents").json()["data"]]
        assert ("alice", "tiny") in held and ("alice", "small") not in held
        assert metric(s, "agent_memory_model_loaded", model="small") == 1
        assert metric(s, "agent_memory_generated_tokens_total", model="tiny") > 0
        assert metric(s, "process_resident_memory_bytes") > 0

        # An unknown name is a 404 in each API's shape, naming what is served.
        r = httpx.post(
            s.base_url + "/v1/chat/completions",
            json={"model": "gpt-4o", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 4},
        )
        assert r.status_code == 404 and r.json()["error"]["code"] == "model_not_found"
        assert "tiny, small, qwen3" in r.json()["error"]["message"]
        messages = anthropic.Anthropic(base_url=s.base_url, api_key="unused", max_retries=0).messages
        with pytest.raises(anthropic.NotFoundError) as e:
            messages.create(model="claude-haiku-4-5", max_tokens=4, messages=[{"role": "user", "content": "hi"}])
        assert e.value.body["error"]["type"] == "not_found_error"
        reply = messages.create(model="small", max_tokens=4, messages=[{"role": "user", "content": "hi"}])
        assert reply.model == "small"


def test_an_idle_model_unloads_for_another_and_its_agents_return_warm(tiny_model, small, tmp_path):
    # 240 MiB of hot budget leaves room for one model's weights at a time under 256 MiB.
    limit = ("--memory-limit-mb", "256", "--hot-budget-mb", "240")
    with InProcessServer(tiny_model, tmp_path / "cache", "--model", f"small={small}", *limit) as s:
        client = s.client()
        first = turn(client, "tiny", "alice", "Where is Paris?")
        # A stream to a model not loaded yet: it waits for the load, then streams as any other.
        stream = client.chat.completions.create(
            model="small",
            messages=[{"role": "user", "content": "Where is Oslo?"}],
            max_tokens=8,
            temperature=0,
            stream=True,
            extra_body={"prompt_cache_key": "bob"},
        )
        chunks = list(stream)
        assert chunks[-1].choices[0].finish_reason == "length" and "".join(
            c.choices[0].delta.content or "" for c in chunks
        )
        assert loaded(s) == {"tiny": False, "small": True} and "unloaded tiny to make room for small" in s.log()
        # Unloaded, its memory is still listed (nothing hot) and its agents can still be ended.
        agents = {(a["id"], a["model"]): a for a in httpx.get(s.base_url + "/v1/agents").json()["data"]}
        assert agents["alice", "tiny"]["bytes"]["hot"] == 0 and agents["alice", "tiny"]["bytes"]["disk"] > 0
        turn(client, "tiny", "dave", "Where is Lima?", system="Be brief.")  # tiny again, so small unloads
        assert loaded(s) == {"tiny": True, "small": False}
        assert httpx.delete(s.base_url + "/v1/agents/bob").json()["deleted"] is True  # bob is small's

        second = turn(client, "tiny", "alice", "And Oslo?", follow(first, "Where is Paris?"))
        details = second.usage.prompt_tokens_details.model_dump()
        assert details["warm_tokens"] >= first.usage.prompt_tokens and details["hot_tokens"] == 0
        alone = turn(client, "tiny", None, "And Oslo?", follow(first, "Where is Paris?"))
        assert second.choices[0].message.content == alone.choices[0].message.content
        assert metric(s, "agent_memory_model_unloads_total", model="small") == 1
        assert metric(s, "agent_memory_model_loads_total", model="tiny") == 2  # at start, and back for dave


def test_a_pinned_model_keeps_its_place(tiny_model, small, tmp_path):
    limit = ("--memory-limit-mb", "256", "--hot-budget-mb", "240")
    args = ("--model", f"small={small}", "--keep-loaded", "small", *limit)
    with InProcessServer(tiny_model, tmp_path / "cache", *args) as s:
        assert loaded(s) == {"tiny": False, "small": True}  # both load at start; the pinned one stays
        r = httpx.post(
            s.base_url + "/v1/chat/completions",
            json={"model": "tiny", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 4},
            timeout=60,
        )
        assert r.status_code == 503 and r.json()["error"]["code"] == "model_not_loaded"
        assert "small (4 MiB, pinned)" in r.json()["error"]["message"]
        assert turn(s.client(), "small", "alice", "Where is Paris?").usage.completion_tokens > 0


def test_with_unload_idle_s_an_idle_model_unloads_and_its_agent_returns_warm(tiny_model, small, tmp_path):
    with InProcessServer(tiny_model, tmp_path / "cache", "--model", f"small={small}", "--unload-idle-s", "1") as s:
        client = s.client()
        first = turn(client, "small", "alice", "Where is Paris?")
        deadline = time.monotonic() + 30
        while loaded(s) != {"tiny": False, "small": False} and time.monotonic() < deadline:
            time.sleep(0.2)
        assert loaded(s) == {"tiny": False, "small": False} and "unloaded small after" in s.log()
        second = turn(client, "small", "alice", "And Oslo?", follow(first, "Where is Paris?"))
        details = second.usage.prompt_tokens_details.model_dump()
        assert details["warm_tokens"] >= first.usage.prompt_tokens and details["hot_tokens"] == 0


@pytest.mark.parametrize(
    "flags, said",
    [
        (("--model", "tiny2=tiny"), "the name 'tiny' is already tiny's"),
        (("--keep-loaded", "nope"), "--keep-loaded nope: not a served model's name"),
    ],
)
def test_names_are_checked_at_start(tiny_model, tmp_path, flags, said):
    flags = [f.replace("=tiny", f"={tiny_model}") for f in flags]
    assert said in refused_start(tiny_model, tmp_path / "cache", *flags)


def test_a_refused_start_exits_1_with_its_reason_on_one_line(tiny_model, tmp_path):
    """The process itself (the other refusals are checked in process: tests/support/inprocess.py)."""
    s = Server(tiny_model, tmp_path / "cache", "--model", f"tiny2={tiny_model}")
    with pytest.raises(RuntimeError, match="server exited with 1"):
        s.start()
    said = [line for line in s.log().splitlines() if line.startswith("error: ")]
    assert len(said) == 1 and said[0].endswith("the name 'tiny' is already tiny's") and "Traceback" not in s.log()


def cut_short(weights: Path) -> None:
    """An interrupted copy: the file ends halfway through its tensors."""
    os.truncate(weights, weights.stat().st_size // 2)


def reshape(weights: Path) -> None:
    """Another model's file in its place: whole, but a tensor's shape is not the config's."""
    with open(weights, "r+b") as f:
        found = re.search(rb'"shape":\[(\d+),(\d+)\]', f.read(4096))
        f.seek(found.start())
        f.write(b'"shape":[%s,%s]' % (found[2], found[1]))


def test_a_model_that_cannot_load_fails_at_once_without_a_retry_and_says_why(tiny_model, small, tmp_path):
    """Weights that break after the start (read then; loaded on a first request): a 500 that the
    SDKs do not retry, before a stream starts, and /health degraded with why; the others serve."""
    cut, reshaped = (shutil.copytree(small, tmp_path / name) for name in ("cut", "reshaped"))
    with InProcessServer(tiny_model, tmp_path / "cache", "--model", f"b={cut}", "--model", f"c={reshaped}") as s:
        cut_short(cut / "model.safetensors")
        reshape(reshaped / "model.safetensors")
        hi = [{"role": "user", "content": "hi"}]
        openai_sdk = openai.OpenAI(base_url=s.base_url + "/v1", api_key="unused")  # max_retries: 2, the default
        anthropic_sdk = anthropic.Anthropic(base_url=s.base_url, api_key="unused")

        def refused(model: str) -> None:
            with pytest.raises(openai.InternalServerError) as e:
                openai_sdk.chat.completions.create(model=model, messages=hi, max_tokens=4)
            assert e.value.code == "model_unavailable" and f"the model {model} cannot be loaded" in e.value.message
            headers = e.value.response.headers
            assert headers["x-should-retry"] == "false" and "retry-after" not in headers
            with pytest.raises(anthropic.InternalServerError) as e:  # a stream refused before it starts
                anthropic_sdk.messages.create(model=model, max_tokens=4, messages=hi, stream=True)
            assert e.value.body["error"]["type"] == "api_error" and e.value.status_code == 500
            body = {"model": model, "messages": hi, "stream": True}
            with s.http() as http, http.stream("POST", "/v1/chat/completions", json=body) as r:
                assert r.status_code == 500 and r.headers["content-type"] == "application/json"

        # b's file is found cut short before its load: said in plain words, not the loader's offsets.
        health = httpx.get(s.base_url + "/health")
        assert health.status_code == 200 and health.json()["status"] == "degraded", health.json()
        said = health.json()["message"]
        assert "the model b cannot be loaded: its weights file model.safetensors is incomplete" in said
        assert "offsets" not in said and "load_safetensors" not in said
        assert [m["id"] for m in health.json()["models"] if "unavailable" in m] == ["b"]
        refused("b")

        # c's damage shows only as its load fails: that first request fails once, then as b's do.
        with pytest.raises(openai.InternalServerError) as e:
            openai_sdk.chat.completions.create(model="c", messages=hi, max_tokens=4)
        assert e.value.code == "model_unavailable" and "shape" in e.value.message
        refused("c")
        models = httpx.get(s.base_url + "/health").json()["models"]
        assert [m["id"] for m in models if "unavailable" in m] == ["b", "c"]

        assert openai_sdk.chat.completions.create(model="tiny", messages=hi, max_tokens=4).choices[0].message.content
        # One request each reached the server: none was retried.
        log = s.log()
        assert log.count("path=/v1/chat/completions status=500") == 5, log
        assert log.count("path=/v1/messages status=500") == 2, log

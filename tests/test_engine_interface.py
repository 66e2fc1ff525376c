"""The HTTP API served from a fake engine that honours EngineClient and nothing more: the proof
that the API needs nothing of an engine but the interface (engine/protocol.py). The fake streams
scripted text from a thread, as the real engine's thread does; the app runs in-process."""

from __future__ import annotations

import json
import logging
import threading
from concurrent.futures import Future

import pytest
from prometheus_client import CollectorRegistry, Counter
from starlette.testclient import TestClient

from agent_memory.agent_key import AgentKey
from agent_memory.api.app import create_app
from agent_memory.api.responses.store import ResponseStore
from agent_memory.api.sealing import Sealer
from agent_memory.engine.protocol import AgentInfo, EngineClient, Health, ModelFacts, PinResult
from agent_memory.engine.requests import Finished, GenerationRequest, Sink, TextDelta, Usage

KV = {"hot": "q4g64", "working": "kv16", "disk": "q4g64"}
WARM = {"status": "on", "location": "folder"}
TOTALS = {"hot_bytes": 4096, "disk_bytes": 8192, "hot_blocks": 2}
ADD = {"type": "object", "properties": {"a": {"type": "integer"}}, "required": ["a"]}
CUT_CALL = ["I will add. ", '<tool_call>\n{"name": "add", "arguments": ', '{"a": 1']  # max_tokens ends it here


class FakeEngine(EngineClient):
    """An engine that writes `script` (its pieces as TextDelta, then Finished with `reason`) to
    every request, and remembers what it was asked."""

    def __init__(self, facts: ModelFacts, script: list[str], reason: str = "stop") -> None:
        self.facts, self.script, self.reason = facts, script, reason
        self.loaded = threading.Event()
        self.load_error: str | None = None
        self.requests: list[GenerationRequest] = []
        self.cancelled: list[int] = []
        self.announced: list[str] = []
        self.stopped = False
        self.known = {AgentKey("alice"): AgentInfo("alice", 70, {"hot": 2}, 4096, 1024, 0, 1700000000.0)}
        self.registry = CollectorRegistry()
        Counter("fake_requests", "requests submitted", registry=self.registry)

    def start(self) -> None:
        self.loaded.set()

    def wait_loaded(self) -> str | None:
        self.loaded.wait()
        return self.load_error

    def announce(self, url: str) -> None:
        self.announced.append(url)

    def stop(self) -> None:
        self.stopped = True

    @property
    def model(self) -> ModelFacts | None:
        return self.facts if self.loaded.is_set() and not self.load_error else None

    @property
    def max_batch(self) -> int:
        return 4

    def submit(self, request: GenerationRequest, sink: Sink) -> int:
        self.requests.append(request)

        def write() -> None:
            for piece in self.script:
                sink(TextDelta(piece))
            sink(Finished(self.reason, Usage(len(request.prompt), len(self.script), hot_tokens=3, warm_tokens=2)))

        threading.Thread(target=write).start()
        return len(self.requests)

    def cancel(self, request_id: int) -> None:
        self.cancelled.append(request_id)

    def agents(self, tenant: str | None) -> list[AgentInfo]:
        return [info for key, info in self.known.items() if tenant is None or key.tenant == tenant]

    def agent(self, key: AgentKey) -> AgentInfo | None:
        return self.known.get(key)

    def totals(self, tenant: str | None = None) -> dict[str, int]:
        return dict(TOTALS)

    def end_agent(self, key: AgentKey) -> Future:
        ended: Future = Future()
        ended.set_result(self.known.pop(key, None) is not None)
        return ended

    def heads(self, tenant: str | None) -> list[AgentInfo]:
        return []

    def pin(self, key: AgentKey, on: bool) -> PinResult:
        return PinResult(key in self.known, on and key in self.known)

    def health(self) -> Health:
        if not self.loaded.is_set():
            return Health("loading")
        if self.load_error:
            return Health("error", self.load_error)
        return Health("ok", kv=KV, warm_tier=WARM)

    def summary(self) -> str:
        return "model fake (scripted)"

    @property
    def metrics(self) -> CollectorRegistry:
        return self.registry


@pytest.fixture(scope="module")
def facts(tiny_model) -> ModelFacts:
    from mlx_lm.tokenizer_utils import load as load_tokenizer

    from agent_memory.chat.formats.reply import reply_format

    tokenizer = load_tokenizer(tiny_model)
    return ModelFacts(
        "fake",
        ("fake", "fake-alias"),
        tokenizer,
        2048,
        len(tokenizer),
        max_token_chars=16,
        reply_format=reply_format(tokenizer),
    )


def serve(engine: FakeEngine, on_load_failure=lambda: None) -> TestClient:
    app = create_app(
        {"fake": engine},
        host="127.0.0.1",
        port=8000,
        api_keys={},
        max_waiting=8,
        responses=ResponseStore(None, 1 << 20, engine.end_agent),
        sealer=Sealer(bytes(32)),
        on_load_failure=on_load_failure,
    )
    return TestClient(app, base_url="http://127.0.0.1:8000")


@pytest.fixture
def engine(facts) -> FakeEngine:
    return FakeEngine(facts, ["Hello", " world"])


def sse_data(text: str) -> list:
    """The data of each SSE event ([DONE] as the string)."""
    out = []
    for line in text.splitlines():
        if line.startswith("data: "):
            data = line[len("data: ") :]
            out.append(data if data == "[DONE]" else json.loads(data))
    return out


def chat_body(**kw) -> dict:
    return {"model": "fake-alias", "messages": [{"role": "user", "content": "hi"}], **kw}


def test_lifetime_models_health_and_metrics(engine, caplog):
    caplog.set_level(logging.INFO, "agent_memory")
    with serve(engine) as client:
        health = {"status": "ok", "kv": KV, "warm_tier": WARM, "models": [{"id": "fake", "loaded": True}]}
        assert client.get("/health").json() == health
        models = client.get("/v1/models").json()["data"]
        assert [(m["id"], m["root"]) for m in models] == [("fake", "fake"), ("fake-alias", "fake")]
        assert client.get("/v1/models/fake-alias").json()["id"] == "fake-alias"
        assert client.get("/v1/models/other").json()["error"]["code"] == "model_not_found"
        assert "fake_requests_total 0.0" in client.get("/metrics").text
    assert engine.announced == ["http://127.0.0.1:8000"] and engine.stopped
    assert "ready at http://127.0.0.1:8000/v1 — model fake (scripted); no API key" in caplog.text


def test_loading_and_a_failed_load(engine):
    client = serve(engine)  # no lifespan: never started
    assert (client.get("/health").status_code, client.get("/health").json()) == (503, {"status": "loading"})
    r = client.post("/v1/chat/completions", json=chat_body())
    assert r.status_code == 503 and r.json()["error"]["code"] == "model_loading"
    r = client.post("/v1/messages", json={"model": "m", "max_tokens": 4, "messages": chat_body()["messages"]})
    assert r.status_code == 529 and r.json()["error"]["type"] == "overloaded_error"
    failures = []
    engine.load_error = "no weights"
    with serve(engine, on_load_failure=lambda: failures.append(True)) as failed:
        assert failed.get("/health").json() == {"status": "error", "message": "no weights"}
    # The address is given before the load ends (server.json is on disk once /health says ok);
    # a load that fails opened no warm folder, so nothing is written for it.
    assert failures == [True] and engine.announced == ["http://127.0.0.1:8000"]


def test_chat_completion_json_and_stream(engine):
    with serve(engine) as client:
        r = client.post("/v1/chat/completions", json=chat_body(user="bob")).json()
        assert r["model"] == "fake-alias" and r["object"] == "chat.completion"
        assert r["choices"][0]["message"] == {"role": "assistant", "content": "Hello world"}
        assert r["choices"][0]["finish_reason"] == "stop"
        assert r["usage"]["prompt_tokens_details"] == {"cached_tokens": 5, "hot_tokens": 3, "warm_tokens": 2}
        assert engine.requests[-1].agent == AgentKey("bob")
        body = chat_body(model="unknown", stream=True, stream_options={"include_usage": True})
        frames = sse_data(client.post("/v1/chat/completions", json=body).text)
        assert frames[-1] == "[DONE]" and {f["model"] for f in frames[:-1]} == {"fake"}  # unknown: the first model
        deltas = [f["choices"][0]["delta"] for f in frames[:-2]]
        assert deltas == [{"role": "assistant", "content": ""}, {"content": "Hello"}, {"content": " world"}, {}]
        assert frames[-3]["choices"][0]["finish_reason"] == "stop" and frames[-2]["usage"]["completion_tokens"] == 2
        text = client.post("/v1/completions", json={"model": "fake", "prompt": "Once"}).json()
        assert text["choices"][0]["text"] == "Hello world" and text["object"] == "text_completion"


def test_messages_json_and_stream(engine):
    body = {"model": "claude-x", "max_tokens": 16, "messages": [{"role": "user", "content": "hi"}]}
    with serve(engine) as client:
        r = client.post("/v1/messages", json=body).json()
        assert r["model"] == "claude-x" and r["content"] == [{"type": "text", "text": "Hello world"}]
        assert r["stop_reason"] == "end_turn" and r["usage"]["cache_read_input_tokens"] == 5
        stream = client.post("/v1/messages", json={**body, "stream": True}).text
        names = [line[len("event: ") :] for line in stream.splitlines() if line.startswith("event: ")]
        assert names[0] == "message_start" and names[-2:] == ["message_delta", "message_stop"]
        counted = client.post("/v1/messages/count_tokens", json=body).json()["input_tokens"]
        assert counted == len(engine.requests[-1].prompt)


def test_responses_json_stream_and_stored(engine):
    with serve(engine) as client:
        r = client.post("/v1/responses", json={"model": "fake", "input": "hi"}).json()
        assert r["status"] == "completed" and r["model"] == "fake"
        assert r["output"][0]["content"][0]["text"] == "Hello world"
        assert client.get(f"/v1/responses/{r['id']}").json() == r
        events = sse_data(client.post("/v1/responses", json={"input": "hi", "stream": True}).text)
        assert events[0]["type"] == "response.created" and events[-1]["type"] == "response.completed"
        assert client.delete(f"/v1/responses/{r['id']}").json()["deleted"] is True
        assert client.get(f"/v1/responses/{r['id']}").status_code == 404


def test_agents_list_show_delete(engine):
    with serve(engine) as client:
        listed = client.get("/v1/agents").json()
        assert [a["id"] for a in listed["data"]] == ["alice"] and listed["hot_bytes"] == 4096
        shown = client.get("/v1/agents/alice").json()
        assert shown["bytes"] == {"hot": 4096, "hot_exact": 1024, "hot_quantized": 3072, "hot_snapshots": 0, "disk": 0}
        assert client.delete("/v1/agents/alice").json() == {"id": "alice", "object": "agent.deleted", "deleted": True}
        assert client.delete("/v1/agents/alice").json()["error"]["code"] == "agent_not_found"


# -- a call cut off in its arguments ends alike in every wire format, streamed or not --------


@pytest.fixture
def cut(facts) -> FakeEngine:
    return FakeEngine(facts, CUT_CALL, reason="length")


def test_openai_chat_cut_off_call(cut):
    body = chat_body(tools=[{"type": "function", "function": {"name": "add", "parameters": ADD}}])
    with serve(cut) as client:
        r = client.post("/v1/chat/completions", json=body).json()["choices"][0]
        assert r["finish_reason"] == "length" and r["message"]["content"] == "I will add. "
        [call] = r["message"]["tool_calls"]
        assert call["function"] == {"name": "add", "arguments": "{}"}
        frames = sse_data(client.post("/v1/chat/completions", json={**body, "stream": True}).text)
    deltas = [f["choices"][0]["delta"] for f in frames[1:-1]]
    assert "".join(d.get("content") or "" for d in deltas) == "I will add. "  # no markup after the call's start
    assert [d["tool_calls"][0]["function"].get("name") for d in deltas if "tool_calls" in d][0] == "add"
    assert frames[-2]["choices"][0]["finish_reason"] == "length"


def test_anthropic_cut_off_call(cut):
    tools = [{"name": "add", "input_schema": ADD}]
    body = {"model": "m", "max_tokens": 16, "tools": tools, "messages": [{"role": "user", "content": "add"}]}
    with serve(cut) as client:
        r = client.post("/v1/messages", json=body).json()
        assert r["stop_reason"] == "max_tokens"
        assert r["content"] == [
            {"type": "text", "text": "I will add. "},
            {"type": "tool_use", "id": r["content"][1]["id"], "name": "add", "input": {}},
        ]
        events = sse_data(client.post("/v1/messages", json={**body, "stream": True}).text)
    texts = [e["delta"]["text"] for e in events if e["type"] == "content_block_delta" and "text" in e["delta"]]
    assert "".join(texts) == "I will add. "
    assert [e["content_block"]["type"] for e in events if e["type"] == "content_block_start"] == ["text", "tool_use"]


def test_responses_cut_off_call(cut):
    body = {"input": "add", "tools": [{"type": "function", "name": "add", "parameters": ADD}]}
    with serve(cut) as client:
        r = client.post("/v1/responses", json=body).json()
        assert r["status"] == "incomplete"
        assert [i["type"] for i in r["output"]] == ["message", "function_call"]
        assert r["output"][0]["content"][0]["text"] == "I will add. " and r["output"][1]["arguments"] == "{}"
        events = sse_data(client.post("/v1/responses", json={**body, "stream": True}).text)
    texts = [e["delta"] for e in events if e["type"] == "response.output_text.delta"]
    assert "".join(texts) == "I will add. "
    [done] = [e for e in events if e["type"] == "response.function_call_arguments.done"]
    assert done["arguments"] == "{}" and done["name"] == "add"


def test_two_engines_one_api(facts):
    """The API over two models: each picks its requests by name, an unknown name is a 404
    naming both, and the views list each model's agents and metrics apart."""
    from dataclasses import replace

    first = FakeEngine(facts, ["one"])
    second = FakeEngine(replace(facts, name="other", ids=("other",)), ["two"])
    app = create_app(
        {"fake": first, "other": second},
        host="127.0.0.1",
        port=8000,
        api_keys={},
        max_waiting=8,
        responses=ResponseStore(None, 1 << 20, first.end_agent),
        sealer=Sealer(bytes(32)),
        on_load_failure=lambda: None,
    )
    with TestClient(app, base_url="http://127.0.0.1:8000") as client:
        for name, text in (("other", "two"), ("fake-alias", "one"), (None, "one")):
            body = chat_body(model=name) if name else {k: v for k, v in chat_body().items() if k != "model"}
            assert client.post("/v1/chat/completions", json=body).json()["choices"][0]["message"]["content"] == text
        r = client.post("/v1/chat/completions", json=chat_body(model="gpt-4o"))
        assert r.status_code == 404 and r.json()["error"]["code"] == "model_not_found"
        assert "fake, fake-alias, other" in r.json()["error"]["message"]
        listing = client.get("/v1/agents").json()
        assert sorted((a["id"], a["model"]) for a in listing["data"]) == [("alice", "fake"), ("alice", "other")]
        assert [(m["id"], m["hot_bytes"]) for m in listing["models"]] == [("fake", 4096), ("other", 4096)]
        assert listing["hot_bytes"] == 8192
        assert client.delete("/v1/agents/alice?model=other").status_code == 200
        assert AgentKey("alice") in first.known and AgentKey("alice") not in second.known
        assert client.get("/v1/agents/alice?model=nope").status_code == 404
        metrics = client.get("/metrics").text
        assert (
            'fake_requests_total{model="fake"} 0.0' in metrics and 'fake_requests_total{model="other"} 0.0' in metrics
        )
        assert metrics.count("# TYPE fake_requests_total counter") == 1
        assert metrics.count("# TYPE process_cpu_seconds_total counter") == 1  # the process once, unlabelled

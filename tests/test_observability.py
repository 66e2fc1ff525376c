"""What an operator reads: one log line per request with what it did, and metrics of the memory
that move as a scripted workload says they must."""

from __future__ import annotations

import json
import re

import httpx
import pytest

from tests.support.inprocess import InProcessServer
from tests.support.metrics import metric
from tests.support.server import REPO, Server

pytestmark = pytest.mark.process
SYSTEM = "You log every ship that enters the harbour, with its cargo and its berth. " * 12



def chat(server, agent: str, content: str, **headers):
    return httpx.post(
        server.base_url + "/v1/chat/completions",
        json={"messages": [{"role": "system", "content": SYSTEM}, {"role": "user", "content": content}], "max_tokens": 8},
        headers={"X-Agent-Id": agent, **headers},
        timeout=60,
    )


def test_one_line_per_request_says_what_it_did(tiny_model, tmp_path):
    """The text format, served in process (its log lines go to a file, as a process's do)."""
    with InProcessServer(tiny_model, tmp_path) as s:
        for _ in range(3):
            assert httpx.get(s.base_url + "/health").status_code == 200
        chat(s, "secret-agent-name", "Which ship came in?", **{"X-Request-Id": "req-one"})
        chat(s, "secret-agent-name", "Which ship came in?", **{"X-Request-Id": "req-two"})
        assert httpx.get(s.base_url + "/v1/agents").status_code == 200  # a dashboard's poll: DEBUG
        assert httpx.delete(s.base_url + "/v1/agents/secret-agent-name").status_code == 200
        bad = httpx.post(s.base_url + "/v1/chat/completions", json={"messages": [{"role": "wizard", "content": "x"}]})
        assert bad.status_code == 400
    log = s.log()  # once it has stopped: a request's line is written after its response is sent
    lines = [line for line in log.splitlines() if "agent_memory.requests" in line]
    (first,) = [line for line in lines if "request_id=req-one" in line]
    (second,) = [line for line in lines if "request_id=req-two" in line]
    for field in ("status=200", "prompt_tokens=", "cached_tokens=", "hot_tokens=", "ttft_ms=", "tok_s=", "finish="):
        assert field in first, field
    assert "cached_tokens=0" in first and "cached_tokens=0" not in second
    assert "secret-agent-name" not in log  # hashed unless --log-agent-ids
    assert any("status=400" in line and "error=messages.0.role" in line for line in lines)
    assert not any("path=/health" in line or "path=/v1/agents " in line for line in lines)  # polls are DEBUG
    assert any(line.startswith("method=DELETE") or "method=DELETE path=/v1/agents/" in line for line in lines)
    assert "ready at http://127.0.0.1:" in log and "BLAS" in log and "hot budget" in log


def test_json_logs_and_agent_ids_on_request(tiny_model, tmp_path):
    """The process's own logging: JSON lines, agent ids named, and nothing else on its output."""
    with Server(tiny_model, tmp_path, "--log-format", "json", "--log-agent-ids") as s:
        chat(s, "named-agent", "Hello.")
        # A prompt longer than the model's context, counted: tokenizers' own warning stays out.
        long = [{"role": "user", "content": "lighthouse keeper " * 3000}]
        counted = httpx.post(s.base_url + "/v1/messages/count_tokens", json={"model": "tiny", "messages": long})
        assert counted.json()["input_tokens"] > 4096
    log = s.log()  # once it has stopped, as above
    assert "Token indices sequence length" not in log
    records = [json.loads(line) for line in log.splitlines() if line.startswith("{")]
    request = next(r for r in records if r.get("name") == "agent_memory.requests" and r["request"]["status"] == 200)
    assert request["request"]["agent"] == "named-agent" and request["levelname"] == "INFO"


def test_memory_metrics_move_with_the_workload(tiny_model, tmp_path):
    args = ("--kv-bits", "4", "--hot-budget-mb", "1")
    with InProcessServer(tiny_model, tmp_path, *args) as s:
        assert metric(s, "agent_memory_cache_budget_bytes", tier="hot") == 1 << 20
        assert metric(s, "process_resident_memory_bytes") > 0
        for i in range(3):  # ~2 MB of exact KV each, against 1 MiB: blocks must cool
            chat(s, f"agent-{i}", f"Ship number {i}?")
        assert metric(s, "agent_memory_block_moves_total", from_tier="hot_exact", to_tier="hot_quantized") > 0
        assert metric(s, "agent_memory_cache_bytes", tier="hot_quantized") > 0
        assert metric(s, "agent_memory_blocks", tier="hot") > 0
        assert metric(s, "agent_memory_queue_time_seconds_count") == 3
        assert metric(s, "agent_memory_inter_token_latency_seconds_count") > 0
        assert metric(s, "agent_memory_prompt_length_tokens_count") == 3
        # Every series the Grafana dashboard in docs/ draws is one the server exports.
        exported = set(re.findall(r"^([a-z_]+?)(?:_bucket|_count|_sum|_total)?[{ ]", httpx.get(s.base_url + "/metrics").text, re.M))
        drawn = set(re.findall(r"\b((?:agent_memory|process)_[a-z_]+?)(?:_bucket|_count|_sum|_total)?\b", (REPO / "docs/grafana.json").read_text()))
        assert drawn and drawn <= exported, drawn - exported
    with InProcessServer(tiny_model, tmp_path, *args) as s:  # a restart: the agent comes back from disk
        r = chat(s, "agent-0", "Ship number 0?")
        assert r.json()["usage"]["prompt_tokens_details"]["warm_tokens"] > 0
        assert metric(s, "agent_memory_disk_load_seconds_count", outcome="ok") > 0
        assert metric(s, "agent_memory_cached_tokens_total", tier="warm") > 0

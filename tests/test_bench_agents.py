"""Smoke test of scripts/bench_agents.py: one small run against our server on the tiny model."""

from __future__ import annotations

import json
import subprocess
import sys

from tests.conftest import REPO


def test_bench_agents_smoke(tiny_model, tmp_path):
    out = tmp_path / "bench.json"
    cmd = [
        sys.executable, str(REPO / "scripts/bench_agents.py"),
        "--serve", "ours", "--model", str(tiny_model), "--model-name", "tiny",
        "--agents", "2", "--turns", "2", "--max-tokens", "6", "--system-tokens", "200",
        "--stagger", "0.1", "--work-dir", str(tmp_path / "work"), "--json", str(out),
    ]
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=170, cwd=REPO)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "| ours |" in proc.stdout

    data = json.loads(out.read_text())
    assert set(data) >= {"runs", "summary", "table", "settings"}
    run = data["runs"][0]
    assert run["server"] == "ours" and run["errors"] == 0
    for key in ("wall_s", "ttft", "output_tok_s", "hit_ratio", "peak_rss_bytes", "hot_bytes", "ideal_hot_bytes",
                "ratios", "records", "cache_after_turns", "cache_after_restart"):
        assert key in run, key
    for phase in ("first", "later", "restart"):
        assert run["ttft"][phase]["n"] == 2 and run["ttft"][phase]["median"] > 0, phase
    # Every turn after an agent's first reuses its own conversation; after the restart, from disk.
    assert run["hit_ratio"]["later"] > 0
    assert run["hit_ratio"]["restart"] > 0
    assert run["hot_bytes"] > 0 and run["ideal_hot_bytes"] > 0
    assert run["peak_rss_bytes"] > 0
    assert len(run["records"]) == 2 * 2 + 2
    assert data["summary"]["ours"]["runs"] == 1

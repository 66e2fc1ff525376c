"""Smoke test of scripts/bench_agents.py: one small run against our server on the tiny model
(traced, with both restarts), and the pieces that read the peers' output. vllm-mlx and
mlx_lm.server are never started or installed here."""

from __future__ import annotations

import importlib.util
import json
import subprocess
import sys

import pytest

from tests.support.server import REPO

pytestmark = pytest.mark.process


def load_bench():
    spec = importlib.util.spec_from_file_location("bench_agents", REPO / "scripts/bench_agents.py")
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # its dataclasses look their module up
    spec.loader.exec_module(module)
    return module


def test_bench_agents_smoke(tiny_model, tmp_path):
    out = tmp_path / "bench.json"
    cmd = [
        sys.executable, str(REPO / "scripts/bench_agents.py"),
        "--serve", "ours", "--model", str(tiny_model), "--model-name", "tiny",
        "--agents", "2", "--turns", "2", "--max-tokens", "6", "--system-tokens", "200",
        "--stagger", "0.1", "--think", "0.2", "--crash-delay", "1", "--trace",
        "--work-dir", str(tmp_path / "work"), "--json", str(out),
    ]
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=170, cwd=REPO)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "| ours |" in proc.stdout
    assert "where the time goes" in proc.stdout

    data = json.loads(out.read_text())
    assert set(data) >= {"runs", "summary", "table", "settings", "levers"}
    run = data["runs"][0]
    assert run["server"] == "ours" and run["errors"] == 0
    for key in ("wall_s", "ttft", "output_tok_s", "hit_ratio", "peak_rss_bytes", "hot_bytes", "hot_exact_bytes",
                "hot_quantized_bytes", "ideal_hot_bytes", "ratios", "records", "cache_after_turns",
                "cache_after_crash", "cache_after_graceful", "crash_load_s", "graceful_load_s", "levers"):
        assert key in run, key
    for phase in ("first", "later", "crash", "graceful"):
        assert run["ttft"][phase]["n"] == 2 and run["ttft"][phase]["median"] > 0, phase
    # Every turn after an agent's first reuses its own conversation; after either restart, from disk.
    assert run["hit_ratio"]["later"] > 0
    assert run["hit_ratio"]["crash"] > 0 and run["hit_ratio"]["graceful"] > 0
    assert run["crash_delay_s"] >= 1
    assert run["hot_bytes"] > 0 and run["ideal_hot_bytes"] > 0
    assert run["hot_exact_bytes"] + run["hot_quantized_bytes"] == run["hot_bytes"]
    assert 0.5 < run["hot_over_ideal"] < 2
    assert run["peak_rss_bytes"] > 0
    assert len(run["records"]) == 2 * 2 + 2 + 2
    assert data["summary"]["ours"]["runs"] == 1
    # The trace: each phase's requests found, a TTFT split into parts, the warm tier's writes.
    levers = run["levers"]
    for phase in ("first", "later", "crash", "graceful"):
        assert levers["phases"][phase]["n"] == 2, phase
        assert levers["phases"][phase]["ttft"] > 0
    assert levers["phases"]["crash"]["arrival_to_warm_read"] > 0
    assert levers["disk"]["files"] > 0 and levers["disk"]["write_per_file_median"] > 0


def test_server_names_and_peer_logs(tiny_model, tmp_path):
    bench = load_bench()
    assert bench.server_list("ours,peer") == ["ours", "mlx-lm"]
    assert bench.server_list("all") == ["ours", "mlx-lm", "vllm-mlx"]
    args = bench.parse_args(["--compare", "--model", str(tiny_model), "--no-restart"])
    assert args.serve == ["ours", "mlx-lm", "vllm-mlx"] and bench.restart_plan(args) == []
    args = bench.parse_args(["--compare", "--peers", "vllm-mlx", "--model", str(tiny_model)])
    assert args.serve == ["ours", "vllm-mlx"] and bench.restart_plan(args) == ["crash", "graceful"]
    log = tmp_path / "vllm.log"
    log.write_text(
        "INFO:vllm_mlx.scheduler:[cache_fetch] request=aaaaaaaa-111 MISS prompt_tokens=1064 time=0.000s entries=0\n"
        "INFO:vllm_mlx.scheduler:[cache_fetch] request=bbbbbbbb-222 HIT prompt_tokens=1190 cached=1128 "
        "remaining=62 time=0.000s\n"
        "INFO:vllm_mlx.scheduler:[cache_fetch] request=cccccccc-333 MISS prompt_tokens=1300 time=0.000s entries=3\n"
        "INFO:vllm_mlx.scheduler:[ssd_promote] request=cccccccc-333 exact promote: 1216/1300 tokens from SSD, "
        "84 remaining\n"
    )
    assert bench.vllm_log_fetches(log) == [(1064, 0), (1190, 1128), (1300, 1216)]


def test_targets_read_the_numbers():
    bench = load_bench()
    keys = ("ttft_later_median", "workload_wall_crash_s", "workload_wall_graceful_s", "ttft_crash_median",
            "ttft_graceful_median", "peak_rss_bytes")
    ours = dict(zip(keys, (1.0, 60.0, 60.0, 1.0, 1.0, 1000)))
    mlx = dict(zip(keys, (2.0, 120.0, 120.0, 40.0, 40.0, 3000)))
    vllm = dict(zip(keys, (3.0, 90.0, 80.0, 40.0, 0.9, 2000)))
    _, rows = bench.targets({"ours": ours, "mlx-lm": mlx, "vllm-mlx": vllm})
    met = {(r["target"].split(" ")[0], r["against"]): r["met"] for r in rows}
    assert met[("later-turn", "mlx-lm")] is False and met[("later-turn", "vllm-mlx")] is True
    walls = [r for r in rows if r["target"].startswith("workload")]
    assert [r["against"] for r in walls] == ["vllm-mlx", "vllm-mlx"]  # the faster peer
    assert [round(r["value"], 2) for r in walls] == [0.67, 0.75]
    graceful = next(r for r in rows if "graceful restart, TTFT" in r["target"])
    assert graceful["met"] is False  # 1.0 s against vllm-mlx's 0.9 s
    rss = next(r for r in rows if r["target"].startswith("peak RSS"))
    assert rss["against"] == "vllm-mlx" and rss["met"] is True

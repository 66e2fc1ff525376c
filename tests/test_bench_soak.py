"""Smoke test of scripts/bench_soak.py: every part once, at the smallest settings. The time
limit is the default's: the work is small and ends when done (~25 s on two idle cores), so no
part is cut short on a busy machine."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

from tests.support.server import REPO

pytestmark = pytest.mark.process


def test_bench_soak_smoke(tiny_model, tmp_path):
    out = tmp_path / "soak.json"
    cmd = [
        sys.executable, str(REPO / "scripts/bench_soak.py"), "--model", str(tiny_model),
        "--minutes", "3", "--kills", "1", "--agents", "2", "--damage", "2", "--disk-episodes", "1", "--redis-stall-s", "5",
        "--clients", "4", "--max-tokens", "6", "--work-dir", str(tmp_path / "work"), "--json", str(out),
    ]
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=200, cwd=REPO)
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-6000:]
    assert "| part | figure | value | must be |" in proc.stdout

    parts = json.loads(out.read_text())["parts"]
    assert set(parts) >= {"kills", "damage", "full_disk", "load", "memory"}
    kills, damage, load = parts["kills"], parts["damage"], parts["load"]
    assert kills["corrupt files after a kill (cache verify)"] == 0
    assert kills["wrong answers after a restart"] == 0 and kills["request errors after a restart"] == 0
    assert damage["request errors"] == 0 and damage["answers unlike an uncached run"] == 0
    assert load["errors"] == 0 and load["answers unlike it (cross-agent mix-ups)"] == 0
    assert load["sequences left in the engine after"] == 0
    if "skipped" not in parts["full_disk"]:
        disk = parts["full_disk"]
        assert disk["request errors"] == 0 and disk["half-written files left"] == 0
        assert disk["writes that failed while full"] > 0
    if "skipped" not in parts["hung_redis"]:
        assert parts["hung_redis"]["request errors"] == 0
    assert parts["memory"]["rss_peak_bytes"] >= parts["memory"]["rss_before_bytes"] > 0

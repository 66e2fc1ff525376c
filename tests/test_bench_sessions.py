"""Smoke test of scripts/bench_sessions.py: every coding agent's session shape, its heads scaled
down to fit the tiny test model, named across a restart and unnamed, three turns each. Each next
request is built from the server's actual reply in its API's own items (tool_use blocks,
function_call items, tool_calls), so every shape's turns being accepted and reused checks that
building."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

from tests.support.server import REPO

pytestmark = pytest.mark.process

SHAPES = {"claude-code", "codex", "opencode", "qwen-code", "aider", "llm"}


def test_bench_sessions_smoke(tiny_model, tmp_path):
    out = tmp_path / "sessions.json"
    cmd = [
        sys.executable, str(REPO / "scripts/bench_sessions.py"), "--model", str(tiny_model),
        "--head-scale", "0.02", "--turns", "3", "--max-tokens", "48", "--runs", "named+restart,unnamed",
        "--work-dir", str(tmp_path / "work"), "--json", str(out), "--markdown", str(tmp_path / "sessions.md"),
    ]
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=400, cwd=REPO)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]

    data = json.loads(out.read_text())
    sessions = {(s["shape"], s["run"]): s for s in data["sessions"]}
    assert set(sessions) == {(shape, run) for shape in SHAPES for run in ("named+restart", "unnamed")}
    for (shape, run), s in sessions.items():
        assert [t["turn"] for t in s["turns"]] == [1, 2, 3], (shape, run, s["turns"])
        for t in s["turns"]:
            assert "error" not in t and t["prompt"] > 0 and t["completion"] > 0, (shape, run, t)
        for t in s["turns"][1:]:
            assert 0 < t["share_of_previous_turn"] <= 1, (shape, run, t)
    # Tool turns: the forced calls came back and their results were sent as each API has them.
    for shape in ("claude-code", "codex", "opencode", "qwen-code"):
        assert sessions[shape, "named+restart"]["turns"][0]["calls"] >= 1, shape
    # Qwen Code's second request each turn, as a row of its own.
    assert len(sessions["qwen-code", "named+restart"]["side_turns"]) == 3
    # A named session's previous turn is in the cache (all but a tool call's end at most), and
    # after the restart it comes from disk. aider's layout puts the files after the history.
    for shape in SHAPES - {"aider"}:
        turns = sessions[shape, "named+restart"]["turns"]
        assert turns[1]["share_of_previous_turn"] > 0.9 and turns[2]["share_of_previous_turn"] > 0.9, shape
    assert "| qwen-code (2nd request) | named+restart |" in data["table"]
    assert (tmp_path / "sessions.md").read_text().strip() == data["table"]

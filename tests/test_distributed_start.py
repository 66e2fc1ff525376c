"""`agent-memory serve` under `mlx.launch` (issue #38): two local ranks on the ring backend agree
the layout (another model on one rank stops every rank with one line); what cannot work split is
refused at start with the reason on every rank; a stuck collective ends the process (the
watchdog). The splits that start and serve are tests/test_distributed_serve.py's."""

from __future__ import annotations

import re
import subprocess
import sys

import pytest

from agent_memory.config import Settings
from agent_memory.engine.loading.budget import RankShares
from tests.support.distributed import Launched
from tests.support.server import REPO

pytestmark = pytest.mark.process


def test_another_model_on_one_rank_stops_every_rank_with_one_line(tiny_model, tmp_path):
    from agent_memory.models.tiny import build_tiny

    other = build_tiny(tmp_path / "other", config={"rope_theta": 20000.0})  # the same shapes, other files
    log = Launched((tiny_model, other), tmp_path / "cache").ended()
    assert re.search(r"rank 1 of 2 loaded another model or split than rank 0 \(tensor, model \w{12}\): every rank", log)
    assert "rank 0 of 2 loaded another model or split than rank 1" in log
    assert "Traceback" not in log


@pytest.mark.parametrize("case", ["neither", "several models"])
def test_what_cannot_be_split_is_refused_at_start_on_every_rank(case, tiny_model, tmp_path):
    """Launched: a model refusal (its family) and a flag refusal, each said by every rank before
    any exchange; the other reasons take the same two paths (checked below, in this process)."""
    from agent_memory.models.tiny import build_tiny

    if case == "neither":
        model, args = build_tiny(tmp_path / "gemma", arch="gemma3_text"), []
        why = "gemma3_text cannot be split over 2 processes: mlx-lm gives it neither tensor nor pipeline parallelism"
    else:
        model, args = tiny_model, ["--model", f"second={tiny_model}"]
        why = "--model is given 2 times: a server split over 2 processes"
    log = Launched(model, tmp_path / "cache", *args).ended()
    # Each rank says it, before any exchange, unless mlx.launch stopped it first: the launcher
    # ends the other processes once one has exited.
    said, stopped = log.count(why), log.count("exited with code -15")
    assert said >= 1 and said + stopped >= 2, log
    assert "Uvicorn running" not in log


@pytest.mark.parametrize(
    "case, why",
    [
        ("draft", "--speculation draft / --draft-model: a draft model is not served split over processes yet"),
        ("unload", "--unload-idle-s: a model split over processes stays loaded"),
        ("redis", "--warm-store: a model split over processes keeps its warm tier in each rank's own cache folder"),
        ("embedding", "is an embedding model: only a chat model is served split over processes"),
        ("vision", "gemma3 reads images: a vision model is not served split over processes yet"),
    ],
)
def test_each_reason_a_split_is_refused(case, why, tiny_model, tiny_embedding, tmp_path):
    """The flags (`flag_refusal`) and the models (`prepare`) a split server refuses, and why."""
    from types import SimpleNamespace

    from agent_memory.cli.distributed import flag_refusal, prepare
    from agent_memory.config import ConfigError, load_settings
    from agent_memory.models.tiny_vision import build_tiny_vision

    flags = {
        "draft": {"speculation": "draft", "draft_model": str(tiny_model)},
        "unload": {"unload_idle_s": 60},
        "redis": {"warm_store": "redis://127.0.0.1:1"},
    }
    if case in flags:
        settings = load_settings(model=[str(tiny_model)], **flags[case])
        assert why in flag_refusal(settings, 2)
        return
    model = tiny_embedding if case == "embedding" else build_tiny_vision(tmp_path / "gemma3", arch="gemma3")
    settings = load_settings(model=[str(model)])
    assert flag_refusal(settings, 2) is None
    with pytest.raises(ConfigError, match=re.escape(why)):
        prepare(settings, SimpleNamespace(size=2), model)


def test_a_shared_redis_warm_tier_is_refused_split_with_the_reason():
    from agent_memory.cli.distributed import flag_refusal

    why = flag_refusal(Settings(model=["tiny"], warm_store="redis://127.0.0.1:6379"), 2)
    assert why.startswith("--warm-store: a model split over processes keeps its warm tier in each rank's own cache")
    assert flag_refusal(Settings(model=["tiny"], warm_store="redis://127.0.0.1:6379", disk_budget_mb=0), 2) is None


def test_a_stuck_collective_ends_the_process(tmp_path):
    """The watchdog (engine/distributed/group.py) ends a process whose exchange waits past its
    deadline: a blocked MLX collective cannot be interrupted."""
    script = (
        "import logging, time\n"
        "logging.basicConfig(level='INFO')\n"
        "from agent_memory.engine.distributed.group import Watchdog\n"
        "with Watchdog(1).waiting('waiting for rank 0', 0.5):\n"
        "    time.sleep(30)\n"
    )
    done = subprocess.run([sys.executable, "-c", script], cwd=REPO, capture_output=True, text=True, timeout=60)
    assert done.returncode == 75
    assert re.search(r"rank 1: no answer from the other ranks for \d s \(waiting for rank 0\): stopping", done.stderr)


def test_budgets_agreed_are_the_smallest_any_rank_allows():
    """Rank 0's budgets in rank-0 bytes: a rank with twice the layers (bytes per token) halves
    the hot budget, and a rank with less memory left bounds the running requests'."""
    mib, kib = 1 << 20, 1 << 10
    shares = RankShares([[8192 * kib, 100 * kib, 1000], [4096 * kib, 200 * kib, 2000]])
    hot, working = shares.agreed(1024 * mib, 6000 * mib)
    assert hot == 512 * mib
    assert working == (4096 - 200 - 1024) * mib // 2
    assert RankShares().agreed(1024, None) == (1024, None)  # one process: as given

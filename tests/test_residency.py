"""engine/loading/residency.py's choices, with stand-in engines (no MLX): which model leaves to make
room, which never does, when a load waits and when it is refused, and each model's share."""

from __future__ import annotations

import threading
import time
from concurrent.futures import Future

import pytest

from agent_memory.engine.loading import residency
from agent_memory.engine.loading.residency import NoRoom, Residency

MIB = 1 << 20


class Engine:
    """A stand-in: idle since `idle` (None: busy), unloads when asked if still idle."""

    def __init__(self, name: str, idle: float | None = 0.0, pinned: bool = False, keeps_kv: bool = True) -> None:
        self.name, self.idle, self.pinned, self.keeps_kv = name, idle, pinned, keeps_kv
        self.budgets: list[tuple[int, int | None]] = []
        self.unloaded = False

    def idle_since(self) -> float | None:
        return self.idle

    def unload(self) -> Future:
        done: Future = Future()
        self.unloaded = self.idle is not None
        done.set_result(self.unloaded)
        return done

    def set_budgets(self, hot_bytes: int, working_bytes: int | None) -> None:
        self.budgets.append((hot_bytes, working_bytes))


def loaded(res: Residency, *engines: Engine, weights: int = 100 * MIB) -> None:
    for engine in engines:
        res.make_room(engine, weights)
        res.loaded_as(engine, weights)


def test_the_idle_longest_leaves_and_the_shares_follow():
    res = Residency(limit_bytes=1000 * MIB, hot_budget_bytes=600 * MIB)
    old, recent = Engine("old", idle=1.0), Engine("recent", idle=2.0)
    loaded(res, old, recent)  # 200 MiB of weights + 600 hot: 200 left for running requests
    assert recent.budgets[-1] == (300 * MIB, 100 * MIB)
    new = Engine("new", idle=3.0)
    loaded(res, new)  # 300 + 600 fits 1000: nothing leaves; three shares now
    assert not old.unloaded and new.budgets[-1] == (200 * MIB, 100 * MIB // 3)
    res.make_room(Engine("bigger"), 150 * MIB)  # 300 + 150 + 600 > 1000: the one idle longest goes
    assert old.unloaded and not recent.unloaded and not new.unloaded


def test_an_embedding_model_counts_its_weights_but_takes_no_hot_budget():
    res = Residency(limit_bytes=1000 * MIB, hot_budget_bytes=600 * MIB)
    chat, embedder = Engine("chat", idle=1.0), Engine("embedder", idle=2.0, keeps_kv=False)
    loaded(res, chat, embedder)  # 200 MiB of weights + 600 hot: 200 left for running requests, in two
    assert chat.budgets[-1] == (600 * MIB, 100 * MIB)
    res.make_room(Engine("bigger"), 250 * MIB)  # 200 + 250 + 600 > 1000: the chat model, idle longest, goes
    assert chat.unloaded and not embedder.unloaded


def test_a_pinned_or_busy_model_stays_and_a_load_that_cannot_wait_is_refused(monkeypatch):
    res = Residency(limit_bytes=1000 * MIB, hot_budget_bytes=600 * MIB)
    pinned = Engine("pinned", idle=1.0, pinned=True)
    loaded(res, pinned, weights=300 * MIB)
    with pytest.raises(NoRoom, match=r"needs 200 MiB .* beside pinned \(300 MiB, pinned\)"):
        res.make_room(Engine("new"), 200 * MIB)
    assert not pinned.unloaded

    busy = Engine("busy", idle=None)
    res.unloaded(pinned)
    loaded(res, busy, weights=300 * MIB)
    monkeypatch.setattr(residency, "BUSY_WAIT_S", 0.3)
    with pytest.raises(NoRoom, match=r"busy \(300 MiB, busy\)"):
        res.make_room(Engine("new"), 200 * MIB)


def test_a_load_waits_for_a_busy_model_to_go_idle():
    res = Residency(limit_bytes=1000 * MIB, hot_budget_bytes=600 * MIB)
    busy = Engine("busy", idle=None)
    loaded(res, busy, weights=300 * MIB)
    threading.Timer(0.5, lambda: setattr(busy, "idle", 5.0)).start()
    t0 = time.monotonic()
    res.make_room(Engine("new"), 200 * MIB)
    assert busy.unloaded and time.monotonic() - t0 >= 0.4


def test_one_model_alone_loads_even_over_the_limit():
    """As a server of one model always has: it loads, and its requests run one at a time."""
    res = Residency(limit_bytes=500 * MIB, hot_budget_bytes=600 * MIB)
    only = Engine("only")
    loaded(res, only)
    assert only.budgets[-1] == (600 * MIB, 0)


def test_with_unload_idle_s_a_model_idle_that_long_leaves_but_a_pinned_one():
    res = Residency(limit_bytes=None, hot_budget_bytes=600 * MIB, unload_idle_s=0.4)
    now = time.monotonic()
    idle, pinned, busy = Engine("idle", idle=now), Engine("pinned", idle=now, pinned=True), Engine("busy", idle=None)
    loaded(res, idle, pinned, busy)
    deadline = time.monotonic() + 10
    while not idle.unloaded and time.monotonic() < deadline:
        time.sleep(0.05)
    assert idle.unloaded and not pinned.unloaded and not busy.unloaded
    assert pinned.budgets[-1] == (300 * MIB, None)  # two loaded now: the hot budget in halves

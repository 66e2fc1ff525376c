"""Which served models are loaded, within one memory limit for all of them.

Every model's engine asks here before it loads its weights. When the weights do not fit beside
those already loaded and the hot budget, the model idle longest (no running request, not
pinned by --keep-loaded) is unloaded first: its hot KV was written through to the warm tier as
it was made, so its agents come back as warm hits. The limit is then shared out: the hot
budget in equal parts to the loaded models, and what neither weights nor the hot budget take
to their running requests, also in equal parts (docs/usage.md, "Several models"). No MLX here:
each engine applies its share on its own thread.
"""

from __future__ import annotations

import logging
import threading
import time
from concurrent.futures import Future
from typing import Protocol

log = logging.getLogger(__name__)

MIB = 1 << 20
BUSY_WAIT_S = 600.0  # how long a load waits for a busy model to go idle and make room
POLL_S = 0.25


class NoRoom(RuntimeError):
    """The model cannot be loaded within the memory limit (the message says what holds it)."""


class Resident(Protocol):
    """What the residency needs of a model's engine."""

    name: str
    pinned: bool
    keeps_kv: bool  # False for an embedding model: no share of the hot KV budget

    def idle_since(self) -> float | None:
        """When it last had work, if it has none now (None: requests are running or waiting)."""

    def unload(self) -> Future:
        """Unload on its own thread if still idle then: a Future of whether it did."""

    def set_budgets(self, hot_bytes: int, working_bytes: int | None) -> None:
        """Apply its share of the limit (on its own thread)."""


class Residency:
    def __init__(self, limit_bytes: int | None, hot_budget_bytes: int, unload_idle_s: float | None = None) -> None:
        """`unload_idle_s`: a loaded model idle this long is unloaded even with room to spare
        (--unload-idle-s; None: only to make room)."""
        self.limit = limit_bytes
        self.hot_budget = hot_budget_bytes
        self._lock = threading.Lock()
        self._weights: dict[Resident, int] = {}  # loaded or loading, with their weights' bytes
        if unload_idle_s is not None:
            threading.Thread(target=self._unload_idle, args=(unload_idle_s,), name="residency", daemon=True).start()

    def _unload_idle(self, idle_s: float) -> None:
        while True:
            time.sleep(min(idle_s / 4, 5.0))
            now = time.monotonic()
            with self._lock:
                idle = {e: now - since for e in self._weights if not e.pinned and (since := e.idle_since()) is not None}
            for engine, seconds in idle.items():
                if seconds > idle_s and engine.unload().result():
                    log.info("unloaded %s after %.0f s idle", engine.name, seconds)
                    self.unloaded(engine)

    def share(self) -> tuple[int, int | None]:
        """(hot budget, bytes for running requests) of each loaded model now."""
        with self._lock:
            return self._share()

    def _share(self) -> tuple[int, int | None]:
        n = max(len(self._weights), 1)
        hot = self.hot_budget // max(sum(e.keeps_kv for e in self._weights), 1)
        if self.limit is None:
            return hot, None
        working = self.limit - sum(self._weights.values()) - self.hot_budget
        return hot, max(working, 0) // n

    def make_room(self, engine: Resident, weights_bytes: int) -> None:
        """Reserve room for the engine's weights, unloading idle models as needed; raises
        NoRoom when pinned or busy models keep the limit full."""
        deadline = time.monotonic() + BUSY_WAIT_S
        while True:
            with self._lock:
                others = [e for e in self._weights if e is not engine]
                if self._fits(weights_bytes, others) or not others:
                    self._weights[engine] = weights_bytes
                    return
                idle = sorted((e for e in others if not e.pinned and e.idle_since() is not None), key=_idle_since)
                busy = [e for e in others if not e.pinned and e.idle_since() is None]
            if idle:
                victim = idle[0]
                if victim.unload().result():
                    log.info("unloaded %s to make room for %s", victim.name, engine.name)
                    self.unloaded(victim)
                continue
            if not busy or time.monotonic() > deadline:
                raise NoRoom(self._why(engine, weights_bytes, others))
            time.sleep(POLL_S)  # a busy model's requests end; then it may leave

    def _fits(self, weights_bytes: int, others: list[Resident]) -> bool:
        if self.limit is None:
            return True
        return sum(self._weights[e] for e in others) + weights_bytes + self.hot_budget <= self.limit

    def _why(self, engine: Resident, weights_bytes: int, others: list[Resident]) -> str:
        held = ", ".join(
            f"{e.name} ({self._weights.get(e, 0) // MIB} MiB, {'pinned' if e.pinned else 'busy'})" for e in others
        )
        return (
            f"{engine.name} needs {weights_bytes // MIB} MiB for its weights; with the hot budget "
            f"({self.hot_budget // MIB} MiB) that does not fit the memory limit ({(self.limit or 0) // MIB} MiB) "
            f"beside {held}"
        )

    def loaded_as(self, engine: Resident, weights_bytes: int) -> None:
        """The engine's weights are in, at their measured size: every model's share changes."""
        with self._lock:
            self._weights[engine] = weights_bytes
        self._rebalance()

    def unloaded(self, engine: Resident) -> None:
        """The engine's weights are gone (or never came: a failed load)."""
        with self._lock:
            self._weights.pop(engine, None)
        self._rebalance()

    def _rebalance(self) -> None:
        with self._lock:
            engines, (hot, working) = list(self._weights), self._share()
        for engine in engines:
            engine.set_budgets(hot, working)


def _idle_since(engine: Resident) -> float:
    since = engine.idle_since()
    return since if since is not None else float("inf")

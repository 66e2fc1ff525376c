"""TierWatch: whether a shared warm tier is used now, as its server sees it (a folder always
answers: its watch only passes calls through).

A tier that answers is used. Once a call to it gets no answer (a hung Redis, dropped packets, a
refused connection; an error Redis returns is an answer), it is skipped: a request asks it
nothing, a read is a miss and a write fails at once, so a slow shared tier costs no request more
than the one call that found it out. The watch checks it on the writer thread (tier.py), every
WATCH_S while used and every RETRY_S while skipped, and uses it again once it answers. The same
check finds a tier that lost its data (backend.check: a restart without persistence, FLUSHALL).
Both, and being skipped, are said in the log, and `check` returns them (the tier tells its
events: memory/index/write_back.py writes back what this server holds).
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable
from concurrent.futures import Executor, Future

from agent_memory.memory.warm.backend import BackendUsage, WarmBackend

log = logging.getLogger(__name__)

WATCH_S = 5.0  # how often a tier in use is checked: its memory figures (/health), its data kept
RETRY_S = 1.0  # how often a skipped tier is asked whether it answers again


class Skipped(ConnectionError):
    """The shared tier is skipped: it did not answer, and has not answered since."""


class TierWatch:
    def __init__(self, backend: WarmBackend) -> None:
        self.backend = backend
        self.usage = BackendUsage()  # the backend's figures as last read
        self.skipped_since: float | None = None  # wall clock
        self.reason: str | None = None
        self._checked = 0.0
        self._lost = False  # a loss found whose write-back has not been started yet
        self._lock = threading.Lock()

    @property
    def skipped(self) -> bool:
        return self.skipped_since is not None

    def interval(self) -> float:
        return RETRY_S if self.skipped else WATCH_S

    def due(self) -> bool:
        return time.monotonic() - self._checked > self.interval()

    def guard(self) -> None:
        """Raise Skipped while the tier is skipped (what a call would have waited for)."""
        if self.skipped:
            raise Skipped(f"the shared warm tier is skipped: {self.reason}")

    def submit(self, executor: Executor, call: Callable, *args) -> Future:
        """Run a call to the tier on `executor`, watched; while the tier is skipped, fail at
        once rather than behind a call that waits for it."""

        def watched():
            self.guard()  # skipped while it waited its turn
            try:
                return call(*args)
            except Exception as e:
                self.failed(e)
                raise

        if not self.skipped:
            return executor.submit(watched)
        failed: Future = Future()
        failed.set_exception(Skipped(f"the shared warm tier is skipped: {self.reason}"))
        return failed

    def failed(self, e: BaseException) -> None:
        """A call's failure: if it got no answer, the tier is skipped from now on."""
        if isinstance(e, Skipped) or not self.backend.unreachable(e):
            return
        with self._lock:
            if self.skipped:
                return
            self.skipped_since, self.reason = time.time(), str(e) or type(e).__name__
        log.warning(
            "the shared warm tier %s did not answer (%s): skipped until it answers again; requests are "
            "served from memory, what is not there is recomputed",
            self.backend.location,
            self.reason,
        )

    def check(self) -> bool | None:
        """Read the backend's figures. Whether the tier lost its data (True) or answers again
        after being skipped (False), for the writer to act on before its next job; else None."""
        self._checked = time.monotonic()
        back = None
        try:
            self.usage, lost = self.backend.check()
            self._lost |= lost
            if lost:
                log.warning(
                    "the shared warm tier %s lost its data (restarted without persistence, or flushed): "
                    "writing back the blocks and manifests of the agents this server holds",
                    self.backend.location,
                )
            if self._lost or self.skipped:
                back, self._lost = self._lost, False
        except Exception as e:  # noqa: BLE001 - shown on /health, and skipped if it got no answer
            self.usage = BackendUsage(note=f"the store does not answer: {e}")
            self.failed(e)
            return None
        if self.skipped:
            log.warning(
                "the shared warm tier %s answers again after %.0f s: used again",
                self.backend.location,
                time.time() - self.skipped_since,
            )
            self.skipped_since = self.reason = None
        return back

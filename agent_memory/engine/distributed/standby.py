"""Rank 0 and its followers kept in step while nothing runs: rank 0's `Heartbeat` broadcasts an
empty message every HEARTBEAT_S on its engine thread (a follower whose watchdog hears nothing for
3 × HEARTBEAT_S stops), and `STOP` once the server stops; a follower's `stand_by` receives them
until `STOP` (exit 0) or a lost peer (exit 75). The step plan (engine/distributed/plan.py) takes
this over: the same broadcast then carries each step's work."""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable
from concurrent.futures import Future

from agent_memory.engine.distributed.group import HEARTBEAT_S, STOPPED, DistributedGroup

log = logging.getLogger(__name__)

STOP = b"stop"


class Heartbeat:
    """Rank 0's side: `call` runs a function on its engine thread (BatchEngine.call)."""

    def __init__(self, group: DistributedGroup, call: Callable[[Callable[[], None]], Future]) -> None:
        self._group = group
        self._call = call
        self._stopped = threading.Event()
        threading.Thread(target=self._beat, name="heartbeat", daemon=True).start()

    def _beat(self) -> None:
        while not self._stopped.wait(HEARTBEAT_S):
            self._call(lambda: self._group.broadcast(b"", "a heartbeat"))

    def stop(self) -> None:
        """The followers stop once the engine thread gets here (before it stops itself)."""
        if not self._stopped.is_set():
            self._stopped.set()
            self._call(lambda: self._group.broadcast(STOP, "the stop"))


def stand_by(group: DistributedGroup) -> int:
    """A follower's loop: rank 0's messages until it stops; the process's exit status. The first
    may take up to --distributed-timeout: rank 0 opens its warm tier and restores its store first."""
    seconds = group.timeout_s
    while True:
        try:
            body = group.broadcast(None, "waiting for rank 0", seconds=seconds)
            seconds = 3 * HEARTBEAT_S
        except RuntimeError as e:  # [ring] connection to a peer was lost
            log.error("rank %d: the group failed (%s): stopping", group.rank, e)
            return STOPPED
        if body == STOP:
            log.info("rank %d: rank 0 stopped the server", group.rank)
            return 0

"""Rank 0 when the group of a split model fails while serving: a rank died or cannot be reached.

Either a step or exchange raises on the engine thread (`[ring] connection to a peer was lost`:
`GroupFault.failed`), or it never returns — MLX's collectives have no timeout, and one that lost
its peer inside a step's graph waits for ever — and the watchdog (group.py) ends it
(`GroupFault.stuck`, on the watchdog's thread). Both ways every request in flight ends with a
503 `rank_lost` error in its API's shape (a stream: an error event, then its end), new requests
are refused with the same (`refusal`, read by /health and the API's admission), and the process
exits with 75 (`STOPPED`) so that the launcher or a supervisor sees a failure. Nothing is
half-answered: a request either finished before the fault or gets the error. Starting both
ranks again restores the memory (the warm tier, flushed on the way out when the engine thread
is free to)."""

from __future__ import annotations

import logging
import time
from collections.abc import Callable

from agent_memory.engine.distributed.group import STOPPED
from agent_memory.engine.requests import Failed, Sink

log = logging.getLogger(__name__)

RANK_LOST = "rank_lost"  # the error code a client sees
GRACE_S = 1.0  # a stuck engine: the API's time to send the error events before the process exits


class GroupFault:
    """What rank 0's BatchEngine does when its group fails; `refusal` is read from any thread."""

    def __init__(self, on_stop: Callable[[], None]) -> None:
        """`on_stop`: the server stops and exits with STOPPED (cli/serve.py)."""
        self.on_stop = on_stop
        self.refusal: Failed | None = None  # once failed: what every request is told

    def _refuse(self, why: str, in_flight: int) -> Failed:
        """The refusal made, and said in one line."""
        log.error(
            "rank 0: the group failed (%s): %d requests in flight end with an error; stopping (exit %d)",
            why, in_flight, STOPPED,
        )
        self.refusal = Failed(
            f"a rank of the distributed server stopped ({why}); the server stops: start every rank again",
            503,
            RANK_LOST,
        )
        return self.refusal

    def failed(self, why: str, core, warm) -> None:
        """On the engine thread, after a step or exchange raised: fail the requests through
        EngineCore (its sequences end, nothing committed), flush the warm tier, stop the server."""
        refusal = self._refuse(why, len(core.seqs) if core is not None else 0)
        if core is not None:
            core.shutdown(refusal)
        if warm is not None:
            warm.close()
        self.on_stop()

    def stuck(self, why: str, core, arriving: list[Sink]) -> None:
        """On the watchdog's thread, the engine thread blocked in a collective for good (the
        watchdog said so in its line and exits next): the clients of the requests running and
        of those `arriving` (still in the engine's inbox) are told at once — sinks hand events to
        the API's loop from any thread — and given GRACE_S to be sent."""
        sinks = [seq.generation.output.sink for seq in list(core.seqs.values())] if core is not None else []
        refusal = self._refuse(why, len(sinks) + len(arriving))
        for sink in sinks + arriving:
            sink(refusal)
        time.sleep(GRACE_S)

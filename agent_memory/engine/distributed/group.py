"""The processes one model is served across (mx.distributed, started by `mlx.launch`): who this
process is, the few collectives made on the host at start (`agree`, `gather`, `barrier`; each
step's plan goes by channel.py), the `Watchdog` that ends a process whose collective never
returns (MLX has no collective timeout), and the `ShardLayout` each rank holds. One process (no launcher) is no group:
`DistributedGroup.join` returns None and nothing here runs. Collectives only on the engine thread
(a follower's main thread), at the same program point on every rank: every rank must issue the
same collectives in the same order."""

from __future__ import annotations

import contextlib
import hashlib
import logging
import os
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass

import agent_memory.blas  # noqa: F401
import mlx.core as mx

log = logging.getLogger(__name__)

HEARTBEAT_S = 5.0  # the longest rank 0 stays silent while idle: a follower's watchdog waits 3 times this
LOADING_S = 3600.0  # the longest the ranks wait for each other to read their weights (a big model, a slow disk)
STOPPED = 75  # the exit status of a rank that stops because the group failed (EX_TEMPFAIL: start again)
MODES = ("tensor", "pipeline")


class GroupError(RuntimeError):
    """The ranks cannot serve together (another model or layout on one of them); said in one line."""


class Watchdog:
    """Ends the process when a collective waits past its deadline: a rank alive but stuck (its
    socket open) would block the others' collective for ever, and a blocked MLX collective cannot
    be interrupted. A daemon thread, started with the group."""

    def __init__(self, rank: int) -> None:
        self.rank = rank
        # Rank 0's engine: tells its requests' clients before the exit (faults.py), given why.
        self.before_exit: Callable[[str], None] | None = None
        self._pending: tuple[str, float, float] | None = None  # what waits, since when, until when
        self._lock = threading.Lock()
        threading.Thread(target=self._watch, name="watchdog", daemon=True).start()

    @contextlib.contextmanager
    def waiting(self, what: str, seconds: float):
        with self._lock:
            now = time.monotonic()
            self._pending = (what, now, now + seconds)
        try:
            yield
        finally:
            with self._lock:
                self._pending = None

    def _watch(self) -> None:
        while True:
            time.sleep(0.2)
            with self._lock:
                pending = self._pending
            if pending is not None and time.monotonic() > pending[2]:
                what, since, _ = pending
                why = f"no answer from the other ranks for {time.monotonic() - since:.0f} s ({what})"
                log.error("rank %d: %s: stopping", self.rank, why)
                if self.before_exit is not None:
                    self.before_exit(why)
                logging.shutdown()
                os._exit(STOPPED)


class DistributedGroup:
    def __init__(self, group, timeout_s: float) -> None:
        self.group = group  # mx.distributed.Group: what model.shard / pipeline split over
        self.rank = group.rank()
        self.size = group.size()
        self.timeout_s = timeout_s  # --distributed-timeout: the longest one collective may wait
        self.watchdog = Watchdog(self.rank)

    @classmethod
    def join(cls, timeout_s: float) -> DistributedGroup | None:
        """The group `mlx.launch` started this process in (ring, JACCL or MPI, as it chose), or
        None when it runs alone."""
        group = mx.distributed.init()
        return cls(group, timeout_s) if group.size() > 1 else None

    @property
    def label(self) -> str:
        return f"rank={self.rank}/{self.size}"

    def _sum(self, values: mx.array, what: str, seconds: float | None) -> mx.array:
        with self.watchdog.waiting(what, seconds or self.timeout_s):
            total = mx.distributed.all_sum(values, group=self.group)
            mx.eval(total)
        return total

    def agree(self, values: list[int], what: str, seconds: float | None = None) -> list[int]:
        """The sum over the ranks of each value (small ints: flags, counts)."""
        return self._sum(mx.array(values, dtype=mx.int32), what, seconds).tolist()

    def gather(self, values: list[int], what: str) -> list[list[int]]:
        """Every rank's values, by rank (each rank fills its own row of one sum)."""
        rows = [[0] * len(values) for _ in range(self.size)]
        rows[self.rank] = list(values)
        return self._sum(mx.array(rows, dtype=mx.int32), what, None).tolist()

    def barrier(self, what: str, seconds: float | None = None) -> None:
        self.agree([1], what, seconds)


def digest_ints(text: str, n: int = 4) -> list[int]:
    """A text's sha256 as n int32s (non-negative), to compare across ranks by `gather`."""
    raw = hashlib.sha256(text.encode()).digest()
    return [int.from_bytes(raw[4 * i : 4 * i + 4], "little") & 0x7FFFFFFF for i in range(n)]


@dataclass(frozen=True)
class ShardLayout:
    """Which part of the model this rank holds: its KV heads and its layers ([a, b) each; all of
    one of them), the same model (`fingerprint`) on every rank."""

    mode: str  # "tensor" | "pipeline"
    size: int
    rank: int
    kv_heads: tuple[int, int]
    layers: tuple[int, int]
    fingerprint: str

    def row(self) -> list[int]:
        """What `agree_layout` gathers: what must be equal everywhere, then this rank's part."""
        same = [MODES.index(self.mode), self.size, *digest_ints(self.fingerprint)]
        return [*same, self.rank, *self.kv_heads, *self.layers]

    def part(self) -> str:
        """What this rank holds that the others do not: `0-1` (key-value heads, or layers)."""
        a, b = self.kv_heads if self.mode == "tensor" else self.layers
        return f"{a}" if b - a == 1 else f"{a}-{b - 1}"


def agree_layout(group: DistributedGroup, layout: ShardLayout) -> list[ShardLayout]:
    """Every rank's layout, checked on every rank: the same model and split, each rank its own
    part. A difference refuses the start on every rank with one line naming the ranks."""
    rows = group.gather(layout.row(), "the shard layout")
    same = layout.row()[:6]
    if differ := [r for r, row in enumerate(rows) if row[:6] != same or row[6] != r]:
        others = ", ".join(str(r) for r in differ)
        raise GroupError(
            f"rank {others} of {group.size} loaded another model or split than rank {group.rank} "
            f"({layout.mode}, model {layout.fingerprint[:12]}): every rank must serve the same model folder"
        )
    return [
        ShardLayout(layout.mode, layout.size, r, (row[7], row[8]), (row[9], row[10]), layout.fingerprint)
        for r, row in enumerate(rows)
    ]


def describe_layouts(layouts: list[ShardLayout]) -> str:
    """`tensor 2×: kv heads 0 | 1`, `pipeline 2×: layers 2-3 | 0-1` — what each rank holds, by
    rank, for the ready line and /health."""
    first = layouts[0]
    held = "kv heads" if first.mode == "tensor" else "layers"
    return f"{first.mode} {first.size}×: {held} " + " | ".join(layout.part() for layout in layouts)

"""Rank 0's recorder: what changed since the last step that the other ranks must repeat, and the
step's one broadcast of it (plan.py).

EngineCore, the committer and the store's BlockPool tell it what they do as they do it (an
admission, a prefill plan, an end, a block cut and made hot, a payload demoted or dropped), in
the order it happens, from the engine thread and from the kv-writer's (under the store's lock);
`step` flushes that list with the step's work and broadcasts it before any forward of the step,
at the same program point on every rank. A server of one process has `NO_RECORDER`, whose
methods do nothing: today's path, unchanged.
"""

from __future__ import annotations

import contextlib
import threading
from collections.abc import Callable, Iterator
from contextlib import AbstractContextManager
from typing import Any, Protocol

from agent_memory.engine.distributed import sampling
from agent_memory.engine.distributed.plan import (
    IDLE,
    STOP,
    Admit,
    Ended,
    Held,
    Kept,
    KeptSnapshot,
    Op,
    Planned,
    PoolOp,
    RankStatus,
    StepPlan,
    StepWork,
    WarmOp,
)


class Group(Protocol):
    """What the engine needs of the process group (group.py's DistributedGroup)."""

    rank: int
    size: int
    heartbeat_s: float  # the longest rank 0 stays silent while idle

    def broadcast(self, plan: StepPlan | None, status: RankStatus) -> tuple[StepPlan, list[RankStatus]]:
        """Every rank at the same point of each step: rank 0 sends `plan`, the others None and
        get it; every rank gets the followers' statuses."""
        ...

    def agree(self, bits: list[int]) -> list[int]:
        """Every rank at the same point: the sum over the ranks of each value (a warm read's
        failure bits before a prefill appends what it read: prefill.py)."""
        ...

    def token_sum(self, seq_id: int) -> sampling.Sum:
        """The all_sum a sequence's sampled tokens travel by (sampling.py)."""
        ...

    def watching(self, what: str) -> AbstractContextManager:
        """`what` (a step: its plan and forwards) under the watchdog: past the group's timeout
        the process stops, said in one line (a blocked collective cannot be interrupted)."""
        ...


class Recorder:
    active = True
    survivable = ()  # a failed step fails the group, not its requests: the ranks would differ

    def __init__(self, group: Group) -> None:
        self.group = group
        self.heartbeat_s = group.heartbeat_s
        self.statuses: list[RankStatus] = []  # the followers', from the last step
        self._lock = threading.Lock()
        self._ops: list[Op] = []
        self._samples: dict[int, list[int]] = {}  # seq id -> its other samples' ids, reserved
        self._cut: Kept | KeptSnapshot | None = None  # being made hot by the store, under its lock
        self._steps = 0

    def attach(self, core: Any) -> None:
        """Record an EngineCore's steps, its committer's cuts, its pool's payload changes and
        writes, its warm tier's deletes; its prefiller's warm reads are agreed by every rank."""
        core.recorder = core.parts.committer.recorder = core.parts.prefiller.recorder = self
        core.store.pool.watch = self.pool_event
        if core.parts.warm is not None:
            core.parts.warm.told = self.deleted
            with core.store.lock:
                self._add(Held(sorted(h for h, b in core.store.pool.blocks.items() if b.disk_bytes)))

    def watching(self) -> AbstractContextManager:
        """The step about to run (BatchEngine._run), under the group's watchdog."""
        self._steps += 1
        return self.group.watching(f"step {self._steps}")

    def step(self, work: Any, budget: int) -> None:
        """Flush and broadcast: the ops since the last step, then this step's work."""
        prefill = work.prefill.id if work.prefill is not None else None
        plan = self.flush(StepWork(work.decode, prefill, budget, work.waiting))
        self.statuses = self.group.broadcast(plan, RankStatus())[1]

    def heartbeat(self) -> None:
        """Idle: an empty step (any ops the kv-writer recorded meanwhile), so that the followers'
        watchdogs hear from rank 0."""
        self._send(self.flush(None), IDLE)

    def stop(self) -> None:
        """The engine stopped (its sequences ended): the followers apply the last ops and exit."""
        self._send(self.flush(None), STOP)

    def _send(self, plan: StepPlan, flags: int) -> None:
        plan.flags = flags
        with self.watching():
            self.statuses = self.group.broadcast(plan, RankStatus())[1]

    def flush(self, work: StepWork | None) -> StepPlan:
        with self._lock:
            ops, self._ops = self._ops, []
        return StepPlan(ops, work)

    def _add(self, op: Op) -> None:
        with self._lock:
            self._ops.append(op)

    # -- EngineCore ----------------------------------------------------------------------

    def admitted(self, seq: Any, ids: Iterator[int]) -> None:
        """A sequence joins; its other samples' ids are reserved now, since the followers
        make them in the step its prefill ends, as rank 0 does."""
        n = 1 if seq.prefill_only else seq.request.params.n
        sample_ids = self._samples[seq.id] = [next(ids) for _ in range(n - 1)]
        self._add(Admit(seq.id, list(seq.prompt), sample_ids, seq.request.params.max_tokens, seq.prefill_only))

    def sample_ids(self, seq: Any, ids: Iterator[int]) -> Iterator[int]:
        """The ids `samples()` gives a sequence's other samples: those reserved at admission."""
        return iter(self._samples.pop(seq.id, []))

    def planned(self, seq: Any) -> None:
        snapshot = seq.lease.snapshot
        segments = [(s.start, s.end, s.block.hash if s.block is not None else None) for s in seq.plan]
        at = snapshot.start if snapshot is not None else 0
        held = {b.hash: b for b in [*(s.block for s in seq.plan if s.block is not None), snapshot] if b is not None}
        reads = [held[h].record().meta() for h in seq.reads]
        self._add(Planned(seq.id, segments, snapshot.hash if snapshot else None, at, list(seq.marks), reads))

    def ended(self, seq_id: int) -> None:
        self._samples.pop(seq_id, None)
        self._add(Ended(seq_id))

    def sampler(self, seq_id: int, sampler: Callable) -> Callable:
        return sampling.leading(sampler, self.group.token_sum(seq_id))

    def agree(self, failed: list[int]) -> list[int]:
        """Which of a prefill chunk's warm reads failed on any rank (each rank's 1s, summed)."""
        return self.group.agree(failed)

    # -- the committer and the pool ------------------------------------------------------

    def cutting(self, capture: tuple[int, int], start: int, end: int) -> None:
        """The committer cuts a block from a capture; the pool makes it hot next."""
        self._cut = Kept(capture, "", start, end)

    def taking(self, capture: tuple[int, int]) -> None:
        self._cut = KeptSnapshot(capture, "")

    def pool_event(self, event: str, block: Any) -> None:
        """BlockPool.watch: called before a payload is set or dropped, and as a commit asks for
        a payload's write (before the commit's eviction: a follower still holds it as saved)."""
        if event == "save":
            op: Op = WarmOp("save", block.hash, block.record().meta())
        elif event == "drop":
            op = PoolOp("drop", block.hash)
        elif self._cut is not None:
            op, self._cut = self._cut, None
            op.hash = block.hash
        else:
            op = PoolOp("demote" if block.payload is not None else "read_in", block.hash)
        self._add(op)

    def deleted(self, block_hash: str) -> None:
        """WarmTier.told: a block's warm copy deleted (an eviction, an agent ended, a write
        nobody wanted; the writer's thread or the engine's): every rank deletes its own."""
        self._add(WarmOp("delete", block_hash))


class NoRecorder:
    """One process: nothing to record or send."""

    active = False
    survivable = Exception  # a failed step fails the requests it touched
    heartbeat_s = None  # the engine waits for work as long as it takes

    def watching(self) -> AbstractContextManager:
        return contextlib.nullcontext()

    def heartbeat(self) -> None:
        pass

    def stop(self) -> None:
        pass

    def step(self, work: Any, budget: int) -> None:
        pass

    def admitted(self, seq: Any, ids: Iterator[int]) -> None:
        pass

    def sample_ids(self, seq: Any, ids: Iterator[int]) -> Iterator[int]:
        return ids

    def planned(self, seq: Any) -> None:
        pass

    def ended(self, seq_id: int) -> None:
        pass

    def sampler(self, seq_id: int, sampler: Callable) -> Callable:
        return sampler

    def cutting(self, capture: tuple[int, int], start: int, end: int) -> None:
        pass

    def taking(self, capture: tuple[int, int]) -> None:
        pass

    def agree(self, failed: list[int]) -> list[int]:
        return failed


NO_RECORDER = NoRecorder()

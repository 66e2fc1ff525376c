"""The step plan: what rank 0 tells the other ranks before each step, so that their shards of
the model and of the KV stay in step with its own (docs/architecture.md, "Across processes").

Rank 0 alone decides (scheduler, store, samplers); a follower only executes. Every step the
ranks `all_sum` one fixed int32 frame: rank 0 writes the plan's head (the step's work, flags,
the size of a body), follower r only its own status slots, so the same collective is also the
followers' report (each slot is written by one rank: the sum is a gather). Only when something
new happened (a request admitted, a block kept, an end...) does a second `all_sum` carry the
body: the ops since the last step, in the order they happened, as compact JSON (ints, strings
and lists only; nothing is unpickled). Decoded tokens never travel here: they are in the
step's graph (sampling.py).
"""

from __future__ import annotations

import json
from collections.abc import Callable
from dataclasses import astuple, dataclass, field

import numpy as np

HEAD = 16  # the plan's part of the frame
SLOTS = 4  # each rank's status slots: watermark, failed_reads, error, hot_kib

END = -1  # a capture of a sequence's cache as it left the batch (not at a prompt position)

# flags
IDLE, GIVE_BACK_MEMORY, STOP, FAIL = 1, 2, 4, 8


@dataclass
class Admit:
    """A sequence to shadow: its prompt, the ids its other samples (n > 1) will have, and how
    long each may decode."""

    seq_id: int
    prompt: list[int]
    sample_ids: list[int]
    max_tokens: int
    prefill_only: bool


@dataclass
class Planned:
    """What a sequence's prefill puts into its cache: runs of held blocks (a hash) and gaps to
    compute (None), the snapshot restored where the cached run ends, where it stops to share
    (marks), and the warm blocks it reads."""

    seq_id: int
    segments: list[tuple[int, int, str | None]]
    snapshot: str | None
    snapshot_at: int  # the position the snapshot is of
    marks: list[int]
    reads: list[dict[str, str]]  # the warm blocks it reads, as their block files name them (BlockRecord.meta)


@dataclass
class Ended:
    """A sequence rank 0 took out (a stop string, a cancel, superseded, shut down): the follower
    takes its own out at its next step, so its cache is then exactly rank 0's."""

    seq_id: int


@dataclass
class Kept:
    """One block the store made hot: cut [start, end) from a capture (a sequence's cache at a
    point the follower knows: `(seq_id, prompt position)` or `(seq_id, END)`)."""

    capture: tuple[int, int]
    hash: str
    start: int
    end: int


@dataclass
class KeptSnapshot:
    """A snapshot the store made hot, taken from a capture's window and recurrent layers."""

    capture: tuple[int, int]
    hash: str


@dataclass
class PoolOp:
    """A hot payload's change outside a commit: `demote` (an exact block cooled to --kv-bits),
    `drop` (evicted or removed), `read_in` (a block read from the warm tier made hot)."""

    op: str
    hash: str


@dataclass
class WarmOp:
    """A write to or delete from the warm tier, which each rank does on its own folder: a save
    writes the rank's payload of the block as the store held it when it asked for the write
    (recorded there: before any eviction of that commit), named as its block file says."""

    op: str  # save, delete
    hash: str
    meta: dict[str, str] = field(default_factory=dict)  # a save's BlockRecord.meta()


@dataclass
class Held:
    """The blocks rank 0's warm folder holds once its store is restored (the first plan): a
    follower deletes its other block files (a crash's leftovers, a block `cache rm` removed)."""

    hashes: list[str]


OPS = {cls.__name__: cls for cls in (Admit, Planned, Ended, Kept, KeptSnapshot, PoolOp, WarmOp, Held)}
Op = Admit | Planned | Ended | Kept | KeptSnapshot | PoolOp | WarmOp | Held


@dataclass
class StepWork:
    """EngineCore's decision for the step: whether the batch decodes (`waiting`: a request's
    prefill has not ended), and which sequence prefills a chunk of how many tokens."""

    decode: bool
    prefill: int | None
    budget: int
    waiting: bool


@dataclass
class StepPlan:
    ops: list[Op] = field(default_factory=list)  # since the last plan, in the order they happened
    work: StepWork | None = None  # None: nothing to run (a heartbeat, a stop)
    flags: int = 0
    reason: str = ""  # with FAIL: why the group stops


@dataclass
class RankStatus:
    """What a follower reports in every frame."""

    watermark: int = 0  # its warm writer's finished saves, a running count
    failed_reads: int = 0  # this step's warm reads it could not make
    error: int = 0
    hot_kib: int = 0


class PlanCodec:
    """Plans to and from the frame and body; no collectives here (group.py runs those)."""

    def __init__(self, size: int) -> None:
        self.size = size
        self.frame_ints = HEAD + SLOTS * size

    def frame(self, rank: int, plan: StepPlan | None, status: RankStatus) -> tuple[np.ndarray, bytes]:
        """This rank's contribution: rank 0 the plan's head and its body; a follower zeros but
        for its status slots (and no body)."""
        frame = np.zeros(self.frame_ints, np.int32)
        frame[HEAD + SLOTS * rank : HEAD + SLOTS * (rank + 1)] = astuple(status)
        body = b""
        if rank == 0:
            assert plan is not None
            if plan.ops or plan.reason:
                body = json.dumps(
                    {"ops": [[type(op).__name__, *astuple(op)] for op in plan.ops], "reason": plan.reason},
                    separators=(",", ":"),
                ).encode()
            work = plan.work
            frame[:2] = len(body), plan.flags
            if work is not None:
                prefill = -1 if work.prefill is None else work.prefill
                frame[2:7] = 1, work.decode, prefill, work.budget, work.waiting
        return frame, body

    @staticmethod
    def body_size(summed: np.ndarray) -> int:
        return int(summed[0])

    def plan(self, summed: np.ndarray, body: bytes) -> StepPlan:
        """The plan from the summed frame and the body (empty when the frame says none)."""
        work = None
        if summed[2]:
            prefill = int(summed[4])
            work = StepWork(bool(summed[3]), None if prefill < 0 else prefill, int(summed[5]), bool(summed[6]))
        ops, reason = [], ""
        if body:
            decoded = json.loads(body)
            ops = [_op(*entry) for entry in decoded["ops"]]
            reason = decoded["reason"]
        return StepPlan(ops, work, int(summed[1]), reason)

    def statuses(self, summed: np.ndarray) -> list[RankStatus]:
        """Every follower's status (rank 1..N-1, in order), from the summed frame."""
        return [RankStatus(*map(int, summed[HEAD + SLOTS * r : HEAD + SLOTS * (r + 1)])) for r in range(1, self.size)]


def _op(name: str, *fields) -> Op:
    cls = OPS[name]
    if cls in (Kept, KeptSnapshot):  # JSON has no tuples
        fields = (tuple(fields[0]), *fields[1:])
    if cls is Planned:
        fields = (fields[0], [tuple(s) for s in fields[1]], *fields[2:])
    return cls(*fields)


def exchange(
    codec: PlanCodec, rank: int, all_sum: Callable[[np.ndarray], np.ndarray], plan: StepPlan | None, status: RankStatus
) -> tuple[StepPlan, list[RankStatus]]:
    """One step's exchange over `all_sum` (numpy in, numpy out: group.py's collective): every
    rank gets rank 0's plan and every follower's status; the body's collective only when there
    is a body."""
    frame, body = codec.frame(rank, plan, status)
    summed = all_sum(frame)
    size = codec.body_size(summed)
    if size:
        mine = np.frombuffer(body, np.uint8) if rank == 0 else np.zeros(size, np.uint8)
        body = all_sum(mine).astype(np.uint8).tobytes()
    return codec.plan(summed, body), codec.statuses(summed)

"""A follower's copy of one of rank 0's sequences: what it needs to compute the same KV (the
prompt, the prefill plan as hashes, the marks where rank 0 shares what it computed), and the
working cache that holds its shard of that KV, and the warm reads it makes of its own blocks."""

from __future__ import annotations

from collections import deque
from concurrent.futures import Future
from dataclasses import dataclass, field

from agent_memory.engine.distributed.plan import Admit, Planned
from agent_memory.engine.kinds.attention import StoredRun
from agent_memory.memory.warm.format.records import BlockRecord


@dataclass(eq=False)
class Shadow:
    seq_id: int  # the admitted sequence's, or one of its other samples'
    admit: Admit
    cache: list | None  # the working cache while prefilling; the decode batch holds it after
    pos: int = 0  # prompt tokens in `cache`
    plan: deque[tuple[int, int, str | None]] = field(default_factory=deque)
    snapshot: str | None = None
    snapshot_at: int = 0
    marks: list[int] = field(default_factory=list)
    stored: list[StoredRun] = field(default_factory=list)  # runs restored from blocks: cut back exactly
    prefill_end: int = 0  # where its plan ends: a prefill started over computes up to there
    reads: dict[str, tuple[BlockRecord, Future]] = field(default_factory=dict)  # its warm reads, by hash

    @property
    def prompt(self) -> list[int]:
        return self.admit.prompt

    def planned(self, planned: Planned) -> None:
        self.plan = deque(planned.segments)
        self.prefill_end = planned.segments[-1][1] if planned.segments else self.pos
        self.snapshot, self.snapshot_at, self.marks = planned.snapshot, planned.snapshot_at, planned.marks

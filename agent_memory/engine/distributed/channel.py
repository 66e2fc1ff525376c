"""The step plan over the process group: `PlanChannel` is what rank 0's Recorder and a
follower call each step (recorder.Group), made of the group's (group.py) collective and
watchdog: the frame's `all_sum`, the body's when there is one (plan.exchange), the `all_sum`
a sequence's sampled tokens travel by inside the step's graph (sampling.py), and `watching`:
a whole step — its plan and its forwards, whose collectives are in the graph — under the
watchdog, since any of them may wait for ever on a rank that hangs."""

from __future__ import annotations

from contextlib import AbstractContextManager

import agent_memory.blas  # noqa: F401
import mlx.core as mx
import numpy as np

from agent_memory.engine.distributed.plan import PlanCodec, RankStatus, StepPlan, exchange


class PlanChannel:
    def __init__(self, group, heartbeat_s: float) -> None:
        """`group`: group.py's DistributedGroup (its mx group, rank, size, timeout and watchdog);
        `heartbeat_s`: the longest rank 0 stays silent while idle."""
        self.group = group
        self.rank, self.size = group.rank, group.size
        self.heartbeat_s = heartbeat_s
        self.codec = PlanCodec(group.size)
        self.plans = 0  # exchanged so far: named in the watchdog's line

    def broadcast(self, plan: StepPlan | None, status: RankStatus) -> tuple[StepPlan, list[RankStatus]]:
        self.plans += 1
        return exchange(self.codec, self.rank, self._all_sum, plan, status)

    def agree(self, bits: list[int]) -> list[int]:
        return self._all_sum(np.array(bits, np.int32)).tolist()

    def token_sum(self, seq_id: int):
        return lambda tokens: mx.distributed.all_sum(tokens, group=self.group.group)

    def watching(self, what: str) -> AbstractContextManager:
        seconds = self.group.timeout_s
        if self.rank != 0:  # it waits for rank 0 through its idle time too: a heartbeat every heartbeat_s
            seconds = max(seconds, 3 * self.heartbeat_s)
        return self.group.watchdog.waiting(what, seconds)

    def _all_sum(self, values: np.ndarray) -> np.ndarray:
        total = mx.distributed.all_sum(mx.array(values), group=self.group.group)
        mx.eval(total)
        return np.array(total)

"""The step plan's codec (engine/distributed/plan.py): the frame every rank sums each step, the
body sent only when something new happened, and the followers' status slots, through a sum of
the ranks' contributions as `all_sum` makes it; and NO_RECORDER, rank 0's recorder in one process."""

import inspect
from itertools import count

import numpy as np

from agent_memory.engine.distributed.plan import (
    END,
    HEAD,
    IDLE,
    SLOTS,
    STOP,
    Admit,
    Ended,
    Held,
    Kept,
    KeptSnapshot,
    PlanCodec,
    Planned,
    PoolOp,
    RankStatus,
    StepPlan,
    StepWork,
    WarmOp,
    exchange,
)
from agent_memory.engine.distributed.recorder import NO_RECORDER, Recorder


def run_group(size: int, plan: StepPlan, statuses: dict[int, RankStatus]):
    """Every rank's exchange over one in-process all_sum: each collective sums what the ranks give."""
    codec = PlanCodec(size)
    frames = [codec.frame(r, plan if r == 0 else None, statuses.get(r, RankStatus())) for r in range(size)]
    summed = sum(f for f, _ in frames)
    calls = []

    def results(rank: int):
        def all_sum(mine: np.ndarray) -> np.ndarray:
            calls.append(mine.dtype)
            if mine.dtype == np.int32:
                return summed
            return sum(np.frombuffer(b, np.uint8) if b else np.zeros_like(mine) for _, b in frames).astype(np.uint8)

        return exchange(codec, rank, all_sum, plan if rank == 0 else None, statuses.get(rank, RankStatus()))

    return [results(r) for r in range(size)], calls


def test_a_decode_only_step_is_one_frame_of_fixed_size():
    plan = StepPlan([], StepWork(True, None, 256, False))
    results, calls = run_group(2, plan, {})
    assert [p for p, _ in results] == [plan, plan]
    assert calls == [np.int32, np.int32]  # one collective a rank: no body
    assert PlanCodec(2).frame(0, plan, RankStatus())[0].shape == (HEAD + SLOTS * 2,)
    assert PlanCodec(4).frame(3, None, RankStatus())[0].shape == (HEAD + SLOTS * 4,)


def test_every_op_round_trips_in_order_to_every_rank():
    ops = [
        Admit(7, [1, 2, 3, 400], [8, 9], 64, False),
        Held(["ab" * 32, "cd" * 32]),
        Planned(7, [(0, 64, "ab" * 32), (64, 130, None)], None, 0, [70], [{"hash": "ab" * 32, "start": "0"}]),
        Ended(5),
        Kept((5, END), "cd" * 32, 0, 64),
        Kept((7, 130), "ef" * 32, 64, 128),
        KeptSnapshot((7, 130), "01" * 32),
        PoolOp("demote", "cd" * 32),
        PoolOp("drop", "ab" * 32),
        WarmOp("save", "ef" * 32, {"hash": "ef" * 32, "parent": "cd" * 32, "start": "64", "tokens": "[5,6]"}),
        WarmOp("delete", "cd" * 32),
    ]
    plan = StepPlan(ops, StepWork(False, 7, 128, True), IDLE | STOP, "a reason")
    results, calls = run_group(3, plan, {})
    assert [p for p, _ in results] == [plan, plan, plan]
    assert calls.count(np.uint8) == 3  # the body's collective, on every rank


def test_a_plan_without_work_is_a_heartbeat():
    results, _ = run_group(2, StepPlan(flags=IDLE), {})
    assert results[1][0] == StepPlan([], None, IDLE, "")


def test_each_follower_reports_in_its_own_slots():
    statuses = {1: RankStatus(12, 1, 0, 4096), 2: RankStatus(3, 0, 1, 7)}
    results, _ = run_group(3, StepPlan([Ended(1)], StepWork(True, None, 256, False)), statuses)
    for _, reported in results:
        assert reported == [statuses[1], statuses[2]]


def test_one_process_answers_every_call_rank_0_makes_and_does_nothing():
    """NO_RECORDER stands in for the Recorder wherever the engine calls it (size 1: today's path)."""
    wiring = {"attach", "flush", "pool_event", "deleted"}  # a Recorder's own: never called on NO_RECORDER
    for name, method in inspect.getmembers(Recorder, inspect.isfunction):
        if name.startswith("_") or name in wiring:
            continue
        assert inspect.signature(getattr(NO_RECORDER, name)) == inspect.signature(method.__get__(NO_RECORDER)), name
    ids = count()
    assert NO_RECORDER.sample_ids(None, ids) is ids
    sampler = object()
    assert NO_RECORDER.sampler(3, sampler) is sampler
    with NO_RECORDER.watching():
        pass
    assert NO_RECORDER.heartbeat_s is None and not NO_RECORDER.active

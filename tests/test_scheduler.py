"""The scheduler's follow-up rule, as a property over random arrivals: a client's request that
extends a follow-up (a settle, or a canonical reply) waits until that follow-up ends, and is
never planned before it; a request of its agent that goes another way supersedes the waiting
follow-up; a follow-up never waits, so whatever arrives, is cancelled or has its agent deleted,
the queue always drains (no deadlock)."""

from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st

from agent_memory.agent_key import AgentKey
from agent_memory.engine.requests import GenerationRequest, SamplingParams
from agent_memory.engine.scheduler import Scheduler, blocked, extends
from agent_memory.engine.sequence import Sequence, Status

AGENTS = [AgentKey("a"), AgentKey("b")]
OPS = st.lists(
    st.one_of(
        st.tuples(st.just("request"), st.integers(0, 3), st.booleans()),  # agent, whose latest prompt it extends
        st.tuples(st.just("follow_up"), st.integers(0, 1), st.booleans()),
        st.tuples(st.just("plan"), st.integers(0, 0), st.booleans()),
        st.tuples(st.just("end"), st.integers(0, 30), st.booleans()),  # a prefill ends, or is cancelled
        st.tuples(st.just("delete"), st.integers(0, 1), st.booleans()),  # the agent is deleted
    ),
    max_size=40,
)


class Queue:
    """The engine's sequences as core.py moves them, for the scheduler's decisions alone."""

    def __init__(self) -> None:
        self.scheduler = Scheduler()
        self.seqs: dict[int, Sequence] = {}
        self.next_id = 0
        self.last: dict[AgentKey, list[int]] = {}  # each agent's latest prompt

    def add(self, agent: AgentKey | None, prompt: list[int], prefill_only: bool) -> Sequence:
        params = SamplingParams(max_tokens=0 if prefill_only else 8)
        request = GenerationRequest(prompt=prompt, params=params, agent=agent, prefill_only=prefill_only)
        seq = Sequence(self.next_id, request, None, float(self.next_id), None, agent, None, prefill_only=prefill_only)
        self.next_id += 1
        for queued in self.scheduler.superseded(self.seqs.values(), seq):  # as core.admit does
            self.seqs.pop(queued.id)
        self.seqs[seq.id] = seq
        if agent is not None:
            self.last[agent] = prompt
        return seq

    def order(self) -> list[Sequence]:
        return self.scheduler.planning_order(self.seqs.values(), float(self.next_id))

    def awaited(self, follow_up: Sequence) -> bool:
        """Whether a waiting request extends the follow-up."""
        return any(
            s.status is Status.WAITING and not s.prefill_only and extends(s, follow_up) for s in self.seqs.values()
        )

    def check(self) -> None:
        seqs = list(self.seqs.values())
        order = self.order()
        for seq in order:  # never planned before a follow-up it extends
            assert not blocked(seq, seqs)
        for seq in (s for s in seqs if s.status is Status.WAITING and blocked(s, seqs)):
            follow_ups = [f for f in seqs if f.prefill_only and extends(seq, f)]
            assert all(f.status is Status.PREFILLING or f in order for f in follow_ups)  # each can run now
        awaited = [i for i, s in enumerate(order) if s.prefill_only and self.awaited(s)]
        idle = [i for i, s in enumerate(order) if s.prefill_only and not self.awaited(s)]
        assert all(i < j for i in awaited for j in idle)  # awaited follow-ups go before idle ones
        waiting = any(s.status is Status.WAITING for s in seqs)
        prefilling = any(s.status is Status.PREFILLING for s in seqs)
        assert order or not waiting or prefilling  # something can always move

    def drain(self) -> None:
        """Plan and end everything: it ends within as many rounds as there are sequences."""
        for _ in range(2 * len(self.seqs) + 1):
            for seq in [s for s in self.seqs.values() if s.status is Status.PREFILLING]:
                self.seqs.pop(seq.id)
            for seq in self.order()[:1]:
                seq.status = Status.PREFILLING
            self.check()
        assert not self.seqs


@settings(max_examples=200, deadline=None)
@given(OPS)
def test_a_request_waits_for_the_follow_up_it_extends_and_the_queue_always_drains(ops):
    queue = Queue()
    for op, n, flag in ops:
        if op == "request":  # its agent's next turn, another agent's (a stored response's chain), or new
            agent, source = AGENTS[n % 2], AGENTS[n // 2]
            base = queue.last.get(source, [n]) if flag else [n, 100 + queue.next_id]
            queue.add(agent, base + [200 + queue.next_id], prefill_only=False)
        elif op == "follow_up":
            agent = AGENTS[n]
            queue.add(agent, queue.last.get(agent, [n]) + [300 + queue.next_id], prefill_only=True)
        elif op == "plan":
            for seq in queue.order()[:1]:
                seq.status = Status.PREFILLING
        elif op == "end":
            ids = sorted(queue.seqs)
            if ids:
                queue.seqs.pop(ids[n % len(ids)])
        else:
            for seq in queue.seqs.values():
                if seq.agent == AGENTS[n]:
                    seq.agent = None
        queue.check()
    queue.drain()


def test_a_tool_loop_turn_waits_for_its_settle_and_another_way_supersedes_it():
    queue = Queue()
    settle = queue.add(AGENTS[0], [1, 2, 3], prefill_only=True)
    other = queue.add(AGENTS[1], [9, 9], prefill_only=False)
    turn = queue.add(AGENTS[0], [1, 2, 3, 4], prefill_only=False)
    assert queue.order() == [settle, other]  # the awaited settle first, its turn after it
    settle.status = Status.PREFILLING
    assert queue.order() == [other]
    queue.seqs.pop(settle.id)
    assert queue.order() == [turn, other] or queue.order() == [other, turn]
    late = queue.add(AGENTS[0], [1, 2, 3, 4, 5], prefill_only=True)
    rewrite = queue.add(AGENTS[0], [7, 7, 7], prefill_only=False)  # goes another way: the follow-up goes
    assert late.id not in queue.seqs and rewrite.id in queue.seqs

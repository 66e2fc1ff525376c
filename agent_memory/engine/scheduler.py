"""Scheduling policy, and nothing else: which waiting request to plan next, how much to prefill
between two decode steps, and how many sequences decode together. No side effects: the engine
asks, then acts."""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass

from agent_memory.engine.sequence import Sequence, Status


@dataclass(frozen=True)
class Scheduler:
    max_batch: int = 32
    # Tokens prefilled per step, alone or between two decode steps (their inter-token delay).
    # Small chunks are also faster on a CPU: attention over a chunk materializes chunk x
    # context scores, and one 1,600-token chunk computes the masked half too (docs/benchmarks.md).
    chunk_tokens: int = 256
    # A request waiting this long to start its prefill goes first, however long its prompt.
    patience_s: float = 20.0

    def planning_order(self, seqs: Iterable[Sequence], now: float) -> list[Sequence]:
        """Waiting sequences, the one with the least new work first, so that a returning
        agent's short turn does not wait behind a newcomer's long prompt, unless that one
        has waited longer than the patience allows. Follow-ups (prefill only: the KV of a
        turn's end, which no client waits for) come after every request a client waits for,
        unless a request waits for one (`blocked`): that one comes first, and the request
        after it. A request the shared warm tier has not answered about yet
        (Sequence.discovery) is not planned until it has."""
        seqs = list(seqs)
        follow_ups = [s for s in seqs if s.prefill_only and s.status in (Status.WAITING, Status.PREFILLING)]
        awaits = {s.id: _extended(s, follow_ups) for s in seqs if s.status is Status.WAITING}
        waiting = [
            s for s in seqs
            if s.status is Status.WAITING and (s.discovery is None or s.discovery.done()) and not awaits[s.id]
        ]
        awaited = {f.id for follow_ups in awaits.values() for f in follow_ups}

        def key(s: Sequence) -> tuple:
            return (s.prefill_only and s.id not in awaited, now - s.submitted < self.patience_s, s.new_tokens)

        return sorted(waiting, key=key)

    @staticmethod
    def anyone_waiting(seqs: Iterable[Sequence]) -> bool:
        """Whether a request's prefill has not ended (follow-ups, which nobody waits for, do not
        count): its client waits a step longer for every step before it, and a speculative
        step then verifies nothing (speculative_batch.py)."""
        return any(s.status in (Status.WAITING, Status.PREFILLING) and not s.prefill_only for s in seqs)

    @staticmethod
    def superseded(seqs: Iterable[Sequence], seq: Sequence) -> list[Sequence]:
        """The follow-ups of `seq`'s agent not started yet that its prompt does not extend: it
        goes another way (and a follow-up ending after it would point the agent back at the old
        turn). One it extends stays, and `seq` waits for it (`blocked`): a tool loop's next
        request arrives within milliseconds of the turn's end, before its follow-up has run."""
        return [
            s for s in seqs
            if s.prefill_only and s.status is Status.WAITING and seq.agent and s.agent == seq.agent
            and not extends(seq, s)
        ]

    def ready_to_prefill(self, seqs: Iterable[Sequence]) -> Sequence | None:
        """The first planned sequence whose disk reads are done."""
        return next((s for s in seqs if s.ready()), None)

    def may_prefill(self, decoding: int) -> bool:
        """A prefill ends by joining the batch: only while it has room."""
        return decoding < self.max_batch

    @staticmethod
    def fits(
        seqs: Iterable[Sequence], seq: Sequence, bytes_per_token: int, budget: int | None, state_bytes: int = 0
    ) -> bool:
        """Whether running sequences' working caches stay within `budget` bytes once `seq`
        starts. A batch pads every row to the longest, so it holds rows × longest tokens, and
        each row its window and recurrent layers' state (`state_bytes`, whatever its length).
        A sequence alone always fits (nothing else could make room), and one that has started
        already holds its memory."""
        if budget is None or seq.pos:
            return True
        running = [
            len(s.prompt) + s.generation.usage.completion_tokens
            for s in seqs
            if s.status is Status.DECODING or (s.status is Status.PREFILLING and s.pos)
        ]
        if not running:
            return True
        return (len(running) + 1) * (max(*running, len(seq.prompt)) * bytes_per_token + state_bytes) <= budget


def extends(seq: Sequence, follow_up: Sequence) -> bool:
    """Whether `seq`'s prompt begins with all of the follow-up's tokens."""
    n = len(follow_up.prompt)
    return len(seq.prompt) >= n and seq.prompt[:n] == follow_up.prompt


def _extended(seq: Sequence, seqs: list[Sequence]) -> list[Sequence]:
    """The running follow-ups in `seq`'s namespace whose every token `seq` (a client's request)
    extends: the settle or canonical reply of the turn it continues, its agent's or another's (a
    stored response's chain names each response an agent of its own)."""
    if seq.prefill_only:
        return []
    return [
        f for f in seqs
        if f.prefill_only and f.root == seq.root and f.status in (Status.WAITING, Status.PREFILLING)
        and extends(seq, f)
    ]


def blocked(seq: Sequence, seqs: list[Sequence]) -> bool:
    """A client's request waits while a follow-up it extends has not ended: that follow-up
    computes the start of its prompt, and once committed the request reuses all of it. A
    follow-up never waits, and one that ends (done, cancelled, failed) releases the wait, so
    no wait lasts longer than a follow-up's prefill."""
    return bool(_extended(seq, seqs))

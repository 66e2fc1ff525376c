"""Prompt lookup: a sequence's next tokens proposed from its own history.

An agent's output repeats what it has seen (a file rewritten with a line changed, code quoted in
a search/replace block, a path from a tool result), and its whole history is in its token ids.
The proposal is what followed the latest earlier occurrence of the sequence's last NGRAM tokens
(or, failing that, its last token pair). Each sequence adapts on its own: the proposal grows
while it is accepted whole and shrinks to what was accepted, and after MISSES proposals in a row
that were all rejected, it stops proposing for a while (twice as long each time) rather than
make every step verify tokens that do not pay.
"""

from __future__ import annotations

from dataclasses import dataclass

from agent_memory.engine.speculation.verify_width import Acceptance

NGRAMS = (3, 2)  # n-gram sizes matched, longest first
FIRST = 4  # tokens proposed at first
MOST = 16  # tokens proposed at most
MISSES = 3  # proposals all rejected in a row before a pause
LONGEST_PAUSE = 64  # steps


class Backoff:
    """Proposing pauses after MISSES proposals in a row that were all refused: 4 steps, twice as
    long at each pause after (at most LONGEST_PAUSE), back to 4 once one is accepted. Lookup's
    per sequence, the draft's (draft.py) for the batch."""

    def __init__(self) -> None:
        self.misses = 0
        self.left = 0  # steps left without proposing
        self.length = 4

    def paused(self) -> bool:
        """Whether this step proposes nothing (a step of the pause spent)."""
        if self.left:
            self.left -= 1
            return True
        return False

    def verified(self, accepted: bool) -> None:
        """A proposal was verified: was any of it accepted?"""
        self.misses = 0 if accepted else self.misses + 1
        if self.misses >= MISSES:
            self.left, self.length, self.misses = self.length, min(2 * self.length, LONGEST_PAUSE), 0
        elif accepted:
            self.length = 4


class Lookup:
    def __init__(self, history: list[int]) -> None:
        self.history: list[int] = []
        self.seen: dict[tuple[int, ...], int] = {}  # n-gram -> where the token after its latest occurrence is
        self.length = FIRST
        self.backoff = Backoff()
        self.acceptance = Acceptance()
        self.extend(history)

    def extend(self, tokens: list[int]) -> None:
        """The history grows by `tokens`; index the n-grams ending before its last token."""
        h = self.history
        for token in tokens:
            h.append(token)
            for n in NGRAMS:
                if len(h) > n:
                    self.seen[tuple(h[-n - 1 : -1])] = len(h) - 1

    def propose(self, limit: int) -> list[int]:
        """Up to `limit` tokens that may follow the history (none while paused)."""
        if self.backoff.paused():
            return []
        h = self.history
        for n in NGRAMS:
            at = self.seen.get(tuple(h[-n:])) if len(h) >= n else None
            if at is not None:
                return h[at : at + min(self.length, limit)]
        return []

    def verified(self, proposed: int, accepted: int) -> None:
        """Adapt to how much of a proposal the model accepted."""
        self.acceptance.verified(proposed, accepted)
        if proposed == 0:
            return
        if accepted == proposed:
            self.length = min(2 * self.length, MOST)
        else:
            self.length = max(accepted + 1, 2)
        self.backoff.verified(accepted > 0)


@dataclass
class Settled:
    """A sequence's step, as its proposer learns it: the token it fed, the proposals verified
    after it, how many the model accepted, and the token it sampled after them (None: the
    sequence finished)."""

    seq_id: int
    fed: int
    proposed: list[int]
    accepted: int
    next: int | None


class Lookups:
    """The batch's proposer for --speculation lookup (speculative_batch.py): each sequence's
    own `Lookup`. The draft proposer (draft.py) has the same methods."""

    def __init__(self) -> None:
        self.of: dict[int, Lookup] = {}

    def add(self, seq_id: int, prompt: list[int]) -> None:
        self.of[seq_id] = Lookup(prompt)

    def propose(self, rows: list[tuple[int, int, int]]) -> list[list[int]]:
        """For each (seq id, token it feeds, most tokens it may take): its proposal."""
        return [self.of[s].propose(limit) if limit > 0 else [] for s, _, limit in rows]

    def rate(self, seq_id: int) -> float:
        return self.of[seq_id].acceptance.rate

    def settle(self, steps: list[Settled]) -> None:
        for s in steps:
            lookup = self.of[s.seq_id]
            lookup.verified(len(s.proposed), s.accepted)
            if s.next is not None:
                lookup.extend([*s.proposed[: s.accepted], s.next])

    def keep(self, seq_ids: list[int]) -> None:
        self.of = {s: self.of[s] for s in seq_ids}

    def reset(self) -> None:
        self.of = {}

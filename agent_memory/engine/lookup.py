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

NGRAMS = (3, 2)  # n-gram sizes matched, longest first
FIRST = 4  # tokens proposed at first
MOST = 16  # tokens proposed at most
MISSES = 3  # proposals all rejected in a row before a pause
LONGEST_PAUSE = 64  # steps


class Lookup:
    def __init__(self, history: list[int]) -> None:
        self.history: list[int] = []
        self.seen: dict[tuple[int, ...], int] = {}  # n-gram -> where the token after its latest occurrence is
        self.length = FIRST
        self.misses = 0
        self.pause = 0  # steps left without proposing
        self.pause_length = 4
        self.accepted, self.refused = 1.0, 1.0  # recent proposals' tokens accepted, refusals (a prior of 1/2)
        self.extend(history)

    @property
    def rate(self) -> float:
        """How likely its next proposed token is accepted, from its recent proposals."""
        return self.accepted / (self.accepted + self.refused)

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
        if self.pause:
            self.pause -= 1
            return []
        h = self.history
        for n in NGRAMS:
            at = self.seen.get(tuple(h[-n:])) if len(h) >= n else None
            if at is not None:
                return h[at : at + min(self.length, limit)]
        return []

    def verified(self, proposed: int, accepted: int) -> None:
        """Adapt to how much of a proposal the model accepted."""
        if proposed == 0:
            return
        self.accepted = 0.9 * self.accepted + accepted
        self.refused = 0.9 * self.refused + (accepted < proposed)
        if accepted == proposed:
            self.length = min(2 * self.length, MOST)
        else:
            self.length = max(accepted + 1, 2)
        self.misses = self.misses + 1 if accepted == 0 else 0
        if self.misses >= MISSES:
            self.pause, self.pause_length = self.pause_length, min(2 * self.pause_length, LONGEST_PAUSE)
            self.misses = 0
        elif accepted:
            self.pause_length = 4

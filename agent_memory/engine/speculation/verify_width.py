"""How many positions per sequence a speculative step verifies: as many as pay, on this machine.

Every sequence in the batch computes as many positions as the longest proposal (plus its own
token). On a GPU, memory-bound, that costs about one decode step; on a CPU, compute-bound once
the batch's positions pass a dozen or so, each position costs. So the step time is learnt from
the steps run, as `fixed + per_position x positions` (least squares, recent steps weighing
most), and each step verifies the width that maximizes expected tokens per second: each
sequence's expected accepted run given its acceptance rate, over the predicted step time.
(While a client waits for its first token the step verifies nothing at all: speculative_batch.py.)
"""

from __future__ import annotations

DECAY = 0.97  # weight of the past per observed step


class Acceptance:
    """How likely a sequence's next proposed token is accepted: tokens accepted over tokens
    accepted plus proposals refused, recent proposals weighing most (0.9 a proposal), with the
    prior of one accepted token. The prior is optimistic on purpose: a sequence's proposals get
    verified until they are seen refused (a rate that is never verified is never learnt), and
    again once a while without verifying (0.95 a step) has let the prior win back."""

    def __init__(self) -> None:
        self.accepted = self.refused = 0.0

    @property
    def rate(self) -> float:
        return (self.accepted + 1) / (self.accepted + self.refused + 1)

    def verified(self, proposed: int, accepted: int) -> None:
        if not proposed:
            self.accepted, self.refused = 0.95 * self.accepted, 0.95 * self.refused
            return
        self.accepted = 0.9 * self.accepted + accepted
        self.refused = 0.9 * self.refused + (accepted < proposed)


class VerifyWidth:
    def __init__(self) -> None:
        self.sums = [0.0] * 5  # weighted n, P, P^2, t, P*t over recent steps

    def observe(self, positions: int, seconds: float) -> None:
        p, t = float(positions), seconds
        for i, v in enumerate((1.0, p, p * p, t, p * t)):
            self.sums[i] = self.sums[i] * DECAY + v

    def cost(self) -> tuple[float, float] | None:
        """(fixed seconds, seconds per position), once the steps seen tell them apart."""
        n, sp, spp, st, spt = self.sums
        spread = n * spp - sp * sp
        if n < 4 or spread < n * n:  # positions hardly varied lately (a variance under 1)
            return None
        per = max((n * spt - sp * st) / spread, 0.0)
        return max((st - per * sp) / n, 1e-6), per

    def choose(self, lengths: list[int], rates: list[float]) -> int:
        """The width (1 + proposals verified per sequence) for sequences proposing `lengths`
        tokens, each accepting a proposal with probability `rates[i]` (until one is refused)."""
        widest = 1 + max(lengths)
        cost = self.cost()
        if cost is None or widest == 1:  # nothing learnt yet: try them all, and learn
            return widest
        fixed, per = cost
        rows = len(lengths)

        def rate(width: int) -> float:
            tokens = sum(1 + sum(r**j for j in range(1, min(width - 1, n) + 1)) for n, r in zip(lengths, rates))
            return tokens / (fixed + per * rows * width)

        return max(range(1, widest + 1), key=rate)

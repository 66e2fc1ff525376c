"""Repetition penalties as one mlx-lm logits processor per sequence.

OpenAI's `frequency_penalty` and `presence_penalty` (-2..2) subtract from a token's logit
`frequency * count + presence * (count > 0)`, its count in the tokens generated so far (the
prompt does not count; vLLM the same). vLLM's `repetition_penalty` (> 0) divides a positive
logit of a token seen in the prompt or the output by it, and multiplies a negative one. mlx-lm's
own processors (sample_utils.make_*_penalty) count the last 20 tokens of the context, the
prompt's included: another definition, so these are ours, against its processor interface.

The counts are an immutable MLX array: `save` is a reference, which speculation (speculative_batch.py)
takes after each verified position and goes back to when proposals are refused, so a
penalty sees exactly the tokens before its position, as it does without proposals.
"""

from __future__ import annotations

import agent_memory.blas  # noqa: F401
import mlx.core as mx
import numpy as np


class Penalties:
    def __init__(
        self, prompt: list[int], vocab_size: int, frequency: float, presence: float, repetition: float
    ) -> None:
        self.frequency = frequency
        self.presence = presence
        self.repetition = repetition
        self.counts = mx.zeros((vocab_size,), dtype=mx.float32)  # each token's count in the output
        self.prompt: mx.array | None = None  # the prompt's tokens, for the repetition penalty
        if repetition != 1.0:
            seen = np.zeros(vocab_size, dtype=np.bool_)
            seen[[t for t in prompt if 0 <= t < vocab_size]] = True
            self.prompt = mx.array(seen)
        self.first = True  # the first call's context is the prompt: nothing generated yet

    def __call__(self, context: mx.array, logits: mx.array) -> mx.array:
        if self.first:
            self.first = False
        else:
            self.counts = self.counts.at[context[-1:]].add(1.0)
        out = logits.astype(mx.float32)
        if self.prompt is not None:
            seen = self.prompt | (self.counts > 0)
            out = mx.where(seen, mx.where(out < 0, out * self.repetition, out / self.repetition), out)
        if self.frequency:
            out = out - self.frequency * self.counts
        if self.presence:
            out = out - self.presence * (self.counts > 0)
        return out.astype(logits.dtype)

    def save(self) -> tuple[bool, mx.array]:
        return self.first, self.counts

    def restore(self, saved: tuple[bool, mx.array]) -> None:
        self.first, self.counts = saved


def penalties(prompt: list[int], vocab_size: int, frequency: float, presence: float, repetition: float) -> list:
    """The sequence's penalty processor, or none when every penalty is off."""
    if not frequency and not presence and repetition == 1.0:
        return []
    return [Penalties(prompt, vocab_size, frequency, presence, repetition)]

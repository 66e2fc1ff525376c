"""Tokens in the graph: rank 0's sampled tokens reach the other ranks inside the step's forward.

Rank 0's sampler returns `all_sum(sample(logprobs))`, a follower's `all_sum(argmax(logprobs) * 0)`:
the follower adds zeros and gets rank 0's token, without a host round trip, so mlx-lm's
`GenerationBatch` keeps its pipelining and every rank issues its collectives in one order. The
follower's zeros depend on the logprobs, which orders its token's collective after the
forward's. Logits processors (penalties, a grammar's mask) run on rank 0 only. Every sequence
gets its own wrapped sampler on every rank, so `GenerationBatch` samples row by row everywhere
alike: one token `all_sum` a row (a batch sharing one sampler object would make one for all,
on that rank only).
"""

from __future__ import annotations

from collections.abc import Callable

import agent_memory.blas  # noqa: F401
import mlx.core as mx

Sum = Callable[[mx.array], mx.array]  # the group's all_sum for one sequence's tokens


def leading(sampler: Callable[[mx.array], mx.array], token_sum: Sum) -> Callable[[mx.array], mx.array]:
    """Rank 0's sampler: its choice, sent to every rank."""
    return lambda logprobs: token_sum(sampler(logprobs))


def following(token_sum: Sum) -> Callable[[mx.array], mx.array]:
    """A follower's sampler: rank 0's choice, received."""
    return lambda logprobs: token_sum(mx.argmax(logprobs, axis=-1) * 0)

"""Token logprobs as the API reports them (`logprobs`, `top_logprobs`).

A token's logprob is read from the distribution its batch computed for sampling: the model's
logits after the sequence's logits processors (logit bias, penalties, the grammar's mask) and
before temperature, top-k and top-p — what mlx-lm's batch normalizes anyway, so it costs one
gather, and the greedy token is always the likeliest reported. (vLLM's default is the raw model
distribution, before processors; ours says what the penalties and the grammar did.) A token
the processors ruled out has logprob -inf, written as OpenAI writes it: -9999.0.
"""

from __future__ import annotations

import math

import agent_memory.blas  # noqa: F401
import mlx.core as mx

from agent_memory.engine.requests import TokenLogprob

RULED_OUT = -9999.0


def _finite(x: float) -> float:
    return x if math.isfinite(x) else RULED_OUT


def token_logprobs(rows: mx.array, tokens: list[int], tops: list[int]) -> list[TokenLogprob]:
    """rows (m, V): normalized logprobs; each row's `tokens[i]` logprob and its `tops[i]`
    likeliest tokens, in one evaluation."""
    if not tokens:
        return []
    chosen = mx.take_along_axis(rows, mx.array(tokens)[:, None], axis=-1)[:, 0].astype(mx.float32)
    k = max(tops)
    if k:
        ids = mx.argpartition(-rows, kth=k - 1, axis=-1)[:, :k]
        values = mx.take_along_axis(rows, ids, axis=-1).astype(mx.float32)
        mx.eval(chosen, ids, values)
        ids, values = ids.tolist(), values.tolist()
    else:
        mx.eval(chosen)
    out = []
    for i, (token, logprob) in enumerate(zip(tokens, chosen.tolist())):
        top = sorted(zip(ids[i], values[i]), key=lambda p: -p[1])[: tops[i]] if k else []
        out.append(TokenLogprob(token, _finite(logprob), [(t, _finite(v)) for t, v in top]))
    return out

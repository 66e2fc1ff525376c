"""Per-request samplers: each seeded request owns its PRNG key, so its tokens do not depend
on which other requests share the batch.

Any integer is a seed: MLX keys take 0 <= seed < 2**64, so a seed is taken modulo 2**64, and a
negative one means "no seed" (a fresh random key), as llama.cpp and the clients that send -1
intend (docs/usage.md)."""

import secrets

import agent_memory.blas  # noqa: F401
import mlx.core as mx
from mlx_lm.sample_utils import apply_top_k, apply_top_p, greedy_sampler


class SeededSampler:
    """Temperature, top-k and nucleus sampling from a key that only this request advances."""

    def __init__(self, temperature: float, top_p: float, seed: int | None, top_k: int = 0) -> None:
        self.inv_temperature = 1.0 / temperature
        self.top_p = top_p
        self.top_k = top_k
        self.key = mx.random.key(secrets.randbits(64) if seed is None or seed < 0 else seed % 2**64)

    def __call__(self, logprobs: mx.array) -> mx.array:
        logits = logprobs * self.inv_temperature
        if 0 < self.top_k < logits.shape[-1]:
            logits = apply_top_k(logits, self.top_k)
        if 0.0 < self.top_p < 1.0:
            logits = apply_top_p(logits - mx.logsumexp(logits, axis=-1, keepdims=True), self.top_p)
        self.key, step_key = mx.random.split(self.key)
        return mx.random.categorical(logits, key=step_key)


def make_sampler(temperature: float, top_p: float, seed: int | None, top_k: int = 0):
    if temperature <= 0.0 or top_k == 1:
        return greedy_sampler
    return SeededSampler(temperature, top_p, seed, top_k)

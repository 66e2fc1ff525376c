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
        self.key, step_key = mx.random.split(self.key)
        return mx.random.categorical(self._logits(logprobs), key=step_key)

    def verify(self, logprobs: mx.array, proposed: list[int]) -> list[int]:
        """Each position sampled as `__call__` would sample it, with the key it would have had
        without proposals, until a sample differs from the proposal there (see `verify`)."""
        logits = self._logits(logprobs)
        out: list[int] = []
        for j in range(len(proposed) + 1):
            self.key, step_key = mx.random.split(self.key)
            out.append(mx.random.categorical(logits[j : j + 1], key=step_key).item())
            if j == len(proposed) or out[-1] != proposed[j]:
                return out
        return out

    def _logits(self, logprobs: mx.array) -> mx.array:
        logits = logprobs * self.inv_temperature
        if 0 < self.top_k < logits.shape[-1]:
            logits = apply_top_k(logits, self.top_k)
        if 0.0 < self.top_p < 1.0:
            logits = apply_top_p(logits - mx.logsumexp(logits, axis=-1, keepdims=True), self.top_p)
        return logits


def make_sampler(temperature: float, top_p: float, seed: int | None, top_k: int = 0):
    if temperature <= 0.0 or top_k == 1:
        return greedy_sampler
    return SeededSampler(temperature, top_p, seed, top_k)


def verify(sampler, logprobs: mx.array, proposed: list[int]) -> list[int]:
    """Check proposed tokens against the model's distributions after each of them: the
    proposals it accepts, then the token it samples where the first was refused (or after the
    last). `logprobs` (len(proposed) + 1, V): the distribution for each proposal's position,
    then the next. Greedy: a proposal is accepted where it is the argmax. Sampling: a proposal is
    accepted where the request's own sample at that position, drawn with the key it would have
    had without speculation, is that token. That is the standard rejection rule for a proposal
    from a point mass (accepted with its probability; otherwise the sample, which then excludes
    it), coupled to the sampler's keys: a seeded request's output is the one it has without
    speculation, whatever was proposed and whoever shares the batch."""
    if not isinstance(sampler, SeededSampler):
        return accept_greedy(sampler(logprobs).tolist(), proposed)
    return sampler.verify(logprobs, proposed)


def accept_greedy(best: list[int], proposed: list[int]) -> list[int]:
    """Greedy verification from the argmax at each position (`best`): the proposals equal to
    it, then the argmax after them."""
    n = next((i for i, (p, b) in enumerate(zip(proposed, best)) if p != b), len(proposed))
    return best[: n + 1]

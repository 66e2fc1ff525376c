"""The recurrent kind: layers whose whole past is a fixed-size state (mlx-lm's `ArraysCache`:
Mamba's convolution and SSM states, gated delta-net's, LFM2's short convolutions). The state
after a prefix cannot be cut back to an earlier position, so it is kept as a snapshot at chosen
positions (layers.py), never quantized."""

from __future__ import annotations

import agent_memory.blas  # noqa: F401
import mlx.core as mx
from mlx_lm.models.cache import ArraysCache

name = "recurrent"
cache_classes = (ArraysCache,)
snapshot = True
joins = True


def batched(cache: ArraysCache) -> object:
    """A sequence's layer as a batch of one, by mlx-lm's own merge (into itself)."""
    return cache.merge([cache])


def take(cache: ArraysCache) -> tuple[list[mx.array], list[int]]:
    """Every array of the state (copies: the layer replaces them as it runs); (their count)."""
    arrays = cache.state[0]
    if any(a is None for a in arrays):
        raise ValueError("a recurrent state with an unset array cannot be snapshotted")
    return [mx.contiguous(a) for a in arrays], [len(arrays)]


def restore(arrays: list[mx.array], meta: list[int]) -> ArraysCache:
    cache = ArraysCache(meta[0])
    cache.state = (list(arrays), None, None)
    return cache


def layout(probed: ArraysCache, position: int) -> list[tuple[mx.Dtype, tuple[int, ...]]]:
    """The arrays a snapshot holds (the same at every position), from a cache that has seen one token."""
    return [(a.dtype, tuple(a.shape)) for a in probed.state[0]]

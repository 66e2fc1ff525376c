"""The sliding-window kind: layers that attend to the last W tokens only (mlx-lm's
`RotatingKVCache`). What they hold at a position is a state: the window's KV, in the order
the tokens came, kept as a snapshot at chosen positions (layers.py) rather than in blocks,
since a finished sequence's rotating cache no longer holds the older tokens' KV."""

from __future__ import annotations

import agent_memory.blas  # noqa: F401
import mlx.core as mx
from mlx_lm.models.cache import RotatingKVCache

name = "window"
cache_classes = (RotatingKVCache,)
snapshot = True
joins = True


def batched(cache: RotatingKVCache) -> object:
    """A sequence's layer as a batch of one, by mlx-lm's own merge (mlx-lm's `BatchRotatingKVCache`)."""
    return cache.merge([cache])


def _in_order(v: mx.array, offset: int, keep: int, idx: int) -> mx.array:
    """The cache's rows in the order their tokens came (a rotating buffer wraps at `idx`), from its
    public `state` (mlx-lm's own reordering is private)."""
    if idx == v.shape[2]:
        return v
    if idx < offset:
        return mx.concatenate([v[..., :keep, :], v[..., idx:, :], v[..., keep:idx, :]], axis=2)
    return v[..., :idx, :]


def kept_tokens(position: int, max_size: int) -> int:
    """How many tokens' KV a window holds at a position: all it ever attends to again."""
    return min(position, max_size)


def take(cache: RotatingKVCache) -> tuple[list[mx.array], list[int]]:
    """The window at the cache's position: the last `max_size` tokens' KV (the first `keep`
    always among them), in order; and (offset, keep, max_size)."""
    keys, values, offset, keep, max_size, idx = cache.state
    n = kept_tokens(offset, max_size)
    out = []
    for v in (keys, values):
        v = _in_order(v, offset, keep, idx)
        if v.shape[2] > n:
            v = mx.concatenate([v[..., :keep, :], v[..., v.shape[2] - (n - keep) :, :]], axis=2)
        out.append(mx.contiguous(v))
    return out, [offset, keep, max_size]


def restore(arrays: list[mx.array], meta: list[int]) -> RotatingKVCache:
    """A rotating cache as a prefill that ended at the snapshot's position leaves one."""
    keys, values = arrays
    offset, keep, max_size = meta
    cache = RotatingKVCache(max_size, keep)
    cache.state = (keys, values, offset, keep, max_size, keys.shape[2])
    return cache


def layout(probed: RotatingKVCache, position: int) -> list[tuple[mx.Dtype, tuple[int, ...]]]:
    """The arrays a snapshot at `position` holds, from a cache that has seen one token."""
    keys, values, _, _, max_size, _ = probed.state
    n = kept_tokens(position, max_size)
    return [
        (keys.dtype, (1, keys.shape[1], n, keys.shape[3])),
        (values.dtype, (1, values.shape[1], n, values.shape[3])),
    ]

"""The chunked-attention kind: layers that attend only within fixed chunks of positions (mlx-lm's
`ChunkedKVCache`: Llama 4's local layers, three of every four; the fourth keeps a `KVCache`).

What to keep. Such a cache drops the KV before its last `chunk_size` tokens at every forward
pass (`maybe_trim_front`), so a finished sequence's cache no longer holds the older tokens' KV
and cannot be cut into blocks after the fact, as a window's cannot: it is kept like a window, as
a snapshot at a position P of the last min(P, chunk_size) tokens' KV, which always holds the
chunk P falls in (all a later token attends to; the model masks the rest by position, from the
cache's `start_position`). Its size follows from P alone, so the warm tier knows a snapshot
file's layout from its position.

How it decodes. mlx-lm has no batch form of this cache, and Llama 4's model builds the chunk
mask from the first cache's scalar `offset` and `start_position`, so rows at different positions
cannot share a forward pass: each such sequence decodes alone, in a batch of one, every layer's
cache as it is (engine/batch/alone.py).
"""

from __future__ import annotations

import agent_memory.blas  # noqa: F401
import mlx.core as mx
from mlx_lm.models.cache import ChunkedKVCache

name = "chunked"
cache_classes = (ChunkedKVCache,)
snapshot = True
joins = False
batched = None  # it never joins others: registry.batched keeps a sequence with it alone


def kept_tokens(position: int, chunk_size: int) -> int:
    """How many tokens' KV a snapshot at a position holds: the chunk it is in, and at most a chunk."""
    return min(position, chunk_size)


def take(cache: ChunkedKVCache) -> tuple[list[mx.array], list[int]]:
    """The last `kept_tokens` tokens' KV (the cache holds at least as many: it trims to a whole
    chunk only), and (offset, chunk_size)."""
    keys, values, offset, chunk_size, start = cache.state
    n = kept_tokens(offset, chunk_size)
    held = offset - start
    return [mx.contiguous(a[..., held - n : held, :]) for a in (keys, values)], [offset, chunk_size]


def restore(arrays: list[mx.array], meta: list[int]) -> ChunkedKVCache:
    keys, values = arrays
    offset, chunk_size = meta
    cache = ChunkedKVCache(chunk_size)
    cache.state = (keys, values, offset, chunk_size, offset - keys.shape[2])
    return cache


def layout(probed: ChunkedKVCache, position: int) -> list[tuple[mx.Dtype, tuple[int, ...]]]:
    keys, values, _, chunk_size, _ = probed.state
    n = kept_tokens(position, chunk_size)
    return [
        (keys.dtype, (1, keys.shape[1], n, keys.shape[3])),
        (values.dtype, (1, values.shape[1], n, values.shape[3])),
    ]

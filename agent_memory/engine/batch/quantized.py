"""BatchQuantizedKVCache: several sequences' Q4/Q8 KV decoding together.

mlx-lm batches only float KV (BatchKVCache) and quantizes only single sequences
(QuantizedKVCache). This is the two together: sequences are left-padded to a common length
like BatchKVCache, and keys/values are kept as the (packed, scales, biases) triples that
mlx-lm's attention reads through `quantized_scaled_dot_product_attention` whenever the cache
has `bits`. Padding is masked out, so each row attends to exactly its own tokens.
"""

from __future__ import annotations

import agent_memory.blas  # noqa: F401
import mlx.core as mx
from mlx_lm.models.base import create_causal_mask
from mlx_lm.models.cache import QuantizedKVCache, _BaseCache

Triple = tuple[mx.array, mx.array, mx.array]


def _empty_triple(b: int, heads: int, length: int, dim: int, dtype, group_size: int, bits: int) -> Triple:
    return (
        mx.zeros((b, heads, length, dim * bits // 32), dtype=mx.uint32),
        mx.zeros((b, heads, length, dim // group_size), dtype=dtype),
        mx.zeros((b, heads, length, dim // group_size), dtype=dtype),
    )


def _pad(triple: Triple, left: int, right: int) -> Triple:
    if left == 0 and right == 0:
        return triple
    return tuple(mx.pad(a, [(0, 0), (0, 0), (left, right), (0, 0)]) for a in triple)


class BatchQuantizedKVCache(_BaseCache):
    """mlx-lm's cache interface (update_and_fetch, make_mask, filter, extend, extract, merge),
    so GenerationBatch batches it like its own BatchKVCache."""

    step = 256

    def __init__(self, left_padding: list[int], group_size: int, bits: int) -> None:
        self.keys: Triple | None = None
        self.values: Triple | None = None
        self.left_padding = mx.array(left_padding)
        self.offset = mx.array([-p for p in left_padding])
        self._idx = 0
        self.group_size = group_size
        self.bits = bits

    def update_and_fetch(self, keys: mx.array, values: mx.array):
        b, heads, n, k_dim = keys.shape
        prev = self._idx
        if self.keys is None or prev + n > self.keys[0].shape[2]:
            grow = (self.step + n - 1) // self.step * self.step
            new_k = _empty_triple(b, heads, grow, k_dim, keys.dtype, self.group_size, self.bits)
            new_v = _empty_triple(b, heads, grow, values.shape[-1], values.dtype, self.group_size, self.bits)
            if self.keys is None:
                self.keys, self.values = new_k, new_v
            else:
                self.keys = tuple(mx.concatenate([a[..., :prev, :], z], axis=2) for a, z in zip(self.keys, new_k))
                self.values = tuple(
                    mx.concatenate([a[..., :prev, :], z], axis=2) for a, z in zip(self.values, new_v)
                )
        self._idx += n
        self.offset = self.offset + n
        for stored, new in ((self.keys, keys), (self.values, values)):
            for part, q in zip(stored, mx.quantize(new, group_size=self.group_size, bits=self.bits)):
                part[..., prev : self._idx, :] = q
        return self.keys_and_values()

    def keys_and_values(self):
        return (
            tuple(a[..., : self._idx, :] for a in self.keys),
            tuple(a[..., : self._idx, :] for a in self.values),
        )

    def make_mask(self, N: int, return_array: bool = False, **kwargs):
        return create_causal_mask(N, offset=self._idx, left_padding=self.left_padding, **kwargs)

    @property
    def state(self):
        return self.keys, self.values, self.offset, self.left_padding

    @state.setter
    def state(self, v):
        self.keys, self.values, self.offset, self.left_padding = v
        self._idx = self.keys[0].shape[2] if self.keys is not None else 0

    def filter(self, batch_indices: list[int]) -> None:
        """Keep only the given rows, then drop the left padding they all share."""
        index = mx.array(batch_indices)
        if self.keys is not None:
            self.keys = tuple(a[index] for a in self.keys)
            self.values = tuple(a[index] for a in self.values)
        self.offset = self.offset[index]
        self.left_padding = self.left_padding[index]
        shared = min(self.left_padding.tolist())
        if shared > 0:
            if self.keys is not None:
                self.keys = tuple(a[..., shared:, :] for a in self.keys)
                self.values = tuple(a[..., shared:, :] for a in self.values)
            self._idx -= shared
            self.left_padding = self.left_padding - shared

    def extend(self, other: "BatchQuantizedKVCache") -> None:
        """Append other's rows, right-aligning both on the last written position."""
        if self.keys is None and other.keys is None:
            self.left_padding = mx.concatenate([self.left_padding, other.left_padding])
            self.offset = mx.concatenate([self.offset, other.offset])
            return
        idx = max(self._idx, other._idx)
        size = max(c.keys[0].shape[2] for c in (self, other) if c.keys is not None)
        ref = self if self.keys is not None else other

        def aligned(c: "BatchQuantizedKVCache"):
            if c.keys is None:
                rows = c.offset.shape[0]
                k = tuple(mx.zeros((rows, *a.shape[1:2], 0, a.shape[3]), dtype=a.dtype) for a in ref.keys)
                v = tuple(mx.zeros((rows, *a.shape[1:2], 0, a.shape[3]), dtype=a.dtype) for a in ref.values)
            else:
                k, v = c.keys, c.values
            left = idx - c._idx
            right = size - k[0].shape[2] - left
            if right < 0:
                k = tuple(a[..., :right, :] for a in k)
                v = tuple(a[..., :right, :] for a in v)
                right = 0
            return _pad(k, left, right), _pad(v, left, right), c.left_padding + left

        (k1, v1, p1), (k2, v2, p2) = aligned(self), aligned(other)
        self.keys = tuple(mx.concatenate([a, b]) for a, b in zip(k1, k2))
        self.values = tuple(mx.concatenate([a, b]) for a, b in zip(v1, v2))
        self.left_padding = mx.concatenate([p1, p2])
        self.offset = mx.concatenate([self.offset, other.offset])
        self._idx = idx

    def extract(self, idx: int) -> QuantizedKVCache:
        """Row idx as a single-sequence cache: its own tokens, nothing of the padding."""
        padding = self.left_padding.tolist()[idx]
        cache = QuantizedKVCache(group_size=self.group_size, bits=self.bits)
        cache.keys = tuple(mx.contiguous(a[idx : idx + 1, :, padding : self._idx]) for a in self.keys)
        cache.values = tuple(mx.contiguous(a[idx : idx + 1, :, padding : self._idx]) for a in self.values)
        cache.offset = self._idx - padding
        return cache

    @classmethod
    def merge(cls, caches: list[QuantizedKVCache]) -> "BatchQuantizedKVCache":
        """Left-pad single-sequence quantized caches into one batch."""
        group_size, bits = caches[0].group_size, caches[0].bits
        lengths = [c.offset for c in caches]
        longest = max(lengths)
        batch = cls([longest - n for n in lengths], group_size, bits)
        if longest == 0:
            return batch
        ref = next(c for c in caches if c.offset)
        keys = tuple(mx.zeros((len(caches), a.shape[1], longest, a.shape[3]), dtype=a.dtype) for a in ref.keys)
        values = tuple(mx.zeros((len(caches), a.shape[1], longest, a.shape[3]), dtype=a.dtype) for a in ref.values)
        for i, c in enumerate(caches):
            if c.offset:
                pad = longest - c.offset
                for dst, src in zip(keys + values, c.keys + c.values):
                    dst[i : i + 1, :, pad:] = src[..., : c.offset, :]
        batch.keys, batch.values = keys, values
        batch.offset = batch.offset + longest
        batch._idx = longest
        return batch

    def size(self) -> int:
        return self._idx

    def empty(self) -> bool:
        return self.keys is None

    @property
    def nbytes(self) -> int:
        if self.keys is None:
            return 0
        return sum(a.nbytes for a in self.keys + self.values)

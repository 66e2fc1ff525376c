"""RaggedKVCache: a batch's KV from which each row drops its own number of last positions,
cheaply (speculative_batch.py, draft.py).

After a speculative step every row keeps a different number of the positions it verified.
mlx-lm's `BatchKVCache` drops them with its right-padding `prepare`/`finalize`, which rolls every
row's whole buffer (a gather of the batch's entire KV, every step): on a CPU that cost more than
the step it follows (0.25 s against 0.22 s for eight agents of 600 tokens). Here a dropped
position becomes a hole instead: masked out of attention, its row's offset (and so the positions
of its next tokens) back by one. Holes are squeezed out in one gather once the longest row has
more than HOLES of them, so attention never spans many. What a row holds, extracted, is its
tokens' KV alone, as from `BatchKVCache`. Layer 0's mask is every layer's (the models ask the
first cache), so every layer drops the same positions.
"""

from __future__ import annotations

import agent_memory.blas  # noqa: F401
import mlx.core as mx
from mlx_lm.models.cache import BatchKVCache, KVCache

HOLES = 128  # positions the longest row may carry as holes before they are squeezed out


class RaggedKVCache(BatchKVCache):
    def __init__(self, left_padding: list[int]) -> None:
        super().__init__(left_padding)
        self.valid: mx.array | None = None  # (rows, positions written): False for padding and holes

    def _valid(self) -> mx.array:
        if self.valid is None or self.valid.shape[1] != self._idx:
            written = self.valid if self.valid is not None else mx.zeros((self.offset.shape[0], 0), dtype=mx.bool_)
            more = mx.arange(written.shape[1], self._idx)[None] >= self.left_padding[:, None]
            self.valid = mx.concatenate([written[:, : self._idx], more], axis=1)
        return self.valid

    def make_mask(self, N: int, return_array: bool = False, **kwargs) -> mx.array:
        causal = mx.arange(self._idx, self._idx + N)[:, None] >= mx.arange(self._idx + N)[None]
        valid = self._valid()
        columns = mx.concatenate([valid, mx.ones((valid.shape[0], N), dtype=mx.bool_)], axis=1)
        return causal[None, None] & columns[:, None, None, :]

    def drop(self, extra: list[int]) -> None:
        """Drop each row's last `extra[i]` positions: a trim of what all rows drop, holes for
        the rest."""
        least = min(extra)
        if least:
            self.trim(least)
        if max(extra) > least:
            more = mx.array([e - least for e in extra])
            keep = mx.arange(self._idx)[None] < (self._idx - more)[:, None]
            self.valid = self._valid() & keep
            self.offset = self.offset - more

    @property
    def unused(self) -> int:
        """Positions even the longest row does not hold (its padding and holes)."""
        return self._idx - mx.max(self.offset).item() if self.offset.size else 0

    def trim(self, n: int) -> int:
        n = super().trim(n)
        if self.valid is not None:
            self.valid = self.valid[:, : self._idx]
        return n

    def squeeze(self) -> None:
        """Every row's held positions right-aligned, the holes gone (its padding on the left)."""
        valid = self._valid()
        counts = valid.astype(mx.int32).sum(axis=1)
        longest = mx.max(counts).item()
        # Row i's j-th held position, for the last counts[i] columns; padding reads position 0.
        order = mx.argsort(mx.where(valid, mx.arange(self._idx)[None], self._idx + mx.arange(self._idx)[None]), axis=1)
        pad = longest - counts
        column = mx.arange(longest)[None] - pad[:, None]
        index = mx.where(column >= 0, mx.take_along_axis(order, mx.maximum(column, 0), axis=1), 0)
        index = index[:, None, :, None]
        self.keys = mx.take_along_axis(self.keys[..., : self._idx, :], index, axis=2)
        self.values = mx.take_along_axis(self.values[..., : self._idx, :], index, axis=2)
        self._idx, self.left_padding = longest, pad
        self.valid = None

    def filter(self, batch_indices) -> None:
        valid = self._valid()[batch_indices] if self.keys is not None else None
        self.left_padding = self.left_padding[batch_indices]
        self.offset = self.offset[batch_indices]
        if self.keys is not None:
            self.keys, self.values = self.keys[batch_indices], self.values[batch_indices]
            self.valid = valid
            first = mx.min(mx.argmax(valid, axis=1)).item() if valid.shape[1] else 0  # columns no row holds
            if first:
                self.keys, self.values = self.keys[..., first:, :], self.values[..., first:, :]
                self.valid, self._idx = valid[:, first:], self._idx - first
                self.left_padding = mx.maximum(self.left_padding - first, 0)

    def extend(self, other: RaggedKVCache) -> None:
        mine = self._valid() if self.keys is not None else None
        theirs = other._valid() if other.keys is not None else None
        width = max(self._idx, other._idx)

        def aligned(valid, rows, idx):
            head = mx.zeros((rows, width - idx), dtype=mx.bool_)
            return mx.concatenate([head, valid if valid is not None else mx.zeros((rows, idx), mx.bool_)], axis=1)

        rows_self, rows_other = self.offset.shape[0], other.offset.shape[0]
        valid = mx.concatenate([aligned(mine, rows_self, self._idx), aligned(theirs, rows_other, other._idx)])
        super().extend(other)
        self.valid = valid if self.keys is not None else None

    def extract(self, idx: int) -> KVCache:
        cache = KVCache()
        held = mx.array([j for j, v in enumerate(self._valid()[idx].tolist()) if v])
        cache.keys = mx.contiguous(mx.take(self.keys[idx : idx + 1], held, axis=2))
        cache.values = mx.contiguous(mx.take(self.values[idx : idx + 1], held, axis=2))
        cache.offset = cache.keys.shape[2]
        return cache


def join(batch: list[RaggedKVCache], cache: list[KVCache]) -> list[RaggedKVCache]:
    """A batch's layer caches with one more sequence's (its own, one per layer) as the last row;
    an empty batch becomes a batch of one."""
    joining = [RaggedKVCache.merge([c]) for c in cache]
    if not batch:
        return joining
    for mine, theirs in zip(batch, joining):
        mine.extend(theirs)
    return batch


def drop(caches: list[RaggedKVCache], extra: list[int]) -> None:
    """Drop each row's last `extra[i]` positions from every layer; squeeze the holes out once
    the longest row has more than HOLES."""
    if max(extra, default=0):
        for c in caches:
            c.drop(extra)
        if caches[0].unused > HOLES:  # every layer holds the same positions
            for c in caches:
                c.squeeze()

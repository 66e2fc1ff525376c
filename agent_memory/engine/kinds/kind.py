"""The protocol every layer kind follows, as mlx-lm gives every cache class one (`models/cache.py`).

A kind is a module (attention.py, window.py, recurrent.py, chunked.py) listed once in
registry.py. Every kind says which mlx-lm cache classes it keeps, whether what it keeps is
per-token KV in blocks (`snapshot = False`: attention) or a state at a position
(`snapshot = True`), and how one sequence's cache joins the decode batch. A block kind cuts and
appends KV of token runs for a group of layers (attention.py's `cut_at`, `append`,
`block_layout`); a snapshot kind takes its state where the cache is, restores a cache from it,
and says the arrays a snapshot at a position holds (what the warm tier writes).
"""

from __future__ import annotations

from typing import Any, Callable, Protocol

import agent_memory.blas  # noqa: F401
import mlx.core as mx


class LayerKind(Protocol):
    name: str
    cache_classes: tuple[type, ...]  # mlx-lm's classes of this kind, matched exactly
    snapshot: bool  # True: kept as a state at a position; False: per-token KV in blocks
    joins: bool  # True: its caches decode in one batch with other sequences'; False: each alone
    # One sequence's cache as a batch of one that others join (mlx-lm's `merge` where it has one);
    # None for a kind that never joins (registry.batched keeps such a sequence's caches as they are).
    batched: Callable[[Any], Any] | None


class SnapshotKind(LayerKind, Protocol):
    def take(self, cache: Any) -> tuple[list[mx.array], list[int]]:
        """The state where the cache is now: its arrays (copies) and the integers it is rebuilt with."""

    def restore(self, arrays: list[mx.array], meta: list[int]) -> Any:
        """A cache as a prefill that ended at the snapshot's position leaves one."""

    def layout(self, probed: Any, position: int) -> list[tuple[mx.Dtype, tuple[int, ...]]]:
        """The arrays a snapshot at `position` holds, from a cache that has seen one token."""

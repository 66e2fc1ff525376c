"""The one map from an mlx-lm cache class to its layer kind: the rest of the engine asks it,
never tests a cache's type. A new kind is a module following kind.py and a line in KINDS."""

from __future__ import annotations

from typing import Any

import agent_memory.blas  # noqa: F401
from mlx_lm.models.cache import CacheList

from agent_memory.engine.batch.alone import AloneCache
from agent_memory.engine.kinds import attention, chunked, recurrent, window
from agent_memory.engine.kinds.kind import LayerKind

KINDS: tuple[LayerKind, ...] = (attention, window, recurrent, chunked)

BY_CLASS: dict[type, LayerKind] = {cls: kind for kind in KINDS for cls in kind.cache_classes}


def slots(cache: list) -> list[tuple[int, int | None, Any]]:
    """Every cache of a model's cache list, with its layer and its place in a `CacheList`
    (a layer that keeps several), or None."""
    out = []
    for i, c in enumerate(cache):
        if type(c) is CacheList:
            out.extend((i, j, sub) for j, sub in enumerate(c.caches))
        else:
            out.append((i, None, c))
    return out


def kind_of(cache: Any) -> LayerKind | None:
    return BY_CLASS.get(type(cache))


def refusal(cache: list) -> str | None:
    """Why a model whose working cache is `cache` cannot be served, or None (nothing computed)."""
    unknown = sorted({type(c).__name__ for _, _, c in slots(cache) if kind_of(c) is None})
    if not unknown:
        return None
    kept = ", ".join(cls.__name__ for kind in KINDS for cls in kind.cache_classes)
    return f"its layers keep {', '.join(unknown)} caches, a kind this server cannot keep (it keeps {kept})"


def batched(cache: list) -> tuple[list, bool]:
    """One sequence's caches as a batch of one, and whether it decodes with other sequences:
    each cache by its kind (a CacheList's members by theirs); where any kind cannot join
    others, every cache as it is, in a batch of its own (engine/batch/alone.py)."""
    if not all(kind_of(c).joins for _, _, c in slots(cache)):
        return [AloneCache(c) for c in cache], False
    return [_joining(c) for c in cache], True


def _joining(cache: Any) -> Any:
    if type(cache) is CacheList:
        return CacheList(*(kind_of(c).batched(c) for c in cache.caches))
    return kind_of(cache).batched(cache)

"""The memory limit, split: the model's weights, the hot tier's budget, and what is left for
running requests' working caches. MLX is told the limit and keeps no freed buffers for reuse:
at its default (a tenth of the limit) four agents left ~1.4 GB of idle buffers in the
process, and even 128 MiB raised the peak of eight agents by ~150 MB with no speed to show
for it (docs/benchmarks.md). When the engine goes idle it asks glibc to hand free pages back
(`malloc_trim`), so that the process shrinks back after a burst."""

from __future__ import annotations

import ctypes
import logging

import agent_memory.blas  # noqa: F401
import mlx.core as mx
from mlx.utils import tree_flatten

log = logging.getLogger(__name__)

MIB = 1 << 20


def _malloc_trim():
    try:
        return ctypes.CDLL(None).malloc_trim  # glibc; elsewhere the allocator returns memory itself
    except (OSError, AttributeError):
        return None


MALLOC_TRIM = _malloc_trim()


def give_back_memory() -> None:
    """Return glibc's free pages to the system (MLX keeps no freed buffers of its own)."""
    if MALLOC_TRIM is not None:
        MALLOC_TRIM(0)


def weights_bytes(model) -> int:
    return sum(v.nbytes for _, v in tree_flatten(model.parameters()))


def working_budget(limit: int | None, model, hot_budget: int) -> int | None:
    """Bytes running requests may hold (None: unlimited), after telling MLX the limit."""
    mx.set_cache_limit(0)
    if limit is None:
        return None
    mx.set_memory_limit(limit)
    weights = weights_bytes(model)
    working = limit - weights - hot_budget
    log.info(
        "memory limit %d MiB: weights %d MiB, hot KV budget %d MiB, running requests %d MiB",
        limit // MIB,
        weights // MIB,
        hot_budget // MIB,
        max(working, 0) // MIB,
    )
    if working <= 0:
        log.warning("the memory limit leaves nothing for running requests: they will run one at a time")
    return max(working, 0)

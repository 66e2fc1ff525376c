"""The memory limit as MLX sees it, and as the log says it is split (engine/loading/residency.py
shares it among the loaded models: weights, the hot tier's budget, what is left for running
requests' working caches). MLX is told the limit and keeps no freed buffers for reuse:
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


def tell_mlx(limit: int | None) -> None:
    """MLX keeps no freed buffers, and allocates within the limit (the same for every model)."""
    mx.set_cache_limit(0)
    if limit is not None:
        mx.set_memory_limit(limit)


def describe_split(name: str, limit: int | None, weights: int, hot: int, working: int | None) -> None:
    """Say how the limit is spent, once a model has loaded (engine/loading/residency.py shares it)."""
    if limit is None:
        return
    log.info(
        "memory limit %d MiB: %s's weights %d MiB, its hot KV budget %d MiB, its running requests %d MiB",
        limit // MIB,
        name,
        weights // MIB,
        hot // MIB,
        (working or 0) // MIB,
    )
    if not working:
        log.warning("the memory limit leaves nothing for running requests: they will run one at a time")

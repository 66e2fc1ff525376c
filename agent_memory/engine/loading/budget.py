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


KIB = 1 << 10


class RankShares:
    """The budgets rank 0 keeps, agreed by every rank of a distributed group at load: rank 0's
    store and scheduler count rank-0 bytes, but a pipeline rank may hold more layers (the low
    ranks get the extra ones) and another machine less memory, so each budget is the smallest
    any rank allows, in rank-0 bytes: hot_0 = min_r(hot × bpt_0 / bpt_r), and likewise the
    running requests' memory each rank's limit leaves beside its weights and the hot budget.
    One process: `ONE_PROCESS`, which keeps the budgets as they are."""

    def __init__(self, rows: list[list[int]] | None = None) -> None:
        """`rows`: each rank's [limit KiB (-1: none), weights KiB, bytes per token], by rank."""
        self.rows = rows or []

    @classmethod
    def agree(cls, group, limit: int | None, weights: int, bytes_per_token: int) -> RankShares:
        """Every rank's memory facts, gathered once (a collective: every rank calls it at load)."""
        row = [-1 if limit is None else limit // KIB, weights // KIB, max(bytes_per_token, 1)]
        return cls(group.gather(row, "the memory budgets"))

    def agreed(self, hot: int, working: int | None) -> tuple[int, int | None]:
        """Rank 0's (hot budget, running requests' bytes) that overfill no rank."""
        if not self.rows:
            return hot, working
        per_token_0 = self.rows[0][2]
        agreed_hot = min(hot * per_token_0 // per_token for _, _, per_token in self.rows)
        if working is None:
            return agreed_hot, None
        room = [
            max(limit * KIB - weights * KIB - hot, 0) * per_token_0 // per_token
            for limit, weights, per_token in self.rows[1:]
            if limit >= 0
        ]
        return agreed_hot, min([working, *room])


ONE_PROCESS = RankShares()

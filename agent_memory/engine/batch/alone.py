"""AloneCache: one sequence's layer cache as a batch that never takes another row.

A sequence whose layers include a kind that cannot share a forward pass with other rows (Llama
4's chunked attention: engine/kinds/chunked.py) decodes in a `GenerationBatch` of its own. Its
caches stay the single-sequence ones the model expects (a `KVCache`'s scalar offset, which Llama
4's global layers compute with, not `BatchKVCache`'s per-row ones): every attribute the model
reads is the cache's own, and this adds what the batch asks of a batch cache (extract, filter).
"""

from __future__ import annotations

from typing import Any


class AloneCache:
    def __init__(self, cache: Any) -> None:
        self.cache = cache

    def __getattr__(self, name: str) -> Any:
        return getattr(self.cache, name)

    def extract(self, idx: int) -> Any:
        return self.cache

    def filter(self, batch_indices: list[int]) -> None:
        if list(batch_indices) != [0]:
            raise ValueError("a cache that decodes alone keeps its one row or ends")

    def extend(self, other: Any) -> None:
        raise ValueError("a cache that decodes alone takes no other row")

"""What the engine is told at start: the model, the batch limit, budgets and precisions."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from agent_memory.engine import kv


@dataclass
class EngineConfig:
    model_path: Path
    max_batch: int = 32
    hot_budget_bytes: int = 2 << 30
    precision: kv.KVPrecision = kv.KVPrecision()
    cache_dir: Path | None = None  # None or a zero disk budget: no warm tier
    disk_budget_bytes: int = 0
    warm_store: str | None = None  # a redis:// URL: the warm tier shared with other servers
    disk_precision: kv.KVPrecision | None = None  # None: the same as `precision`
    # False: a running sequence attends to full-precision KV (its cached prefix dequantized
    # once, its own new tokens never quantized); blocks are exact while hot and quantized only
    # when they cool (the hot budget's pressure) or go to disk.
    # True: it attends to quantized KV too (least memory; +10 % perplexity at Q4, slower on CPU).
    decode_quantized: bool = False
    # Memory for weights, hot KV and running requests' working caches; None: no limit.
    memory_limit_bytes: int | None = None

    @property
    def precisions(self) -> kv.Precisions:
        return kv.Precisions(
            hot=self.precision,
            working=self.precision if self.decode_quantized else kv.KVPrecision(),
            disk=self.disk_precision or self.precision,
        )

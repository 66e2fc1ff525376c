"""What the engine is told at start: the model, when it loads, the batch limit, budgets and
precisions."""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from agent_memory.precision import Precisions


@dataclass
class EngineConfig:
    model_path: Path
    # Its own name, which its warm folder is named by: the hub id it was named by (default: the folder's name).
    model_name: str | None = None
    served_as: str | None = None  # what /health, /v1/models and the log call it: `--model NAME=…`'s NAME
    model_aliases: tuple[str, ...] = ()  # other ids it answers to (`demo` for the demo model; NAME=)
    max_batch: int = 32
    hot_budget_bytes: int = 2 << 30
    # From --kv-bits, --disk-kv-bits, --decode-quantized (precision.py); default: all unquantized.
    precisions: Precisions = field(default_factory=lambda: Precisions.of(16, 64))
    cache_dir: Path | None = None  # None or a zero disk budget: no warm tier
    disk_budget_bytes: int = 0
    vision_cache_bytes: int = 256 << 20  # --vision-cache-mb: recent images' features (vision/tower.py)
    warm_store: str | None = None  # a redis:// URL: the warm tier shared with other servers
    # Memory for weights, hot KV and running requests' working caches; None: no limit.
    memory_limit_bytes: int | None = None
    model_defaults: bool = True  # requests' omitted sampling fields from generation_config.json
    default_max_tokens: int | None = None  # --default-max-tokens: a request's limit when it sends none
    trace_path: Path | None = None  # --trace-file: where the engine's time goes (trace.py)
    load_at_start: bool = True  # else on its first request (a second served model: engine/loading/residency.py)
    pinned: bool = False  # --keep-loaded: never unloaded to make room for another model
    # --speculation: "lookup" (prompt lookup where the model allows it), "draft" (draft_path proposes) or "off"
    speculation: str = "lookup"
    draft_path: Path | None = None  # --draft-model's folder (given only with --speculation draft)
    split: Any = None  # engine/loading/sharding.py's Split: this rank's part of a distributed group; None: one process

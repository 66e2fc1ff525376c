"""Open the warm tier for the loaded model: its tier (memory/warm/tier.py) over the backend
that memory/warm/opening.py picks, with the layouts of this model's block and snapshot files
at the disk precision (engine/kinds/layers.py), which only the engine knows."""

from __future__ import annotations

from pathlib import Path

from agent_memory.engine.kinds.layers import ModelLayers
from agent_memory.engine.loading.loader import LoadedModel
from agent_memory.memory.warm.backend import WarmBackend
from agent_memory.memory.warm.folder.paths import Folder, folder_name
from agent_memory.memory.warm import shards
from agent_memory.memory.warm.opening import Opened, open_tier
from agent_memory.memory.warm.format.records import BLOCK_TOKENS
from agent_memory.memory.warm.tier import WarmTier
from agent_memory.precision import Precisions


def open_warm_tier(
    cache_dir: Path | None,
    budget_bytes: int,
    loaded: LoadedModel,
    layers: ModelLayers,
    precisions: Precisions,
    warm_store: str | None = None,
    split=None,
) -> Opened:
    """(the tier, what its folder held, why there is none): see opening.open_tier. Split over
    processes (`split`: sharding.Split), this rank's folder for its part, agreed by every rank
    (memory/warm/shards.py)."""
    precision = precisions.disk

    def make_tier(backend: WarmBackend | Folder) -> WarmTier:
        return WarmTier(
            backend,
            fingerprint=loaded.fingerprint,
            precision=precision,
            name=loaded.name,
            block_tokens=BLOCK_TOKENS,
            block_layout=lambda n: layers.block_layout(n, precision),
            snapshot_layout=layers.snapshot_layout if layers.has_state else None,
        )

    if split is None:
        name = folder_name(loaded.name, loaded.fingerprint, precision.tag)
        return open_tier(make_tier, name, cache_dir, budget_bytes, warm_store)
    part = shards.part_of(loaded.layouts[split.group.rank])
    name = folder_name(loaded.name, loaded.fingerprint, precision.tag, shards.suffix(part))
    before = shards.held(cache_dir / "kv" / name, part) if cache_dir is not None else (0, shards.NEW, -1)
    return shards.agree(split.group, open_tier(make_tier, name, cache_dir, budget_bytes), part, before)

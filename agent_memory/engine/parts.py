"""Everything the engine thread works with, built when the model first loads: the model,
the warm tier, the store (restored from the cache folder; a shared tier's agents are probed
later), the decode batch, the prefiller, the committer and the memory left for running
requests. After that the weights alone go and come back (`unload_weights`, `reload_weights`)."""

from __future__ import annotations

import logging
from dataclasses import dataclass, replace
from typing import Any

from agent_memory.engine.commit import Committer
from agent_memory.engine.config import EngineConfig
from agent_memory.engine.batch.decode_batch import DecodeBatch
from agent_memory.engine.kinds import attention
from agent_memory.engine.kinds.layers import ModelLayers
from agent_memory.engine.loading.budget import ONE_PROCESS, RankShares, weights_bytes
from agent_memory.engine.loading.loader import LoadedModel, ModelText, UnsupportedModelError, load_draft, load_model
from agent_memory.engine.loading.warm import open_warm_tier
from agent_memory.engine.observability.trace import NoTrace
from agent_memory.engine.prefill import Prefiller
from agent_memory.engine.speculation.speculative_batch import SpeculativeBatch
from agent_memory.memory.index import keep
from agent_memory.memory.index.store import AgentCacheStore
from agent_memory.memory.warm import shards
from agent_memory.memory.warm.format.records import BLOCK_TOKENS
from agent_memory.memory.warm.tier import WarmTier
from agent_memory.precision import KVPrecision, Precisions
from agent_memory.vision.tower import Features

log = logging.getLogger(__name__)


@dataclass
class Parts:
    loaded: LoadedModel
    layers: ModelLayers
    precisions: Precisions
    store: AgentCacheStore
    warm: WarmTier | None
    warm_error: str | None  # why there is no warm tier, when one was asked for
    draft: Any  # --speculation draft: the draft model's weights (None without one, or unloaded)
    batch: DecodeBatch | SpeculativeBatch | None  # None while the weights are unloaded (and the prefiller too)
    prefiller: Prefiller | None
    committer: Committer
    working_budget: int | None  # bytes running requests' working caches may hold
    bytes_per_token: int  # of a working cache's attention layers (and its draft's)
    state_bytes: int  # of a working cache's window and recurrent layers, at most
    features: Features  # a vision model's recent images' features (vision/tower.py), kept through unloads
    shares: RankShares  # split over processes: the budgets every rank allows (ONE_PROCESS: as given)


def demoter(p: Precisions):
    """How an exact hot block cools to --kv-bits; None when computed KV already is at it."""
    if not p.exact_while_hot:
        return None

    def demote(block: attention.BlockKV) -> tuple[attention.BlockKV, int]:
        cooled = attention.demote(block, p.hot)
        return cooled, cooled.nbytes

    return demote


def fitted_groups(p: Precisions, layers: ModelLayers, name: str) -> Precisions:
    """The precisions with a quantization group size the model's head sizes allow (Phi-3's 96
    is no multiple of 64), said once when it is not the one asked for. Where none is (MLX groups
    by 32, 64 or 128), KV stays unquantized, said as a warning; decoding from quantized KV is
    refused."""
    if not (p.hot.quantized or p.disk.quantized):
        return p
    group = layers.group_size_for(p)
    if group is None:
        if p.working.quantized:
            raise UnsupportedModelError(f"{name}: --decode-quantized: no quantization group size fits its head sizes")
        log.warning("KV kept at 16 bits: no quantization group size (128, 64, 32) divides %s's head sizes", name)
        return Precisions.of(16, p.hot.group_size)
    if group == p.hot.group_size:
        return p
    log.info("KV quantized in groups of %d: %d does not divide %s's head sizes", group, p.hot.group_size, name)

    def regroup(precision: KVPrecision) -> KVPrecision:
        return replace(precision, group_size=group) if precision.quantized else precision

    return Precisions(hot=regroup(p.hot), working=regroup(p.working), disk=regroup(p.disk))


def decode_batch(speculation: str, loaded: LoadedModel, layers: ModelLayers, p: Precisions, draft: Any):
    """The decode batch: speculative where asked and where every layer keeps a plain KV cache,
    whose rejected positions a trim takes out (a window or recurrent layer's cannot be cut back
    without a snapshot per proposal; quantized KV has no trim), else one token per step."""
    eos = loaded.tokenizer.eos_token_ids
    if speculation == "off":
        return DecodeBatch(loaded.model, eos, loaded.positions)
    if not layers.plain or p.working.quantized:
        kept = "quantized KV" if p.working.quantized else ", ".join(layers.kinds)
        kept += "" if layers.has_state or p.working.quantized else " in a list of caches per layer (CacheList)"
        log.info("speculation off: %s keeps %s, which cannot drop rejected proposals", loaded.name, kept)
        return DecodeBatch(loaded.model, eos, loaded.positions)
    return SpeculativeBatch(loaded.model, eos, draft, loaded.positions)


def draft_bytes_per_token(draft: Any) -> int:
    """What a running request's draft KV takes per token (unquantized), none without a draft."""
    return ModelLayers(draft).bytes_per_token(Precisions.of(16, 64).working) if draft is not None else 0


def build(cfg: EngineConfig, described: ModelText, trace: NoTrace, hot_budget: int, working: int | None) -> Parts:
    """Load the model's weights and open the tiers (on the engine thread: it makes MLX arrays),
    with its share of the memory limit (engine/loading/residency.py)."""
    features = Features(cfg.vision_cache_bytes)
    loaded, layers, p, shares = _load_part(cfg, described, features)
    hot_budget, working = shares.agreed(hot_budget, working)
    draft = load_draft(cfg.draft_path)
    warm, scan, warm_error = open_warm_tier(
        cfg.cache_dir, cfg.disk_budget_bytes, loaded, layers, p, cfg.warm_store, cfg.split
    )
    store = AgentCacheStore(
        block_tokens=BLOCK_TOKENS,
        salt=loaded.fingerprint,
        hot_budget_bytes=hot_budget,
        attention_tokens=loaded.attention_tokens,
        warm=warm,
        disk_budget_bytes=cfg.disk_budget_bytes,
        demote=demoter(p),
        state_layers=layers.has_state,
    )
    if scan is not None and not warm.shared:
        store.restore(scan)
        keep.restored(store, scan.manifests)
        log.info(
            "warm tier %s: %d agents, %d stored responses, %d block files (%.1f MiB)",
            warm.location,
            *store.counts().values(),
            len(scan.blocks),
            store.pool.disk_bytes / (1 << 20),
        )
    log.info(
        "loaded %s: %d layers (%s), context %d; KV cached as %s, attended as %s%s",
        loaded.name,
        loaded.num_layers,
        ", ".join(layers.kinds),
        loaded.context_length,
        p.hot.tag,
        p.working.tag,
        "; window and recurrent layers resume from snapshots" if layers.has_state else "",
    )
    committer = Committer(store, warm, layers, p, loaded.decoder, trace)
    return Parts(
        loaded=loaded,
        layers=layers,
        precisions=p,
        store=store,
        warm=warm,
        warm_error=warm_error,
        draft=draft,
        batch=decode_batch(cfg.speculation, loaded, layers, p, draft),
        prefiller=Prefiller(loaded.model, layers, p, store, committer, loaded.tower, loaded.positions),
        committer=committer,
        working_budget=working,
        bytes_per_token=layers.bytes_per_token(p.working) + draft_bytes_per_token(draft),
        state_bytes=layers.state_bytes(),
        features=features,
        shares=shares,
    )


def _load_part(cfg: EngineConfig, described: ModelText, features: Features):
    """The model (this rank's part of it when split), its layers, the precisions its heads allow
    and, split, the budgets every rank agreed: the same collectives in the same order on every
    rank (`build` on rank 0, `follower_parts` on the others)."""
    loaded = load_model(described, features=features, split=cfg.split)
    layers = ModelLayers(loaded.model)
    p = fitted_groups(cfg.precisions, layers, loaded.name)
    if p.working.quantized and (why := layers.quantized_refusal(p.working)):
        raise UnsupportedModelError(f"{loaded.name}: {why}")
    shares = ONE_PROCESS
    if cfg.split is not None:
        per_token = layers.bytes_per_token(p.working)
        shares = RankShares.agree(cfg.split.group, cfg.memory_limit_bytes, weights_bytes(loaded.model), per_token)
    return loaded, layers, p, shares


@dataclass
class FollowerParts:
    """What a rank other than 0 computes with: its part of the model, its layers, the precisions
    and the layout, its warm tier (its part of each block); no store, no API (the follower runs
    rank 0's step plans)."""

    loaded: LoadedModel
    layers: ModelLayers
    precisions: Precisions
    warm: WarmTier | None


def follower_parts(cfg: EngineConfig, described: ModelText) -> FollowerParts:
    """A follower's model and warm tier, opened in step with rank 0's `build` (its collectives)."""
    loaded, layers, p, _ = _load_part(cfg, described, Features(0))
    warm, _, _ = open_warm_tier(cfg.cache_dir, cfg.disk_budget_bytes, loaded, layers, p, None, cfg.split)
    if warm is not None:
        warm.start(shards.BlocksOnly())
    return FollowerParts(loaded, layers, p, warm)


def unload_weights(parts: Parts) -> None:
    """Drop the weights and what computes with them; the store and the warm tier stay, so the
    model's agents stay listed, deletable and warm (its hot KV cooled first: engine.py)."""
    parts.batch = parts.prefiller = parts.draft = None
    parts.layers.detach()
    parts.loaded = replace(parts.loaded, model=None, tower=None, positions=None)
    parts.features.clear()


def reload_weights(parts: Parts, cfg: EngineConfig, described: ModelText, working: int | None) -> None:
    """The weights again, into the memory kept since `unload_weights`."""
    loaded = parts.loaded = load_model(described, parts.loaded.fingerprint, parts.features)
    parts.layers.attach(loaded.model)
    parts.draft = load_draft(cfg.draft_path)
    parts.batch = decode_batch(cfg.speculation, loaded, parts.layers, parts.precisions, parts.draft)
    parts.prefiller = Prefiller(
        loaded.model, parts.layers, parts.precisions, parts.store, parts.committer, loaded.tower, loaded.positions
    )
    parts.working_budget = working

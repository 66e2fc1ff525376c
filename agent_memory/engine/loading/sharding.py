"""How a model is split over the ranks of a distributed group, and why it cannot be: tensor
parallel where mlx-lm's family has `Model.shard` (each rank a slice of every layer's heads and
MLP, two `all_sum`s a layer) and its heads (and experts) divide by the group's size; pipeline
where the family has `PipelineMixin` (each rank some of the layers; rank 0 the last ones) and
there are at least as many layers as ranks. `split` runs after a lazy load, so each rank reads
only its part of the weights (not `sharded_load`, whose pipeline path needs a
`model.safetensors.index.json` a one-file model lacks)."""

from __future__ import annotations

from dataclasses import dataclass

import agent_memory.blas  # noqa: F401
import mlx.core as mx

from agent_memory.engine.distributed.group import LOADING_S, DistributedGroup, ShardLayout

EXPERT_KEYS = ("n_routed_experts", "num_experts", "num_local_experts")


@dataclass(frozen=True)
class Split:
    """How this server's model is split: the group and the mode chosen at start."""

    group: DistributedGroup
    mode: str  # "tensor" | "pipeline"


def _tensor_refusal(model, config: dict, size: int) -> str | None:
    if not hasattr(model, "shard"):
        return "mlx-lm gives it no tensor parallelism"
    heads = config.get("num_attention_heads") or 0
    kv_heads = config.get("num_key_value_heads") or heads
    if kv_heads % size or heads % size:
        return f"{kv_heads} key-value heads ({heads} query heads) cannot be split over {size} processes (tensor)"
    for key in EXPERT_KEYS:
        if (experts := config.get(key)) and experts % size:
            return f"{experts} experts cannot be split over {size} processes (tensor)"
    return None


def _pipeline_refusal(model, size: int) -> str | None:
    inner = getattr(model, "model", None)
    if not hasattr(inner, "pipeline"):
        return "mlx-lm gives it no pipeline parallelism"
    if len(inner.layers) < size:
        return f"its {len(inner.layers)} layers cannot be split over {size} processes (pipeline)"
    return None


def choose(model, config: dict, size: int, asked: str) -> tuple[str | None, str | None]:
    """(mode, None) or (None, why not) for a lazily loaded model over `size` processes;
    `asked` is --distributed: auto picks tensor where it can, else pipeline."""
    family = config.get("model_type", "this model")
    if asked in ("tensor", "pipeline"):
        why = _tensor_refusal(model, config, size) if asked == "tensor" else _pipeline_refusal(model, size)
        hint = "; try --distributed auto" if why and asked == "tensor" and _pipeline_refusal(model, size) is None else ""
        return (None, f"{family}: {why}{hint}") if why else (asked, None)
    tensor = _tensor_refusal(model, config, size)
    if tensor is None:
        return "tensor", None
    pipeline = _pipeline_refusal(model, size)
    if pipeline is None:
        return "pipeline", None
    if not hasattr(model, "shard") and not hasattr(getattr(model, "model", None), "pipeline"):
        return None, f"{family} cannot be split over {size} processes: mlx-lm gives it neither tensor nor pipeline parallelism"
    return None, f"{family} cannot be split over {size} processes: {tensor}; {pipeline}"


def split(model, config: dict, how: Split, fingerprint: str) -> ShardLayout:
    """Split a lazily loaded model in place, then read this rank's weights (every rank waits for
    the others, as mlx-lm's sharded_load does); the layout of what this rank holds."""
    group = how.group
    layers = len(model.layers)
    heads = config.get("num_key_value_heads") or config.get("num_attention_heads") or 0
    if how.mode == "tensor":
        model.shard(group.group)
        per = heads // group.size
        kv_heads, held = (group.rank * per, (group.rank + 1) * per), (0, layers)
    else:
        model.model.pipeline(group.group)
        kv_heads, held = (0, heads), (model.model.start_idx, model.model.end_idx)
    mx.eval(model.parameters())
    group.barrier("loading the weights", LOADING_S)
    return ShardLayout(how.mode, group.size, group.rank, kv_heads, held, fingerprint)

"""`agent-memory serve` under `mlx.launch`: one model split over the launched processes
(docs/usage.md, "Across processes"). Every rank reads the same flags, joins the group, refuses
what cannot work split (with the same words on every rank, before any exchange) and picks the
same split; rank 0 then serves HTTP as a single server does, the others follow it
(`follow`): no port, no API keys, no server.json."""

from __future__ import annotations

import logging
from dataclasses import replace
from pathlib import Path

from agent_memory.config import ConfigError, Settings

log = logging.getLogger(__name__)


def join(settings: Settings):
    """The group this process was launched in, or None when it runs alone; ConfigError when the
    launcher's group cannot be joined (a port of its hostfile taken, a peer unreachable)."""
    from agent_memory.engine.distributed.group import DistributedGroup

    try:
        return DistributedGroup.join(settings.distributed_timeout)
    except RuntimeError as e:  # MLX's backend could not connect the ranks
        raise ConfigError(f"could not join the processes mlx.launch started: {e}") from None


def flag_refusal(settings: Settings, size: int) -> str | None:
    """A flag that cannot work split over processes, and why, or None."""
    if len(settings.model) > 1:
        return (
            f"--model is given {len(settings.model)} times: a server split over {size} processes serves one "
            "model (loading and unloading would have to be agreed by every process)"
        )
    if settings.draft_model or settings.speculation == "draft":
        return "--speculation draft / --draft-model: a draft model is not served split over processes yet"
    if settings.unload_idle_s is not None:
        return "--unload-idle-s: a model split over processes stays loaded (an unload would have to be agreed)"
    if settings.warm_store is not None and settings.disk_budget_mb:
        return (
            "--warm-store: a model split over processes keeps its warm tier in each rank's own cache folder; "
            "per-rank Redis namespaces are not done yet (use --cache-dir on each machine)"
        )
    return None


def prepare(settings: Settings, group, path: Path):
    """This server's split (engine/loading/sharding.py `Split`), chosen from the model folder's
    config and lazily mapped weights (nothing read); raises ConfigError with the reason when the
    model cannot be split over the group (the flags were checked first: `flag_refusal`)."""
    import json

    from mlx_lm.utils import load_model as load_weights

    from agent_memory.engine.loading.sharding import Split, choose
    from agent_memory.models.embedding_layout import is_embedding_model

    n = group.size
    if is_embedding_model(path):
        raise ConfigError(f"{path.name} is an embedding model: only a chat model is served split over processes")
    config = json.loads((path / "config.json").read_text())
    if "vision_config" in config:
        raise ConfigError(f"{path.name} reads images: a vision model is not served split over processes yet")
    text = {**config, **(config.get("text_config") or {})}
    model, _ = load_weights(path, lazy=True)
    mode, why = choose(model, text, n, settings.distributed)
    if why:
        raise ConfigError(f"{path.name} cannot be served over {n} processes: {why}")
    if settings.speculation == "lookup":
        log.info("speculation off: not yet run split over processes")
    return Split(group, mode)


def follow(cfg) -> int:
    """A rank other than 0: its part of the model, loaded in step with rank 0, then rank 0's
    messages until it stops. The exit status (75: the group failed)."""
    from agent_memory.engine.distributed.group import STOPPED, GroupError, describe_layouts
    from agent_memory.engine.loading.budget import tell_mlx
    from agent_memory.engine.loading.loader import UnsupportedModelError, describe_model
    from agent_memory.engine.parts import follower_parts

    group = cfg.split.group
    try:
        described = describe_model(cfg.model_path, cfg.model_name, cfg.model_defaults)
        tell_mlx(cfg.memory_limit_bytes)
        parts = follower_parts(replace(cfg, speculation="off"), described)
    except (UnsupportedModelError, GroupError) as e:
        log.error("%s", e)
        return 1
    except RuntimeError as e:  # a peer lost while loading
        log.error("rank %d: the group failed while loading (%s): stopping", group.rank, e)
        return STOPPED
    log.info(
        "rank %d follows rank 0: %s, %d layers here (%s)",
        group.rank, describe_layouts(parts.loaded.layouts), parts.loaded.num_layers, ", ".join(parts.layers.kinds),
    )
    from agent_memory.engine.distributed.channel import PlanChannel
    from agent_memory.engine.distributed.follower import Follower
    from agent_memory.engine.distributed.group import HEARTBEAT_S
    from agent_memory.engine.parts import demoter

    channel = PlanChannel(group, HEARTBEAT_S)
    p = parts.precisions
    eos = described.tokenizer.eos_token_ids
    try:
        Follower(parts.loaded.model, parts.layers, p, eos, channel, demoter(p), parts.warm).serve(channel)
    except RuntimeError as e:
        log.error("rank %d: the group failed (%s): stopping", group.rank, e)
        return STOPPED
    return 0


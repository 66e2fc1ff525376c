"""What `agent-memory serve` serves: each --model resolved and named, and its engine's config
with the settings every model shares."""

from __future__ import annotations

from pathlib import Path

from agent_memory.cli.common import ProgressReporter, progress
from agent_memory.config import OUTPUT_LIMIT, ConfigError, Settings


def resolve_model_with_progress(spec: str, models_dir: Path) -> Path:
    from agent_memory.models.registry import resolve_model  # noqa

    with progress() as bars:
        return resolve_model(spec, models_dir, progress=ProgressReporter(bars))


def served_models(settings: Settings) -> dict:
    """Each --model's engine config by the id it is served under (its NAME= if given, else its
    own), in the order given: the first loads at start (and any --keep-loaded), the others on
    their first request. Ids, aliases, --keep-loaded and --default-max-tokens names are checked
    here, before anything loads."""
    from agent_memory.engine.config import EngineConfig
    from agent_memory.models.demo import aliases
    from agent_memory.models.registry import ModelSpec, served_name

    configs: dict[str, EngineConfig] = {}
    taken: dict[str, str] = {}  # every name a request may give -> the model id it picks
    pinned = set(settings.keep_loaded)
    # --default-max-tokens: NAME -> N for one model, None -> N for every other
    limits = {name: int(n) for name, n in (OUTPUT_LIMIT.match(e).groups() for e in settings.default_max_tokens)}
    for n, text in enumerate(settings.model):
        spec = ModelSpec.parse(text)
        path = resolve_model_with_progress(spec.spec, settings.models_dir)
        own = served_name(spec.spec, path)  # also what its warm folder is named by: an alias moves no agent
        model_id = spec.alias or own  # what /v1/models, /health and /v1/agents call it
        names = tuple(dict.fromkeys((model_id, own, *aliases(own))))
        for name in names:
            if name in taken:
                raise ConfigError(f"--model {text}: the name '{name}' is already {taken[name]}'s")
            taken[name] = model_id
        keep = bool(pinned.intersection(names))
        configs[model_id] = EngineConfig(
            model_path=path,
            model_name=own,
            served_as=model_id,
            model_aliases=tuple(n for n in names if n != own),
            load_at_start=n == 0 or keep,
            pinned=keep,
            default_max_tokens=next((limits[name] for name in names if name in limits), limits.get(None)),
        )
    if unknown := sorted(pinned - set(taken)):
        raise ConfigError(f"--keep-loaded {', '.join(unknown)}: not a served model's name ({', '.join(taken)})")
    if unknown := sorted(set(limits) - {None} - set(taken)):
        served = ", ".join(taken)
        raise ConfigError(f"--default-max-tokens {', '.join(unknown)}=…: not a served model's name ({served})")
    return configs


def make_engine(settings: Settings, config, residency, draft: Path | None, split, on_group_lost=None):
    """A served model's engine, with the settings every model shares (the draft model too); an
    embedding model's folder (models/embedding_layout.py) gets an EmbeddingEngine. `split`,
    `on_group_lost`: a model split over processes, and what stops the server if a rank is lost."""
    from dataclasses import replace

    from agent_memory.models.embedding_layout import is_embedding_model
    from agent_memory.engine.engine import BatchEngine

    if is_embedding_model(config.model_path):
        from agent_memory.embeddings.engine import EmbeddingEngine

        return EmbeddingEngine(replace(config, memory_limit_bytes=settings.memory_limit_bytes), residency)
    return BatchEngine(chat_config(settings, config, draft, split), residency, on_group_lost)


def chat_config(settings: Settings, config, draft: Path | None, split):
    """A chat model's engine config with the settings every model shares; split over processes
    (`split`: engine/loading/sharding.py), without speculation (not run split yet)."""
    from dataclasses import replace

    from agent_memory.precision import Precisions

    return replace(
        config,
        max_batch=settings.max_batch,
        hot_budget_bytes=settings.hot_budget_mb << 20,
        precisions=Precisions.of(
            settings.kv_bits, settings.kv_group_size, settings.disk_kv_bits, settings.decode_quantized
        ),
        cache_dir=settings.cache_dir,
        warm_store=settings.warm_store,
        disk_budget_bytes=settings.disk_budget_mb << 20,
        vision_cache_bytes=settings.vision_cache_mb << 20,
        memory_limit_bytes=settings.memory_limit_bytes,
        model_defaults=settings.model_defaults,
        trace_path=settings.trace_file,
        speculation="off" if split is not None else settings.speculation,
        draft_path=draft,
        split=split,
    )

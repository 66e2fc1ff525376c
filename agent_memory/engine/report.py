"""What an engine tells the operator about its parts: /health's kv and warm tier, and the one
line the log says once the model is served."""

from __future__ import annotations

from agent_memory import blas
from agent_memory.engine.distributed.group import describe_layouts
from agent_memory.engine.parts import Parts
from agent_memory.engine.protocol import Health, ModelFacts
from agent_memory.memory.warm.health import warm_health


def parts_health(p: Parts, weights_in: bool) -> Health:
    if p.warm is not None and not p.warm.alive:
        return Health("error", "the warm tier's writer thread has stopped")
    kv = {"hot": p.precisions.hot.tag, "working": p.precisions.working.tag, "disk": p.precisions.disk.tag}
    warm = warm_health(p.warm, p.warm_error, p.store.disk_budget_bytes)
    return Health("ok", kv=kv, warm_tier=warm, loaded=weights_in, ranks=ranks_health(p))


def ranks_health(p: Parts) -> dict | None:
    """A model split over processes: how, and what each rank holds; None in one process."""
    layouts = p.loaded.layouts
    if not layouts:
        return None
    return {
        "size": len(layouts),
        "mode": layouts[0].mode,
        "layout": describe_layouts(layouts),
        "parts": [{"rank": s.rank, "kv_heads": list(s.kv_heads), "layers": list(s.layers)} for s in layouts],
    }


def summary(p: Parts | None, facts: ModelFacts, max_batch: int) -> str:
    if p is None:
        return f"model {facts.name} (context {facts.context_length}): loads on its first request"
    loaded, precisions, store = p.loaded, p.precisions, p.store
    hot = precisions.hot.tag
    kv = f"KV exact while hot, {hot} once cooled" if precisions.exact_while_hot else f"KV {hot}"
    counts = store.counts()
    held = f"{counts['agents']} agents, {counts['stored_responses']} stored responses"
    warm = (
        f"warm tier {p.warm.location} ({held}, {store.pool.disk_bytes >> 20} MiB "
        f"of {store.disk_budget_bytes >> 20} MiB at {precisions.disk.tag})"
        if p.warm is not None
        else f"no warm tier ({p.warm_error or 'disk budget 0'})"
    )
    return (
        f"model {loaded.name} ({loaded.num_layers} layers, context {loaded.context_length}); {kv}; "
        f"hot budget {store.hot_budget_bytes >> 20} MiB; {warm}; batch up to {max_batch}; "
        f"BLAS {'OpenBLAS' if blas.OPENBLAS_LOADED else 'MLX reference (slow on CPU)'}"
        + (f"; {len(layouts)} ranks, {describe_layouts(layouts)}" if (layouts := loaded.layouts) else "")
    )

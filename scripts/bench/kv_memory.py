"""What a server holds in memory: agent-memory's cache state (GET /v1/agents, /metrics), its KV
precision from its log, the model's KV bytes per token from its config, and hot KV against the
ideal — one copy of the shared prefix plus each agent's own tokens, priced at the precision the
server holds them in (exact while an agent is active, quantized once it cools: agent-memory's log
says "KV cached as q4g64")."""

from __future__ import annotations

import json
import re
from pathlib import Path

import httpx

from bench.stats import pct
from bench.turns import Record


def fetch_cache_state(root: str) -> dict:
    """Hot/disk bytes as agent-memory reports them (GET /v1/agents and /metrics): hot split into
    exact (as computed) and quantized (cooled); {} for other servers."""
    out: dict = {}
    try:
        r = httpx.get(root + "/v1/agents", timeout=30)
        if r.status_code == 200:
            body = r.json()
            for key in ("hot_bytes", "hot_exact_bytes", "hot_quantized_bytes", "disk_bytes", "hot_budget_bytes",
                        "hot_blocks", "warm_blocks", "cold_blocks", "snapshots", "snapshot_hot_bytes",
                        "snapshot_disk_bytes"):
                if key in body:
                    out[key] = body[key]
            data = body.get("data", [])
            out["agents"] = len(data)
            out["agent_tokens"] = {a["id"]: a.get("tokens") for a in data}
            out["agent_bytes"] = {a["id"]: a.get("bytes") for a in data}
    except (httpx.HTTPError, ValueError):
        pass
    try:
        r = httpx.get(root + "/metrics", timeout=30)
        if r.status_code == 200:
            for m in re.finditer(r'^agent_memory_cache_bytes\{tier="(\w+)"\}\s+(\S+)', r.text, re.M):
                out[f"metrics_{m.group(1)}_bytes"] = int(float(m.group(2)))
    except httpx.HTTPError:
        pass
    return out


def kv_precision_from_log(log: Path | None) -> str | None:
    """The precision agent-memory's hot tier cools blocks to ("KV cached as q4g64")."""
    try:
        m = re.findall(r"KV cached as (\w+)", log.read_text(errors="replace"))
    except (OSError, AttributeError):
        return None
    return m[-1] if m else None


def weights_dtype(model_dir: Path) -> str | None:
    """The dtype of the first tensor in the model's safetensors (its KV is computed at it)."""
    names = {"F32": "float32", "F16": "float16", "BF16": "bfloat16"}
    for path in sorted(model_dir.glob("*.safetensors")):
        try:
            with open(path, "rb") as f:
                header = json.loads(f.read(int.from_bytes(f.read(8), "little")))
        except (OSError, ValueError):
            continue
        for name, entry in header.items():
            if name != "__metadata__" and isinstance(entry, dict) and entry.get("dtype") in names:
                return names[entry["dtype"]]
    return None


def model_geometry(model_dir: str | None) -> dict:
    """KV bytes per token = layers x kv_heads x head_dim x 2 (K and V) x bytes per element."""
    if not model_dir:
        return {}
    try:
        cfg = json.loads((Path(model_dir) / "config.json").read_text())
    except (OSError, ValueError):
        return {}
    cfg = cfg.get("text_config", cfg)
    layers = cfg["num_hidden_layers"]
    heads = cfg["num_attention_heads"]
    kv_heads = cfg.get("num_key_value_heads", heads)
    head_dim = cfg.get("head_dim") or cfg["hidden_size"] // heads
    dtype = str(cfg.get("torch_dtype") or cfg.get("dtype") or weights_dtype(Path(model_dir)) or "float16")
    elem = 4 if "32" in dtype else 2
    return {"layers": layers, "kv_heads": kv_heads, "head_dim": head_dim, "dtype": dtype, "bytes_per_element": elem,
            "kv_bytes_per_token": layers * kv_heads * head_dim * 2 * elem,
            "context": cfg.get("max_position_embeddings")}


def quantized_kv_bytes(exact_kvb: int | None, precision: str | None, bytes_per_element: int) -> float | None:
    """KV bytes per token at a qBITSgGROUP precision (values plus a scale and bias per group)."""
    if exact_kvb and precision and precision.startswith("q"):
        bits, group = (int(x) for x in precision[1:].split("g"))
        return exact_kvb * (bits / 8 + 2 * bytes_per_element / group) / bytes_per_element
    return exact_kvb


def agents_tokens(main: list[Record]) -> dict[int, int]:
    """Each agent's tokens after its last turn (prompt and reply)."""
    last_of: dict[int, Record] = {}
    for r in main:
        if not r.error and r.prompt_tokens is not None:
            if r.agent not in last_of or r.turn > last_of[r.agent].turn:
                last_of[r.agent] = r
    return {a: r.prompt_tokens + (r.completion_tokens or 0) for a, r in last_of.items()}


def hot_bytes(cache: dict) -> tuple:
    """(all, exact, quantized) hot bytes as the server reported them after the turns."""
    hot = cache.get("hot_bytes", cache.get("metrics_hot_bytes"))
    exact = cache.get("hot_exact_bytes", cache.get("metrics_hot_exact_bytes"))
    quant = cache.get("hot_quantized_bytes", cache.get("metrics_hot_quantized_bytes"))
    if hot is None and exact is not None and quant is not None:
        hot = exact + quant
    return hot, exact, quant


def ideal_figures(unique: int, hot, exact, quant, exact_kvb: int, quant_kvb: float) -> dict:
    out = {"unique_tokens": unique, "ideal_hot_bytes_exact": unique * exact_kvb,
           "ideal_hot_bytes_quantized": unique * quant_kvb}
    held = None
    if exact is not None and quant is not None:
        held = exact / exact_kvb + quant / quant_kvb  # tokens held hot, at either precision
    elif hot is not None:
        held = hot / quant_kvb
    if held:
        out["hot_tokens_held"] = held
        # The ideal at the mix of precisions actually held.
        out["ideal_hot_bytes"] = unique * hot / held
        out["hot_over_ideal"] = held / unique
    return out


def hot_kv_figures(result: dict, records: list[Record], geometry: dict, precision: str | None) -> dict:
    """The run's hot-KV figures, from its requests, the cache state after the turns and the
    model's geometry."""
    main = [r for r in records if r.phase in ("first", "later")]
    ok_first = [r for r in main if r.phase == "first" and not r.error and r.agent > 0 and r.cached_tokens]
    shared = max([r.cached_tokens for r in ok_first] + [result.get("probe_shared_prefix_tokens") or 0]) or None
    totals = agents_tokens(main)
    first_prompt = [r.prompt_tokens for r in main if r.phase == "first" and r.prompt_tokens]
    exact_kvb = geometry.get("kv_bytes_per_token")  # as computed: the model's dtype
    quant_kvb = quantized_kv_bytes(exact_kvb, precision, geometry.get("bytes_per_element"))
    cache = result.get("cache_after_turns") or {}
    hot, exact, quant = hot_bytes(cache)
    out = {"tokens_first_prompt_median": pct(first_prompt, 0.5), "shared_prefix_tokens": shared,
           "kv_precision": precision or geometry.get("dtype"),
           "kv_bytes_per_token_exact": exact_kvb, "kv_bytes_per_token_quantized": quant_kvb,
           "hot_bytes": hot, "hot_exact_bytes": exact, "hot_quantized_bytes": quant,
           # Models with window or recurrent layers: their snapshots, a part of hot_bytes (and of disk).
           "snapshots": cache.get("snapshots"), "snapshot_hot_bytes": cache.get("snapshot_hot_bytes"),
           "snapshot_disk_bytes": cache.get("snapshot_disk_bytes")}
    if exact_kvb and totals:
        s = shared or 0
        out.update(ideal_figures(s + sum(t - s for t in totals.values()), hot, exact, quant, exact_kvb, quant_kvb))
        out["unshared_hot_bytes"] = sum(totals.values()) * exact_kvb
    return out

"""A run's numbers from its requests (TTFT, hit ratios, walls, per phase) and the medians over
repeated runs that every table reads (METRICS, aggregate)."""

from __future__ import annotations

import math
import statistics

from bench.turns import Record

PHASES = ("first", "later", "crash", "graceful")
RESTARTS = ("crash", "graceful")


def pct(values: list[float], q: float) -> float | None:
    if not values:
        return None
    v = sorted(values)
    k = (len(v) - 1) * q
    lo, hi = math.floor(k), math.ceil(k)
    return v[lo] + (v[hi] - v[lo]) * (k - lo)


def ttft_stats(records: list[Record]) -> dict:
    vals = [r.ttft for r in records if r.ttft is not None and not r.error]
    return {"median": pct(vals, 0.5), "p90": pct(vals, 0.9), "n": len(vals)}


def hit_ratio(records: list[Record], field_name: str = "cached_tokens") -> float | None:
    ok = [r for r in records if not r.error and r.prompt_tokens]
    if not ok or any(getattr(r, field_name) is None for r in ok):
        return None  # the server does not report cached tokens
    return sum(getattr(r, field_name) for r in ok) / sum(r.prompt_tokens for r in ok)


def ratio(a, b) -> float | None:
    return a / b if a is not None and b not in (None, 0) else None


def summarize(records: list[Record], walls: dict[str, float]) -> dict:
    """records: every request of a run; walls: seconds of each phase ("turns", "crash", "graceful")."""
    of = {p: [r for r in records if r.phase == p] for p in PHASES}
    main = of["first"] + of["later"]
    ok = [r for r in main if not r.error]
    completion = sum(r.completion_tokens or 0 for r in ok)
    agent0 = [r for r in of["first"] if r.agent == 0 and r.ttft is not None]
    wall = walls.get("turns")
    out = {
        "wall_s": wall,
        "phase_wall_s": walls,
        # The whole workload: the turns, then one more turn each after a restart.
        "workload_wall_s": {k: wall + walls[k] if wall is not None and walls.get(k) is not None else None
                            for k in RESTARTS},
        "requests": len(records),
        "errors": sum(1 for r in records if r.error),
        "ttft": {**{p: ttft_stats(of[p]) for p in PHASES}, "cold_agent0": agent0[0].ttft if agent0 else None},
        "output_tok_s": completion / wall if wall else None,
        "completion_tokens": completion,
        "prompt_tokens": sum(r.prompt_tokens or 0 for r in ok),
        "cached_tokens": sum(r.cached_tokens or 0 for r in ok),
        "hit_ratio": {"all": hit_ratio(main), **{p: hit_ratio(of[p]) for p in PHASES}},
        "log_hit_ratio": {"all": hit_ratio(main, "log_cached_tokens"),
                          **{p: hit_ratio(of[p], "log_cached_tokens") for p in PHASES}},
    }
    t = out["ttft"]
    out["ratios"] = {
        "cold_over_later": ratio(t["first"]["median"], t["later"]["median"]),
        **{f"cold_over_{k}": ratio(t["first"]["median"], t[k]["median"]) for k in RESTARTS},
        "cold_agent0_over_later": ratio(t["cold_agent0"], t["later"]["median"]),
        **{f"cold_agent0_over_{k}": ratio(t["cold_agent0"], t[k]["median"]) for k in RESTARTS},
    }
    return out



def median_of(runs: list[dict], getter) -> float | None:
    vals = []
    for r in runs:
        try:
            v = getter(r)
        except (KeyError, TypeError):
            v = None
        if v is not None:
            vals.append(v)
    return statistics.median(vals) if vals else None


METRICS = {
    "wall_s": lambda r: r["wall_s"],
    "workload_wall_crash_s": lambda r: r["workload_wall_s"]["crash"],
    "workload_wall_graceful_s": lambda r: r["workload_wall_s"]["graceful"],
    "ttft_cold_agent0": lambda r: r["ttft"]["cold_agent0"],
    "output_tok_s": lambda r: r["output_tok_s"],
    "peak_rss_bytes": lambda r: r["peak_rss_bytes"],
    "hot_bytes": lambda r: r["hot_bytes"],
    "hot_exact_bytes": lambda r: r.get("hot_exact_bytes"),
    "hot_quantized_bytes": lambda r: r.get("hot_quantized_bytes"),
    "ideal_hot_bytes": lambda r: r.get("ideal_hot_bytes"),
    "ideal_hot_bytes_exact": lambda r: r.get("ideal_hot_bytes_exact"),
    "ideal_hot_bytes_quantized": lambda r: r.get("ideal_hot_bytes_quantized"),
    "snapshots": lambda r: r.get("snapshots"),
    "snapshot_hot_bytes": lambda r: r.get("snapshot_hot_bytes"),
    "snapshot_disk_bytes": lambda r: r.get("snapshot_disk_bytes"),
    "errors": lambda r: r["errors"],
    "first_prompt_tokens": lambda r: r["tokens_first_prompt_median"],
    "crash_load_s": lambda r: r.get("crash_load_s"),
    "graceful_load_s": lambda r: r.get("graceful_load_s"),
}
for _p in PHASES:
    METRICS[f"ttft_{_p}_median"] = lambda r, p=_p: r["ttft"][p]["median"]
    METRICS[f"ttft_{_p}_p90"] = lambda r, p=_p: r["ttft"][p]["p90"]
    METRICS[f"hit_ratio_{_p}"] = lambda r, p=_p: r["hit_ratio"][p]
    METRICS[f"log_hit_ratio_{_p}"] = lambda r, p=_p: r["log_hit_ratio"][p]
for _k in RESTARTS:
    METRICS[f"cold_over_{_k}"] = lambda r, k=_k: r["ratios"][f"cold_over_{k}"]
METRICS["hit_ratio_all"] = lambda r: r["hit_ratio"]["all"]
METRICS["log_hit_ratio_all"] = lambda r: r["log_hit_ratio"]["all"]
METRICS["cold_over_later"] = lambda r: r["ratios"]["cold_over_later"]


def aggregate(runs: list[dict]) -> dict:
    return {name: median_of(runs, get) for name, get in METRICS.items()} | {"runs": len(runs)}


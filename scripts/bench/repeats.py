"""The plain benchmark: the workload --repeats times on every server, alternating (ours,
mlx-lm, vllm-mlx, ours, ...), then every table of the report."""

from __future__ import annotations

from pathlib import Path

from bench.peers import PEERS
from bench.report import cold_table, compare_table, fmt, table, targets
from bench.restarts import restart_plan
from bench.stats import aggregate
from bench.trace import trace_table
from bench.workload import clip_history, run_workload


def snapshot_line(ours: dict) -> str:
    return (f"ours after the turns: hot {ours['hot_bytes'] / 2**20:.2f} MiB, of which "
            f"{ours['snapshots']:.0f} snapshots {ours['snapshot_hot_bytes'] / 2**20:.2f} MiB; snapshots "
            f"on disk {ours['snapshot_disk_bytes'] / 2**20:.2f} MiB")


def footer(args, runs: list[dict], history: int, ours_code: str | None) -> str:
    """The workload's settings, the KV bytes per token and each run's load average."""
    r0 = next((r for r in runs if r["server"] == "ours"), runs[0] if runs else {})
    kvb, kvq = r0.get("kv_bytes_per_token_exact"), r0.get("kv_bytes_per_token_quantized")
    return (f"{args.agents} agents x {args.turns} turns, think {args.think:g}s (+1 turn after each of: "
            f"{', '.join(restart_plan(args)) or 'no restart'}; crash {args.crash_delay:g}s after the last "
            f"turn), history {history} tokens, shared system ~{args.system_tokens} tokens (shared prefix "
            f"seen: {fmt(r0.get('shared_prefix_tokens'))}), max_tokens {args.max_tokens}, stagger "
            f"{args.stagger}s; KV bytes/token {fmt(kvb)} exact" +
            (f", {fmt(kvq, digits=0)} {r0.get('kv_precision')} (cooled)" if kvq and kvq != kvb else "") +
            f"; ours: {ours_code} ({args.ours_dir})"
            "; load average per run: " + ", ".join(f"{r['tag']} {r.get('uptime')}" for r in runs))


def comparisons(args, summary: dict, out: dict) -> str:
    """Ours against the peers, against the baseline and variants, the targets (into `out` too)."""
    text = ""
    cmp_text, ratios = compare_table(summary, list(PEERS))
    if cmp_text:
        text += "\n\n" + cmp_text
        out["ratios_ours_over_peer"] = ratios
    own_text, own_ratios = compare_table(summary, list(args.ours_like))
    if own_text:
        text += f"\n\nours against {args.baseline or 'the baseline'} and the variants\n\n" + own_text
        out["ratios_ours_over_own"] = own_ratios
    tgt_text, tgt_rows = targets(summary)
    if tgt_text:
        text += "\n\n" + tgt_text
        out["targets"] = tgt_rows
    return text


def run_repeats(args, servers: list[str], work_dir: Path, out: dict) -> None:
    """Every run, the summary per server, and the report's text, into `out`."""
    history = clip_history(args, args.history_tokens, args.turns)
    runs = []
    for rep in range(args.repeats):
        for kind in servers:  # alternating: ours, mlx-lm, vllm-mlx, ours, ...
            runs.append(run_workload(kind, args, args.agents, args.turns, history, work_dir, f"{kind}-r{rep}"))
    out["runs"] = runs
    summary = {k: aggregate([r for r in runs if r["server"] == k]) for k in servers}
    out["summary"] = summary
    text = table(summary)
    if history:
        text += "\n\n" + cold_table(summary)
    if (ours := summary.get("ours")) and ours.get("snapshots"):
        text += "\n\n" + snapshot_line(ours)
    text += comparisons(args, summary, out)
    levers = [r["levers"] for r in runs if r.get("levers")]
    if levers:
        out["levers"] = levers
        for i, lv in enumerate(levers):
            text += f"\n\nours, run {i + 1}: where the time goes (medians, ms, server clock)\n\n" + trace_table(lv)
    text += "\n\n" + footer(args, runs, history, out.get("ours_code"))
    print("\n" + text)
    out["table"] = text

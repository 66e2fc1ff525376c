"""--scale: the workload on every server while agents grow, then while each agent's history
grows; a table and plots (matplotlib) of TTFT and memory against both."""

from __future__ import annotations

import math
import sys
from pathlib import Path

from bench.peers import SERVERS
from bench.report import fmt, hit_cell, hot_cell, mb
from bench.stats import aggregate
from bench.workload import clip_history, run_workload


COLORS = {"ours": "tab:blue", "mlx-lm": "tab:orange", "vllm-mlx": "tab:green", "external": "tab:gray"}


def plot_scale(points: list[dict], plot_dir: Path) -> list[str]:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    plot_dir.mkdir(parents=True, exist_ok=True)
    written = []
    for axis, xkey, xlabel in (("agents", "agents", "agents"), ("history", "history_tokens", "history tokens per agent")):
        pts = [p for p in points if p["axis"] == axis]
        if not pts:
            continue
        fig, (ax1, ax2) = plt.subplots(1, 2, figsize=(11, 4.2))
        for server in SERVERS + ("external",):
            color = COLORS[server]
            sp = sorted((p for p in pts if p["server"] == server), key=lambda p: p[xkey])
            if not sp:
                continue
            xs = [p[xkey] for p in sp]
            for metric, style, label in (("ttft_later_median", "-o", "later turns"),
                                         ("ttft_crash_median", "--s", "after a crash"),
                                         ("ttft_graceful_median", "-.d", "after a graceful restart"),
                                         ("ttft_first_median", ":^", "first turn")):
                ys = [p.get(metric) for p in sp]
                if any(y is not None for y in ys):
                    ax1.plot(xs, [math.nan if y is None else y for y in ys], style, color=color,
                             label=f"{server}: {label}")
            ax2.plot(xs, [(p["peak_rss_bytes"] or math.nan) / 2**20 for p in sp], "-o", color=color,
                     label=f"{server}: peak RSS")
            if server == "ours":
                exact = [(p.get("hot_exact_bytes") or 0) / 2**20 for p in sp]
                quant = [(p.get("hot_quantized_bytes") or 0) / 2**20 for p in sp]
                ax2.plot(xs, [(e + q) or math.nan for e, q in zip(exact, quant)], "--s", color=color,
                         label="ours: hot KV, all")
                exact, quant = [e or math.nan for e in exact], [q or math.nan for q in quant]  # log scale: 0 not drawn
                ax2.plot(xs, exact, "--^", color="tab:cyan", label="ours: hot KV exact (as computed)")
                ax2.plot(xs, quant, "--v", color="tab:purple", label="ours: hot KV quantized (cooled)")
                ax2.plot(xs, [(p.get("ideal_hot_bytes_exact") or math.nan) / 2**20 for p in sp], ":", color="gray",
                         label="ideal KV, all exact (shared prefix once)")
                ax2.plot(xs, [(p.get("ideal_hot_bytes_quantized") or math.nan) / 2**20 for p in sp], ":",
                         color="silver", label="ideal KV, all quantized")
        ax1.set(xlabel=xlabel, ylabel="TTFT median (s)", title=f"Time to first token vs {xlabel}")
        ax1.set_yscale("log")
        ax2.set(xlabel=xlabel, ylabel="MiB", title=f"Server memory vs {xlabel}")
        ax2.set_yscale("log")
        for ax in (ax1, ax2):
            if axis == "agents":
                ax.set_xscale("log", base=2)
            ax.grid(alpha=0.3)
            ax.legend(fontsize=7)
        fig.tight_layout()
        path = plot_dir / f"bench_scale_{axis}.png"
        fig.savefig(path, dpi=110)
        plt.close(fig)
        written.append(str(path))
    return written


def scale_point(args, kind: str, axis: str, n: int, h: int, work_dir: Path) -> tuple[dict, dict]:
    """One server at one point of an axis: its run and its point (medians)."""
    tag = f"scale-{axis}-{n}a-{h}h-{kind}"
    r = run_workload(kind, args, n, args.scale_turns, h, work_dir, tag)
    agg = aggregate([r])
    print(f"    TTFT later {fmt(agg['ttft_later_median'])}s, after crash "
          f"{fmt(agg['ttft_crash_median'])}s, after graceful {fmt(agg['ttft_graceful_median'])}s, "
          f"peak RSS {mb(agg['peak_rss_bytes'])} MB, hot {mb(agg['hot_exact_bytes'])} exact + "
          f"{mb(agg['hot_quantized_bytes'])} quantized MB, errors {agg['errors']}", flush=True)
    return r, {"axis": axis, "server": kind, "agents": n, "history_tokens": h, "uptime": r.get("uptime"), **agg}


def scale_table(points: list[dict]) -> str:
    lines = ["| axis | server | agents | history | TTFT first | TTFT later | TTFT after crash | "
             "TTFT after graceful | hit later | peak RSS MB | hot MB exact + Q / ideal | load at start | "
             "errors |", "|---|---|---|---|---|---|---|---|---|---|---|---|---|"]
    for pt in points:
        lines.append(f"| {pt['axis']} | {pt['server']} | {pt['agents']} | {pt['history_tokens']} | "
                     f"{fmt(pt['ttft_first_median'])} | {fmt(pt['ttft_later_median'])} | "
                     f"{fmt(pt['ttft_crash_median'])} | {fmt(pt['ttft_graceful_median'])} | "
                     f"{hit_cell(pt, 'later')} | {mb(pt['peak_rss_bytes'])} | {hot_cell(pt)} | "
                     f"{pt['uptime'].split()[0] if pt.get('uptime') else 'n/a'} | "
                     f"{fmt(pt['errors'], digits=0)} |")
    return "\n".join(lines)


def run_scale(args, servers: list[str], work_dir: Path, out: dict) -> None:
    """Every point of both axes on every server, into `out` (runs, points, table, plots)."""
    points, runs = [], []
    grid = [("agents", n, args.scale_agents_history) for n in args.scale_agents]
    grid += [("history", args.scale_history_agents, h) for h in args.scale_history]
    for axis, n, h in grid:
        h = clip_history(args, h, args.scale_turns)
        for kind in servers:
            r, point = scale_point(args, kind, axis, n, h, work_dir)
            runs.append(r)
            points.append(point)
    out["scale"] = points
    out["runs"] = runs
    text = scale_table(points)
    print("\n" + text)
    out["table"] = text
    try:
        out["plots"] = plot_scale(points, args.plot_dir)
        print("plots: " + ", ".join(out["plots"]))
    except ImportError:
        print("matplotlib is not installed: no plots", file=sys.stderr)

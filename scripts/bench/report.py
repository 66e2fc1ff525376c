"""The tables printed at the end of a run: every server's numbers, cold against warm, ours
against the peers (or against the baseline and variants), and the issue's targets, each against
the peers (or the baseline) it names, met or not."""

from __future__ import annotations

from bench.peers import BASE, PEERS
from bench.stats import RESTARTS, ratio


def fmt(v, unit: str = "", digits: int = 2) -> str:
    if v is None:
        return "n/a"
    if isinstance(v, float):
        return f"{v:.{digits}f}{unit}"
    return f"{v}{unit}"


def mb(v) -> str:
    return "n/a" if v is None else f"{v / 2**20:.0f}"


def hit_cell(s: dict, phase: str) -> str:
    """Cached/prompt tokens as the API reports them; where it reports none, n/a (and what the
    server's own log says, in parentheses, where it says anything)."""
    v, log = s.get(f"hit_ratio_{phase}"), s.get(f"log_hit_ratio_{phase}")
    if v is None and log is not None:
        return f"n/a (log {log:.2f})"
    return fmt(v)


def hot_cell(s: dict) -> str:
    if s.get("hot_exact_bytes") is not None:
        return f"{mb(s['hot_exact_bytes'])} + {mb(s['hot_quantized_bytes'])} / {mb(s['ideal_hot_bytes'])}"
    return f"{mb(s['hot_bytes'])} / {mb(s['ideal_hot_bytes'])}"


def table(summary: dict[str, dict]) -> str:
    head = ("| server | runs | prompt tok (1st) | wall s (turns) | TTFT first med / p90 | TTFT later med / p90 | "
            "TTFT after crash med / p90 | TTFT after graceful med / p90 | out tok/s | hit later | hit crash | "
            "hit graceful | ready s crash / graceful | peak RSS MB | hot MB exact + Q / ideal | errors |")
    lines = [head, "|" + "---|" * (head.count("|") - 1)]
    for name, s in summary.items():
        lines.append(
            f"| {name} | {s['runs']} | {fmt(s['first_prompt_tokens'], digits=0)} | {fmt(s['wall_s'], digits=1)} | "
            f"{fmt(s['ttft_first_median'])} / {fmt(s['ttft_first_p90'])} | "
            f"{fmt(s['ttft_later_median'])} / {fmt(s['ttft_later_p90'])} | "
            f"{fmt(s['ttft_crash_median'])} / {fmt(s['ttft_crash_p90'])} | "
            f"{fmt(s['ttft_graceful_median'])} / {fmt(s['ttft_graceful_p90'])} | {fmt(s['output_tok_s'], digits=1)} | "
            f"{hit_cell(s, 'later')} | {hit_cell(s, 'crash')} | {hit_cell(s, 'graceful')} | "
            f"{fmt(s['crash_load_s'], digits=1)} / {fmt(s['graceful_load_s'], digits=1)} | {mb(s['peak_rss_bytes'])} | "
            f"{hot_cell(s)} | {fmt(s['errors'], digits=0)} |")
    return "\n".join(lines)


def cold_table(summary: dict[str, dict]) -> str:
    lines = ["| server | TTFT cold (1st turn) | TTFT cold agent 0 | TTFT warm (next turn) | TTFT after crash | "
             "TTFT after graceful restart | cold / warm | cold / after crash | cold / after graceful |",
             "|---|---|---|---|---|---|---|---|---|"]
    for name, s in summary.items():
        lines.append(f"| {name} | {fmt(s['ttft_first_median'])} | {fmt(s['ttft_cold_agent0'])} | "
                     f"{fmt(s['ttft_later_median'])} | {fmt(s['ttft_crash_median'])} | "
                     f"{fmt(s['ttft_graceful_median'])} | {fmt(s['cold_over_later'], 'x', 1)} | "
                     f"{fmt(s['cold_over_crash'], 'x', 1)} | {fmt(s['cold_over_graceful'], 'x', 1)} |")
    return "\n".join(lines)


COMPARED = [
    ("workload_wall_crash_s", "workload wall s (turns + turn after a crash)"),
    ("workload_wall_graceful_s", "workload wall s (turns + turn after a graceful restart)"),
    ("wall_s", "wall s, turns only"),
    ("ttft_first_median", "first-turn TTFT median"),
    ("ttft_later_median", "later-turn TTFT median"),
    ("ttft_crash_median", "TTFT median after a crash"),
    ("ttft_graceful_median", "TTFT median after a graceful restart"),
    ("output_tok_s", "output tok/s"),
    ("hit_ratio_later", "hit ratio, later turns"),
    ("hit_ratio_crash", "hit ratio after a crash"),
    ("hit_ratio_graceful", "hit ratio after a graceful restart"),
    ("peak_rss_bytes", "peak server RSS"),
]


def compare_table(summary: dict[str, dict], others: list[str]) -> tuple[str, dict]:
    """Ours against each of `others` (the peers; or the baseline and variants), metric by metric."""
    ours = summary.get("ours")
    peers = [k for k in others if k in summary and k != "ours"]
    if not ours or not peers:
        return "", {}
    ratios = {p: {k: ratio(ours[k], summary[p][k]) for k, _ in COMPARED} for p in peers}
    head = "| metric | ours | " + " | ".join(peers) + " | " + " | ".join(f"ours / {p}" for p in peers) + " |"
    lines = [head, "|" + "---|" * (head.count("|") - 1)]
    for k, label in COMPARED:
        cells = []
        for name in ["ours"] + peers:
            v = summary[name][k]
            if k == "peak_rss_bytes":
                cells.append(mb(v) + " MB" if v is not None else "n/a")
            elif k.startswith("hit_ratio") and v is None:
                cells.append(hit_cell(summary[name], k.removeprefix("hit_ratio_")))
            else:
                cells.append(fmt(v, digits=3 if k.startswith("hit") else 2))
        lines.append(f"| {label} | " + " | ".join(cells) + " | " +
                     " | ".join(fmt(ratios[p][k], "x", 2) for p in peers) + " |")
    return "\n".join(lines), ratios


def targets(summary: dict[str, dict]) -> tuple[str, list[dict]]:
    """The issue's targets, each against the peers it names, with the numbers."""
    ours = summary.get("ours")
    peers = [k for k in PEERS if k in summary]
    if not ours or not (peers or BASE in summary):
        return "", []
    rows = []

    def add(name: str, value, limit: float, better: str, against: str) -> None:
        met = None if value is None else (value <= limit if better == "<=" else value >= limit)
        rows.append({"target": name, "against": against, "value": value, "limit": limit, "met": met})

    for p in peers:
        add("later-turn TTFT ≤ 0.4× each peer's", ratio(ours["ttft_later_median"], summary[p]["ttft_later_median"]),
            0.4, "<=", p)
    for kind in RESTARTS:
        key = f"workload_wall_{kind}_s"
        vals = {p: summary[p][key] for p in peers if summary[p][key] is not None}
        if vals:
            fastest = min(vals, key=vals.get)
            add(f"workload wall time (turns + turn after a {'crash' if kind == 'crash' else 'graceful restart'}) "
                "≤ 0.6× the faster peer's", ratio(ours[key], vals[fastest]), 0.6, "<=", fastest)
    for p in peers:
        add("after a crash, TTFT ≥ 10× better than each peer's",
            ratio(summary[p]["ttft_crash_median"], ours["ttft_crash_median"]), 10.0, ">=", p)
    if "vllm-mlx" in summary:
        add("after a graceful restart, TTFT no worse than vllm-mlx's",
            ratio(ours["ttft_graceful_median"], summary["vllm-mlx"]["ttft_graceful_median"]), 1.0, "<=", "vllm-mlx")
    if BASE in summary:
        add("later-turn TTFT ≤ 0.8× the baseline's", ratio(ours["ttft_later_median"], summary[BASE]["ttft_later_median"]),
            0.8, "<=", BASE)
    rss = {p: summary[p]["peak_rss_bytes"] for p in peers if summary[p]["peak_rss_bytes"]}
    if rss:
        smaller = min(rss, key=rss.get)
        add("peak RSS ≤ 0.6× the smaller peer's", ratio(ours["peak_rss_bytes"], rss[smaller]), 0.6, "<=", smaller)
    lines = ["| target | against | measured | met |", "|---|---|---|---|"]
    for r in rows:
        shown = fmt(r["value"], "×", 2)
        lines.append(f"| {r['target']} | {r['against']} | {shown} | "
                     f"{'n/a' if r['met'] is None else ('yes' if r['met'] else '**no**')} |")
    return "\n".join(lines), rows

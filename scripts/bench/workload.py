"""One run of the workload on one server: (start it) -> agents x turns -> a crash, one more
turn each -> a graceful restart, one more turn each; then its figures: vllm-mlx's own log count
matched to the requests, the summary of its requests, its peak memory, its logs and traces
(--trace), its hot KV, every request."""

from __future__ import annotations

import sys
from dataclasses import asdict
from pathlib import Path

from bench.kv_memory import hot_kv_figures, kv_precision_from_log, model_geometry
from bench.peers import vllm_log_fetches
from bench.restarts import restart_phases, restart_plan
from bench.run import Run, open_run
from bench.stats import summarize
from bench.trace import analyze_trace, read_trace


def match_vllm_log(run: Run) -> None:
    """vllm-mlx's own log's count, per start, matched to the requests of the phase by prompt length."""
    for log, phases in zip(run.server.process.logs, run.phase_of_start):
        fetches = vllm_log_fetches(log)
        for r in run.records:
            if r.phase in phases and r.prompt_tokens is not None:
                hit = next((f for f in fetches if f[0] == r.prompt_tokens), None)
                if hit is not None:
                    fetches.remove(hit)
                    r.log_cached_tokens = hit[1]


def finish(run: Run) -> dict:
    server, result = run.server, run.result
    if run.kind == "vllm-mlx" and server:
        match_vllm_log(run)
    result.update(summarize(run.records, run.walls))
    result["peak_rss_bytes"] = max(run.peaks) if run.peaks and max(run.peaks) else None
    result["log"] = [str(p) for p in server.process.logs] if server else None
    if server and server.traces:
        result["trace"] = [str(p) for p in server.traces]
        result["levers"] = analyze_trace(read_trace(server.traces), run.phase_of_start, run.records)
    ours = server and run.kind in run.args.ours_like
    precision = kv_precision_from_log(server.process.logs[0]) if ours else None
    result.update(hot_kv_figures(result, run.records, result["geometry"], precision))
    result["records"] = [asdict(r) for r in run.records]
    return result


def run_workload(kind: str, args, agents_n: int, turns: int, history_tokens: int, work_dir: Path,
                 tag: str) -> dict:
    run = open_run(kind, args, agents_n, turns, history_tokens, work_dir, tag)
    try:
        run.turns_phase(turns)
        restart_phases(run, turns)
    finally:
        run.close()
    return finish(run)


def clip_history(args, history: int, turns: int) -> int:
    """The history per agent, cut so that the whole workload fits the model's context."""
    ctx = model_geometry(args.model or args.model_dir).get("context")
    if not ctx:
        return history
    need = args.system_tokens + 64 + (turns + 1 + len(restart_plan(args))) * (args.max_tokens + 40)
    if history + need > ctx:
        clipped = max(0, ctx - need)
        print(f"note: history {history} + ~{need} workload tokens exceed the model's context ({ctx}); "
              f"using {clipped}", file=sys.stderr)
        return clipped
    return history

"""The restart phases after the turns: a crash (SIGKILL, --crash-delay seconds after the last
turn ended, as an OOM kill or a power cut would), then a graceful restart (SIGTERM), each on the
same cache folder and followed by one more turn of every agent."""

from __future__ import annotations

import time

from bench.kv_memory import fetch_cache_state
from bench.run import Run


def restart_plan(args) -> list[str]:
    if args.no_restart or args.restart == "none":
        return []
    return ["crash", "graceful"] if args.restart == "both" else [args.restart]


def restart_phase(run: Run, n: int, mode: str, turns: int) -> None:
    """Stop the server as `mode` says, start it again, and let every agent take turn `turns + n`."""
    if mode == "crash":
        # As an OOM kill or a power cut would: a few seconds after the last turn ended.
        time.sleep(max(0.0, run.args.crash_delay - (time.monotonic() - run.last_turn_end)))
        run.result["crash_delay_s"] = time.monotonic() - run.last_turn_end
    run.server.stop(mode)
    run.server.start(run.args.start_timeout)
    run.follow_server()
    load_s = run.server.process.load_s
    run.result[f"{mode}_load_s"] = load_s
    run.warm_up()
    print(f"  [{run.tag}] {run.kind}: after a {mode} restart (ready in {load_s:.1f}s), one more turn each ...",
          flush=True)
    run.walls[mode] = run.phase(1, lambda t, m=mode: m, turns + n)
    run.phase_of_start.append([mode])
    run.result[f"cache_after_{mode}"] = fetch_cache_state(run.root)
    run.stop_sampler()


def restart_phases(run: Run, turns: int) -> None:
    plan = restart_plan(run.args) if run.server else []
    if not plan:
        run.result["restart_skipped"] = "external server" if run.kind == "external" else "--no-restart"
    for n, mode in enumerate(plan):
        restart_phase(run, n, mode, turns)

#!/usr/bin/env python3
"""Multi-agent benchmark for OpenAI-compatible servers: agent-memory against mlx-lm's server and vllm-mlx.

The workload: N agents x M turns. Every agent's system message is one shared ~1,000-token
document (tool descriptions and an operating policy, generated here deterministically) plus a
persona line of its own; optionally a pre-existing conversation (`--history-tokens`). Agent i
starts after i x `--stagger` seconds and then runs its turns, `--think` seconds apart, each
turn appending the user's message and the assistant's reply. Greedy decoding, streaming with
usage, so every request yields its time to first token (TTFT) and
`usage.prompt_tokens_details.cached_tokens` (n/a where a server does not report it). The agent
id goes out as `prompt_cache_key` and as `X-Agent-Id`.

When the script starts the servers itself it then restarts each on the same cache folder,
twice, and lets every agent take one more turn after each restart: first a crash (SIGKILL,
`--crash-delay` seconds after the last turn, as an OOM kill or a power cut would), then a
graceful restart (SIGTERM). agent-memory reloads its agents from disk; mlx-lm's server keeps
prompt caches in memory only; vllm-mlx saves its RAM prefix cache to ~/.cache/vllm-mlx when
it is stopped gracefully (here a private HOME inside its cache folder) and reloads it at start.

The three servers, started here on the same model folder, each in its own process, with
Debian's OpenBLAS for MLX's CPU matmuls (agent-memory loads it itself; the others get it
through LD_PRELOAD), HF_HUB_OFFLINE=1:

    ours      python -m agent_memory serve (its defaults)
    mlx-lm    python -m mlx_lm server (its defaults: prompt cache in RAM)
    vllm-mlx  vllm-mlx serve --continuous-batching --enable-prefix-cache --ssd-cache-dir DIR
              (0.6.0, in its own venv .venv-peers/vllm-mlx, created on first use, or with
              `--setup-vllm-mlx`: pip install --no-deps vllm-mlx==0.6.0 plus mlx[cpu],
              mlx-lm>=0.31.3,<0.32 and its server's imports; no torch)

    # one server, started here on the demo model
    .venv/bin/python scripts/bench_agents.py --serve ours
    # all three servers, alternating, same workload, ratios ours/peer and the targets
    .venv/bin/python scripts/bench_agents.py --compare --repeats 2 --json bench.json
    # 12 agents x 3 turns, 5 s think time between an agent's turns
    .venv/bin/python scripts/bench_agents.py --compare --repeats 2 --agents 12 --turns 3 --think 5
    # the guard against a regression: this checkout against an older commit (and a variant), alternating
    .venv/bin/python scripts/bench_agents.py --baseline b088a13 --variant spec-off='--speculation off' \
        --repeats 2 --agents 12 --turns 3 --think 5 --max-tokens 32
    # where our server's time goes (queue, disk reads, prefill, writes), from its --trace-file
    .venv/bin/python scripts/bench_agents.py --serve ours --trace
    # returning agents with a 2,000-token history: cold vs warm vs after restart
    .venv/bin/python scripts/bench_agents.py --serve ours --history-tokens 2000
    # any running server (no restart phase)
    .venv/bin/python scripts/bench_agents.py --base-url http://127.0.0.1:8000/v1
    # grow agents and history; plots into docs/img
    .venv/bin/python scripts/bench_agents.py --scale --compare --scale-agents 8,32 --scale-history 1000,4000

Only the standard library, httpx and (for --scale plots) matplotlib. The parts live in
scripts/bench/ (the workload's text and turns, the servers and their starts, the statistics,
the report and targets, --trace, --scale); this file is the entry point.
"""

from __future__ import annotations

import json
import shutil
import signal
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))  # scripts/bench, also when loaded by file path

from bench.servers import add_baseline, code_version, drop_baseline  # noqa: E402
from bench.options import parse_args, server_list  # noqa: E402
from bench.peers import ensure_vllm_mlx, vllm_log_fetches  # noqa: E402
from bench.processes import load_average  # noqa: E402
from bench.repeats import run_repeats  # noqa: E402
from bench.restarts import restart_plan  # noqa: E402
from bench.scale import run_scale  # noqa: E402
from bench.report import targets  # noqa: E402

# What tests/test_bench_agents.py and the other scripts read from this entry point.
__all__ = ["main", "parse_args", "restart_plan", "server_list", "targets", "vllm_log_fetches"]


def servers_of(args) -> list[str]:
    if args.base_url:
        return ["external"]
    return list(args.serve)


def _exit_on_signal(signum, frame) -> None:
    raise SystemExit(128 + signum)  # unwinds through the finally blocks that stop the servers


def start_out(args, argv: list[str]) -> dict:
    """The JSON document's head: how the benchmark was called and on what."""
    return {"argv": argv, "model": args.model or args.model_dir, "started": time.strftime("%FT%T%z"),
            "load_average_at_start": load_average(), "ours_code": code_version(args),
            "settings": {k: (str(v) if isinstance(v, Path) else v) for k, v in vars(args).items()}}


def save_and_clean(args, out: dict, work_dir: Path, baseline: Path | None, failed: bool) -> None:
    if args.json:
        args.json.parent.mkdir(parents=True, exist_ok=True)
        args.json.write_text(json.dumps(out, indent=1, default=str))
        print(f"json: {args.json}")
    drop_baseline(baseline)
    if not args.keep and not failed and not args.work_dir:
        shutil.rmtree(work_dir, ignore_errors=True)
    elif failed:
        print(f"work dir kept (logs): {work_dir}", file=sys.stderr)


def main(argv=None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    args = parse_args(argv)
    if args.setup_vllm_mlx:
        print(ensure_vllm_mlx(args.vllm_venv))
        return 0
    if "vllm-mlx" in (args.serve or []):
        ensure_vllm_mlx(args.vllm_venv, install=not args.no_install)  # before any run, not in the middle
    signal.signal(signal.SIGTERM, _exit_on_signal)
    signal.signal(signal.SIGINT, signal.default_int_handler)  # even when started in the background
    work_dir = args.work_dir or Path(tempfile.mkdtemp(prefix="bench-agents-"))
    work_dir.mkdir(parents=True, exist_ok=True)
    print(f"work dir: {work_dir}", flush=True)
    baseline = add_baseline(args, work_dir)
    out = start_out(args, argv)
    failed = False
    try:
        (run_scale if args.scale else run_repeats)(args, servers_of(args), work_dir, out)
        failed = any(r["errors"] for r in out.get("runs", []))
    except BaseException:
        failed = True
        raise
    finally:
        save_and_clean(args, out, work_dir, baseline, failed)
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())

"""bench_agents' command line: its flags, the server names they take, and the checks between
them (--compare, --baseline and --variant fill in the servers to run)."""

from __future__ import annotations

import argparse
import shlex
import sys
from pathlib import Path

from bench.peers import ALIASES, BASE, PEERS, SERVERS, VLLM_MLX_VENV, OursCode
from bench.server import DEMO_MODEL, REPO

def int_list(s: str) -> list[int]:
    return [int(float(x)) for x in s.split(",") if x.strip()]


def server_list(s: str) -> list[str]:
    out = []
    for name in s.split(","):
        name = ALIASES.get(name.strip(), name.strip())
        if name == "both":
            out += ["ours", "mlx-lm"]
        elif name == "all":
            out += list(SERVERS)
        elif name in SERVERS:
            out.append(name)
        elif name:
            raise argparse.ArgumentTypeError(f"unknown server {name!r} (ours, mlx-lm, vllm-mlx, both, all)")
    return list(dict.fromkeys(out))


DESCRIPTION = "Multi-agent benchmark for OpenAI-compatible servers: agent-memory against mlx-lm's server and vllm-mlx."


def add_server_flags(g) -> None:
    """Which servers run, and how each is started."""
    g.add_argument("--serve", type=server_list, default=None, metavar="LIST",
                   help="start these servers here, comma-separated: ours, mlx-lm (or peer), vllm-mlx, both "
                        "(ours,mlx-lm), all (default: ours, unless --base-url is given)")
    g.add_argument("--compare", action="store_true", help="ours and --peers (default: all three)")
    g.add_argument("--peers", type=server_list, default=list(PEERS), metavar="LIST",
                   help="with --compare: the peers (default mlx-lm,vllm-mlx)")
    g.add_argument("--base-url", help="benchmark a running server instead (no restart phase)")
    g.add_argument("--server-pid", type=int, help="with --base-url: its PID, to sample memory")
    g.add_argument("--model", default=None, help=f"model folder for the started servers (default {DEMO_MODEL})")
    g.add_argument("--model-dir", default=None, help="with --base-url: model folder to read config.json from")
    g.add_argument("--model-name", default=None, help="'model' field sent (default: the folder's name)")
    g.add_argument("--api-key", default="unused")
    g.add_argument("--ours-cmd", default=f"{shlex.quote(sys.executable)} -m agent_memory serve")
    g.add_argument("--ours-args", default="", help="extra flags for agent-memory serve, e.g. '--hot-budget-mb 512'")
    g.add_argument("--ours-dir", type=Path, default=REPO,
                   help="the checkout whose agent_memory our server runs (default this one; e.g. a git worktree "
                        "of a commit, unaffected by edits in progress here)")
    g.add_argument("--peer-cmd", default=f"{shlex.quote(sys.executable)} -m mlx_lm server",
                   help="mlx-lm's server command")
    g.add_argument("--peer-args", default="", help="extra flags for mlx_lm server")
    g.add_argument("--vllm-venv", type=Path, default=VLLM_MLX_VENV,
                   help=f"vllm-mlx's own venv (default {VLLM_MLX_VENV.relative_to(REPO)}; made on first use)")
    g.add_argument("--vllm-args", default="", help="extra flags for vllm-mlx serve")
    g.add_argument("--no-install", action="store_true", help="never create vllm-mlx's venv; fail instead")
    g.add_argument("--setup-vllm-mlx", action="store_true", help="create vllm-mlx's venv and exit")


def add_run_flags(g) -> None:
    """Our own server at another commit or with other flags; repeats, timeouts, the work dir."""
    g.add_argument("--baseline", metavar="REV",
                   help="also run our server at this commit (a clean worktree made in the work dir), alternating "
                        "with this checkout's, and print ours / base: the guard against a regression")
    g.add_argument("--variant", action="append", default=[], metavar="NAME=FLAGS",
                   help="also run this checkout's server with these extra flags under NAME, alternating "
                        "(e.g. spec-off='--speculation off'); repeatable")
    g.add_argument("--repeats", type=int, default=1, help="runs per server, alternating between the servers")
    g.add_argument("--start-timeout", type=float, default=300)
    g.add_argument("--work-dir", type=Path, default=None, help="cache folders and logs (default: a temp dir)")
    g.add_argument("--keep", action="store_true", help="keep the work dir (always kept when a run fails)")
    g.add_argument("--trace", action="store_true",
                   help="our server only: read its --trace-file (queue, disk reads, prefill, warm-tier "
                        "writes); a table of where TTFT goes")


def add_workload_flags(w) -> None:
    w.add_argument("--agents", type=int, default=8)
    w.add_argument("--turns", type=int, default=4)
    w.add_argument("--think", type=float, default=0.0, help="seconds between an agent's reply and its next turn")
    w.add_argument("--system-tokens", type=int, default=1000, help="size of the shared system document")
    w.add_argument("--history-tokens", type=int, default=0, help="each agent's pre-existing conversation")
    w.add_argument("--max-tokens", type=int, default=64)
    w.add_argument("--stagger", type=float, default=0.5, help="agent i starts after i x this many seconds")
    w.add_argument("--restart", choices=["both", "crash", "graceful", "none"], default="both",
                   help="after the turns: a crash (SIGKILL), then a graceful restart (SIGTERM), one more turn "
                        "each after each (default both)")
    w.add_argument("--crash-delay", type=float, default=3.0,
                   help="seconds from the last turn's end to the SIGKILL (default 3)")
    w.add_argument("--no-restart", action="store_true", help="skip the restart phases (= --restart none)")
    w.add_argument("--no-warmup", action="store_true", help="no tiny request after each server start")
    w.add_argument("--request-timeout", type=float, default=900)


def add_scale_flags(s) -> None:
    s.add_argument("--scale", action="store_true", help="grow agents, then history length; plot")
    s.add_argument("--scale-agents", type=int_list, default=[8, 32, 128])
    s.add_argument("--scale-agents-history", type=int, default=200, help="history per agent on the agents axis")
    s.add_argument("--scale-history", type=int_list, default=[1000, 4000, 8000])
    s.add_argument("--scale-history-agents", type=int, default=8, help="agents on the history axis")
    s.add_argument("--scale-turns", type=int, default=2)
    s.add_argument("--plot-dir", type=Path, default=REPO / "docs/img")


def parse_args(argv=None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=DESCRIPTION, formatter_class=argparse.RawDescriptionHelpFormatter)
    g = p.add_argument_group("server")
    add_server_flags(g)
    add_run_flags(g)
    add_workload_flags(p.add_argument_group("workload"))
    add_scale_flags(p.add_argument_group("scale"))
    p.add_argument_group("output").add_argument("--json", type=Path,
                                                help="write every number (and every request) here")
    args = p.parse_args(argv)
    if not args.setup_vllm_mlx:
        check(p, args)
    return args


def check(p: argparse.ArgumentParser, args: argparse.Namespace) -> None:
    """The servers to run (--compare, --baseline, --variant) and the flags that exclude each other."""
    if args.compare:
        args.serve = ["ours"] + [k for k in args.peers if k != "ours"]
    args.ours_like = {"ours": OursCode(args.ours_dir, args.ours_args)}
    for v in args.variant:
        name, sep, flags = v.partition("=")
        if not sep or not name or name in SERVERS + (BASE, "external"):
            p.error(f"--variant {v!r}: NAME=FLAGS, NAME not one of the servers' names")
        args.ours_like[name] = OursCode(args.ours_dir, f"{args.ours_args} {flags}")
    if args.baseline or args.variant:
        if args.base_url:
            p.error("--baseline and --variant start servers: not with --base-url")
        args.serve = (args.serve or ["ours"]) + ([BASE] if args.baseline else []) + [
            n for n in args.ours_like if n != "ours"]
    if args.base_url and args.serve:
        p.error("--base-url and --serve/--compare exclude each other")
    if not args.base_url and not args.serve:
        args.serve = ["ours"]
    if args.serve:
        args.model = str(Path(args.model or DEMO_MODEL).expanduser())
        if not (Path(args.model) / "config.json").exists():
            p.error(f"no model at {args.model} (run: agent-memory models fetch demo)")
    if args.trace and args.serve and "ours" not in args.serve:
        p.error("--trace times our server: --serve ours")

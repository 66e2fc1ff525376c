#!/usr/bin/env python3
"""How much of each previous turn does a coding agent's session reuse, named and unnamed, and
across a restart? Issue #35's benchmark.

    .venv/bin/python scripts/bench_sessions.py                        # this checkout's server
    .venv/bin/python scripts/bench_sessions.py --server-dir /tmp/old  # another checkout's (git worktree)

Starts `python -m agent_memory serve` from `--server-dir` (its own code, this venv) on a tiny
random-weight model built offline with a 32k context (`agent-memory models build-tiny
--context 32768`: the heads of Claude Code, Codex, opencode and Qwen Code, 11-19k tokens, do not
fit the demo model's 8k) and plays each coding agent's session shape (scripts/bench/sessions.py:
its API, head size, layout) for 4 turns, each next request built the way that client builds it
from the server's actual previous reply, at temperature 0, non-streamed. Four runs of every
shape: named (the agent id each client can send), unnamed (none), and both again with a
graceful restart (SIGTERM, same cache folder) between turns 2 and 3. A shape's sessions share
its head, as a client's sessions do, and differ from their first user message on; the unnamed
ones across a restart have a head of their own (what they find on disk is then theirs). Per turn: prompt and cached tokens (hot/warm), the share of the previous turn (its
prompt + reply) reused, and the usage's `cache_miss` where the server reports one.
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import subprocess
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))  # scripts/bench

import httpx  # noqa: E402

from bench.server import REPO, ServerProcess, offline_env, ours_command  # noqa: E402
from bench.sessions import SHAPES, Session, Text, usage_of  # noqa: E402

RUNS = ("named", "unnamed", "named+restart", "unnamed+restart")
CONTEXT = 32768


def build_model(folder: Path) -> Path:
    """The tiny model with room for the heads (a few seconds, offline; kept if already there)."""
    subprocess.run([sys.executable, "-m", "agent_memory", "models", "build-tiny", str(folder),
                    "--context", str(CONTEXT)], check=True, cwd=REPO, env=offline_env(), capture_output=True)
    return folder


def share(turns: list[dict], k: int) -> float | None:
    """Of turn k-1's whole sequence (prompt + reply), the share turn k reused: at most 1 (the
    cached tokens can pass it by the end-of-turn framing the server computes behind a reply)."""
    prev, now = turns[k - 1], turns[k]
    if "error" in prev or "error" in now or not prev.get("prompt") or now.get("cached") is None:
        return None
    return min(1.0, now["cached"] / (prev["prompt"] + (prev.get("completion") or 0)))


def take_turn(client: httpx.Client, base: str, session: Session, turn: int, record: dict) -> None:
    """Turn `turn` of `session` (and Qwen Code's second request), appended to `record`."""
    if record.get("failed"):
        return
    session.ask(turn)
    sides = [False, True] if session.shape.side_head else [False]
    for side in sides:
        path, body, headers = session.request(turn, side=side)
        r = client.post(base + path, json=body, headers=headers)
        key = "side_turns" if side else "turns"
        if r.status_code != 200:
            record[key].append({"turn": turn, "error": f"{r.status_code}: {r.text[:300]}"})
            record["failed"] = True
            return
        reply = r.json()
        record[key].append({"turn": turn, **usage_of(session.shape.wire, reply)})
        if not side:
            session.answered(reply)
            record[key][-1]["calls"] = len(session.pending_calls)


def run_sessions(server: ServerProcess, sessions: list[tuple[Session, dict]], turns: range, timeout: float) -> None:
    with httpx.Client(timeout=timeout) as client:
        for session, record in sessions:
            for turn in turns:
                take_turn(client, server.url, session, turn, record)
            print(f"  {record['shape']} {record['run']}: " + "; ".join(
                f"t{t['turn']} {t.get('cached')}/{t.get('prompt')}" if "error" not in t else f"t{t['turn']} {t['error']}"
                for t in record["turns"]), flush=True)


def cell(turns: list[dict], k: int) -> str:
    if k >= len(turns):
        return "–"
    t = turns[k]
    if "error" in t:
        return "error: " + t["error"][:60].replace("|", "/")
    text = f"{t['cached']}/{t['prompt']}"
    s = share(turns, k) if k else None
    parts = [f"{s:.1%}"] if s is not None else []
    if t.get("warm"):
        parts.append(f"warm {t['warm']}")
    if t.get("miss") and not t["miss"].startswith("none"):
        parts.append(t["miss"])
    return text + (f" ({', '.join(parts)})" if parts else "")


def table(label: str, records: list[dict], n_turns: int) -> str:
    head = "| server | agent | run | " + " | ".join(f"turn {k + 1}" for k in range(n_turns)) + " | reply tokens |"
    lines = [head, "|" + "---|" * (n_turns + 4)]
    for rec in records:
        for key, name in (("turns", rec["shape"]), ("side_turns", rec["shape"] + " (2nd request)")):
            turns = rec.get(key)
            if not turns:
                continue
            replies = ", ".join(str(t.get("completion", "–")) for t in turns)
            lines.append(f"| {label} | {name} | {rec['run']} | "
                         + " | ".join(cell(turns, k) for k in range(n_turns)) + f" | {replies} |")
    return "\n".join(lines)


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--server-dir", type=Path, default=REPO, help="the checkout whose server runs (default: this one)")
    p.add_argument("--model", type=Path, help="a model folder (default: the tiny one, built with a 32k context)")
    p.add_argument("--agents", default=",".join(SHAPES), help="comma-separated: " + ", ".join(SHAPES))
    p.add_argument("--runs", default=",".join(RUNS), help="comma-separated: " + ", ".join(RUNS))
    p.add_argument("--turns", type=int, default=4)
    p.add_argument("--max-tokens", type=int, default=96, help="each reply's limit")
    p.add_argument("--head-scale", type=float, default=1.0, help="of every head's size (a smoke test: 0.02)")
    p.add_argument("--label", help="name of this server in the output (default: its git commit)")
    p.add_argument("--timeout", type=float, default=600, help="seconds one request may take")
    p.add_argument("--work-dir", type=Path, help="where cache folders and logs go (default: a temporary folder)")
    p.add_argument("--json", type=Path, help="write every turn's figures and the table here")
    p.add_argument("--markdown", type=Path, help="write the table here")
    args = p.parse_args()
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))  # stop the server on the way out
    shapes = [SHAPES[a] for a in args.agents.split(",") if a]
    runs = [r for r in args.runs.split(",") if r]
    if unknown := set(runs) - set(RUNS):
        p.error(f"unknown runs {sorted(unknown)}; one of {', '.join(RUNS)}")
    server_dir = args.server_dir.resolve()
    label = args.label or subprocess.run(["git", "-C", str(server_dir), "rev-parse", "--short", "HEAD"],
                                         capture_output=True, text=True).stdout.strip()
    with tempfile.TemporaryDirectory(prefix="bench-sessions-") as tmp:
        work = args.work_dir or Path(tmp)
        model = args.model or build_model(work / "tiny-32k")
        from tokenizers import Tokenizer

        text = Text(Tokenizer.from_file(str(model / "tokenizer.json")))
        records: list[dict] = []
        plan: dict[bool, list] = {False: [], True: []}  # restarted or not: the sessions
        for run in runs:
            for shape in shapes:
                tag = f"{shape.name}-{run}"
                agent = f"bench-{tag}".replace("+", "-") if run.startswith("named") else None
                rec = {"shape": shape.name, "run": run, "agent": agent, "head": int(shape.head * args.head_scale),
                       "note": shape.note, "turns": [], "side_turns": []}
                # Unnamed across a restart: a head of its own, so that what it finds on disk is
                # its own (a named session's copy of the same head would stand in for it).
                head_key = tag if run == "unnamed+restart" else shape.name
                session = Session(shape, tag, agent, text, args.max_tokens, head_key=head_key, scale=args.head_scale)
                plan[run.endswith("+restart")].append((session, rec))
                records.append(rec)
        # One server and cache folder for all: the restarted sessions first (their turns 3-4
        # after the restart), then the others (a shape's head then comes from the cache, as
        # for any client's second session; it is the turns after the first that are measured).
        server = ServerProcess("server", lambda port: ours_command(port, [model], work / "cache"),
                               offline_env(PYTHONPATH=str(server_dir)), work / "logs", cwd=server_dir)
        server.start(300)
        try:
            if plan[True]:
                mid = min(2, args.turns)
                run_sessions(server, plan[True], range(1, mid + 1), args.timeout)
                server.stop("graceful")
                server.start(300)
                print(f"  restarted (ready in {server.load_s:.1f}s)", flush=True)
                run_sessions(server, plan[True], range(mid + 1, args.turns + 1), args.timeout)
            run_sessions(server, plan[False], range(1, args.turns + 1), args.timeout)
        finally:
            server.stop("graceful")
    for rec in records:
        rec.pop("failed", None)
        for key in ("turns", "side_turns"):
            for k, t in enumerate(rec[key]):
                if k:
                    t["share_of_previous_turn"] = share(rec[key], k)
    text_table = table(label, records, args.turns)
    print("\n" + text_table)
    out = {"label": label, "server_dir": str(server_dir), "model": str(args.model or "tiny, 32k context (built)"),
           "max_tokens": args.max_tokens, "load_average": os.getloadavg(), "sessions": records, "table": text_table}
    if args.json:
        args.json.write_text(json.dumps(out, indent=1))
    if args.markdown:
        args.markdown.write_text(text_table + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())

#!/usr/bin/env python3
"""Several models in one server: what loading on demand costs, what an unload costs the agents
of the model unloaded, and whether two models decode better on a thread each or on one thread
taking turns. Starts its own servers on loopback; medians of `--runs` rounds.

  1. load     a request to a served model not loaded yet: its time to first token (the load
              included), then the same request again (loaded); and the load alone, as the
              server's log says it.
  2. unload   an agent with a long history (`--history-tokens`) on model A, under a memory
              limit that holds one model's weights beside the hot budget: a request to model B
              unloads A, then the agent's next turn on A. Its time to first token after the
              unload (A reloaded, the agent's blocks read back from the warm tier) against the
              same turn with nothing unloaded (hot) and with the agent's KV gone (cold: a new
              cache_salt, the whole prompt computed, the model loaded).
  3. threads  mlx-lm directly, no server: two models decode `--tokens` tokens each, one
              thread each (what the server does: an engine thread per model) or one thread
              stepping both in turn. Wall time, and when each model is done.

    .venv/bin/python scripts/bench_models.py                 # the demo model and a copy of it
    .venv/bin/python scripts/bench_models.py --model tiny --runs 1 --history-tokens 600

Model B is a copy of model A under another name (same weights, so the same load time), made
in a temporary folder with hard links where the file system allows.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import httpx

sys.path.insert(0, str(Path(__file__).resolve().parent))
from bench.server import MODELS, REPO, ServerProcess, clean_env, ours_command  # noqa: E402

MiB = 1 << 20
HOT_BUDGET_MB = 256
FACT = "The harbour log records each ship, its berth, its cargo and the hour it came in. "


class Server:
    """`agent-memory serve` with models a and b at --kv-bits 16, started at once (a ServerProcess)."""

    def __init__(self, a: Path, b: Path, cache: Path, *flags: str) -> None:
        command = lambda port: ours_command(port, [f"a={a}", f"b={b}"], cache, "--kv-bits", "16", *flags)  # noqa: E731
        self.process = ServerProcess("server", command, clean_env(), cache).start(300)
        self.url = self.process.url

    def log(self) -> str:
        return self.process.log()

    def stop(self) -> None:
        self.process.stop(timeout=60)


def ttft(server: Server, model: str, agent: str, messages: list[dict], salt: str | None = None) -> tuple[float, str]:
    """Seconds to the first streamed token, and the reply (greedy, 8 tokens at most)."""
    body = {"model": model, "messages": messages, "max_tokens": 8, "temperature": 0, "stream": True}
    body |= {"prompt_cache_key": agent} | ({"cache_salt": salt} if salt else {})
    t0, first, text = time.perf_counter(), None, ""
    with httpx.stream("POST", server.url + "/v1/chat/completions", json=body, timeout=600) as r:
        r.raise_for_status()
        for line in r.iter_lines():
            if not line.startswith("data: {"):
                continue
            delta = json.loads(line[6:])["choices"][0]["delta"].get("content") or ""
            if delta and first is None:
                first = time.perf_counter() - t0
            text += delta
    return (first if first is not None else time.perf_counter() - t0), text


def history(tokens: int) -> list[dict]:
    """A conversation of about `tokens` tokens (about 17 tokens to a fact)."""
    turns = []
    for i in range(max(tokens // 170, 1)):
        turns += [
            {"role": "user", "content": f"Entry {i}: " + FACT * 9},
            {"role": "assistant", "content": f"Logged entry {i}."},
        ]
    return [{"role": "system", "content": "You keep the harbour's log."}, *turns]


def loaded_in(log: str, name: str) -> list[float]:
    return [float(s) for s in re.findall(rf"loaded {re.escape(name)} on demand in ([\d.]+) s", log)]


def bench_load(a: Path, b: Path, work: Path, runs: int) -> dict:
    first, again, load = [], [], []
    question = [{"role": "user", "content": "Which ship came in last?"}]
    for n in range(runs):
        server = Server(a, b, work / f"load-{n}")
        try:
            first.append(ttft(server, "b", "x", question)[0])
            again.append(ttft(server, "b", "y", question, salt="other")[0])
            load += loaded_in(server.log(), "b")
        finally:
            server.stop()
    return {"first_request_s": first, "loaded_request_s": again, "load_s": load}


def bench_unload(a: Path, b: Path, work: Path, runs: int, history_tokens: int) -> dict:
    weights = sum(f.stat().st_size for f in a.glob("*.safetensors"))
    limit_mb = max((weights + weights // 2) // MiB + HOT_BUDGET_MB, 256)  # one model's weights fit, not two
    flags = ("--memory-limit-mb", str(limit_mb), "--hot-budget-mb", str(HOT_BUDGET_MB))
    past = history(history_tokens)
    turn = [*past, {"role": "user", "content": "Which ship came in last?"}]
    out: dict[str, list] = {"hot_s": [], "after_unload_s": [], "cold_s": [], "reload_s": [], "prompt_tokens": []}
    for n in range(runs):
        server = Server(a, b, work / f"unload-{n}", *flags)
        try:
            ttft(server, "a", "keeper", past[:-1])  # the agent's history, cached
            out["hot_s"].append(ttft(server, "a", "keeper", turn)[0])
            ttft(server, "b", "visitor", [{"role": "user", "content": "Hello."}])  # A unloads
            assert "unloaded a to make room for b" in server.log(), "the limit did not unload a"
            t, reply = ttft(server, "a", "keeper", turn)
            out["after_unload_s"].append(t)
            out["reload_s"] += loaded_in(server.log(), "a")
            cold, cold_reply = ttft(server, "a", "stranger", turn, salt=f"cold-{n}")
            out["cold_s"].append(cold)
            assert reply == cold_reply, "a warm turn answered otherwise than a cold one"
            usage = httpx.post(
                server.url + "/v1/chat/completions",
                json={"model": "a", "messages": turn, "max_tokens": 1, "prompt_cache_key": "keeper"},
                timeout=600,
            ).json()["usage"]
            out["prompt_tokens"].append(usage["prompt_tokens"])
        finally:
            server.stop()
    out["limit_mb"] = limit_mb
    return out


def bench_threads(a: Path, b: Path, tokens: int, runs: int) -> dict:
    """One engine thread per model against one thread alternating: mlx-lm's own decoding."""
    code = f"""
import agent_memory.blas, json, threading, time, sys
import mlx.core as mx
from mlx_lm import load
from mlx_lm.generate import generate_step
from mlx_lm.sample_utils import make_sampler

N = {tokens}
def steps(path):
    model, tok = load(path)
    prompt = mx.array(tok.encode("The harbour log records each ship. " * 8))
    return generate_step(prompt, model, sampler=make_sampler(0.0), max_tokens=N)

def threaded(paths):
    done, t0 = {{}}, time.perf_counter()
    def run(k, gen):
        for _ in gen: pass
        done[k] = time.perf_counter() - t0
        mx.synchronize(); mx.clear_streams()
    gens = {{k: steps(p) for k, p in paths.items()}}
    t0 = time.perf_counter()
    ts = [threading.Thread(target=run, args=(k, g)) for k, g in gens.items()]
    [t.start() for t in ts]; [t.join() for t in ts]
    return time.perf_counter() - t0, done

def alternating(paths):
    gens = {{k: steps(p) for k, p in paths.items()}}
    done, t0, live = {{}}, time.perf_counter(), dict(gens)
    while live:
        for k in list(live):
            if next(live[k], None) is None:
                done[k] = time.perf_counter() - t0
                del live[k]
    return time.perf_counter() - t0, done

paths = {{"a": sys.argv[1], "b": sys.argv[2]}}
print(json.dumps({{"threads": threaded(paths), "alternating": alternating(paths)}}))
"""
    rounds = []
    for _ in range(runs):
        done = subprocess.run([sys.executable, "-c", code, str(a), str(b)], capture_output=True, text=True, cwd=REPO)
        if done.returncode:
            sys.exit(done.stderr[-3000:])
        rounds.append(json.loads(done.stdout.strip().splitlines()[-1]))
    return {
        way: {
            "wall_s": [r[way][0] for r in rounds],
            "a_done_s": [r[way][1]["a"] for r in rounds],
            "b_done_s": [r[way][1]["b"] for r in rounds],
        }
        for way in ("threads", "alternating")
    }


def copy_model(src: Path, dst: Path) -> Path:
    dst.mkdir(parents=True)
    for f in src.iterdir():
        try:
            os.link(f, dst / f.name)
        except OSError:
            shutil.copy2(f, dst / f.name)
    return dst


def median(values: list[float]) -> float:
    return statistics.median(values) if values else float("nan")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--model", default="demo", help="a model folder, 'demo' (default) or 'tiny'")
    parser.add_argument("--runs", type=int, default=3)
    parser.add_argument("--history-tokens", type=int, default=3000)
    parser.add_argument("--tokens", type=int, default=200, help="tokens each model decodes in part 3")
    parser.add_argument("--json", type=Path, help="also write the raw numbers here")
    args = parser.parse_args()
    from agent_memory.models.registry import resolve_model

    source = resolve_model(args.model, MODELS)
    with tempfile.TemporaryDirectory(prefix="bench-models-") as tmp:
        work = Path(tmp)
        a = copy_model(source, work / "models" / "a")
        b = copy_model(source, work / "models" / "b")
        results = {
            "model": source.name,
            "load": bench_load(a, b, work, args.runs),
            "unload": bench_unload(a, b, work, args.runs, args.history_tokens),
            "threads": bench_threads(a, b, args.tokens, args.runs),
        }
    if args.json:
        args.json.write_text(json.dumps(results, indent=2))
    report(results, args)


def report(r: dict, args) -> None:
    load, unload, threads = r["load"], r["unload"], r["threads"]
    print(f"\nmodel {r['model']} (B: a copy of it), medians of {args.runs} rounds\n")
    print("| what | time to first token |")
    print("|---|---:|")
    print(f"| a request to a model not loaded yet (its load included) | {median(load['first_request_s']):.2f} s |")
    print(f"| the same request, the model loaded | {median(load['loaded_request_s']):.2f} s |")
    print(f"| the load alone (the server's log) | {median(load['load_s']):.2f} s |")
    tokens = median(unload["prompt_tokens"])
    print(f"\nAn agent's turn of {tokens:.0f} prompt tokens, limit {unload['limit_mb']} MiB (one model at a time):\n")
    print("| the agent's model | time to first token |")
    print("|---|---:|")
    print(f"| loaded, the agent hot | {median(unload['hot_s']):.2f} s |")
    print(f"| unloaded for another model since the agent's last turn | {median(unload['after_unload_s']):.2f} s |")
    print(f"| (of which reloading the weights) | {median(unload['reload_s']):.2f} s |")
    print(f"| loaded, the agent's KV gone (cold) | {median(unload['cold_s']):.2f} s |")
    print(f"\nTwo models decoding {args.tokens} tokens each at once:\n")
    print("| how | wall | model A done | model B done |")
    print("|---|---:|---:|---:|")
    for way, name in (("threads", "a thread each (the server)"), ("alternating", "one thread, taking turns")):
        t = threads[way]
        print(
            f"| {name} | {median(t['wall_s']):.2f} s | {median(t['a_done_s']):.2f} s | {median(t['b_done_s']):.2f} s |"
        )


if __name__ == "__main__":
    main()

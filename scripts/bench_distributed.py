#!/usr/bin/env python3
"""One model served by two processes against one process, on this machine (issue #38): a check
of the overhead of the split, not of speed — both processes share this machine's cores, and the
ring backend's collectives go over TCP on 127.0.0.1 (no Thunderbolt, no JACCL here).

    .venv/bin/python scripts/bench_distributed.py              # tiny llama, tensor parallel
    .venv/bin/python scripts/bench_distributed.py --pipeline   # and tiny qwen2, pipeline parallel

For each family, one process (`agent-memory serve`) and then two (`mlx.launch --backend ring -n 2
… agent-memory serve`), each on a fresh tiny model (models/tiny.py), --kv-bits 16, no warm tier:
- decode: a batch of --batch greedy requests sent together, --tokens each; completion tokens
  over the wall time from the first token to the last (prefill excluded);
- a returning agent's TTFT: turn 2 of an agent whose turn 1 (a ~--prompt-words prompt) is hot,
  streamed, to the first text; and a prompt as long that nothing cached begins (cold); medians
  of --rounds.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import httpx

sys.path.insert(0, str(Path(__file__).resolve().parent))  # scripts/bench

from bench.server import ServerProcess, clean_env, ours_command  # noqa: E402

LAUNCH = Path(sys.executable).with_name("mlx.launch")


def two_ranks(command: list[str], ring: int) -> list[str]:
    """`command` under mlx.launch, two ranks on loopback (ring ports ring, ring + 1)."""
    return [str(LAUNCH), "--backend", "ring", "-n", "2", "-p", str(ring), "--env", "PYTHONUNBUFFERED=1", "--", *command]


def stream(url: str, messages: list[dict], agent: str, max_tokens: int) -> tuple[float, float, int]:
    """(seconds to the first text, to the end, completion tokens) of one streamed greedy chat."""
    body = {"model": "tiny", "messages": messages, "max_tokens": max_tokens, "temperature": 0, "stream": True}
    body["stream_options"] = {"include_usage": True}
    t0, first, tokens = time.perf_counter(), None, 0
    with httpx.stream("POST", url + "/v1/chat/completions", json=body, headers={"X-Agent-Id": agent}, timeout=600) as r:
        r.raise_for_status()
        for line in r.iter_lines():
            if first is None and '"content": "' in line and '"content": ""' not in line:
                first = time.perf_counter() - t0
            if '"usage": {' in line:
                tokens = int(line.split('"completion_tokens": ')[1].split(",")[0].split("}")[0])
    return first or 0.0, time.perf_counter() - t0, tokens


def decode_rate(url: str, batch: int, tokens: int) -> float:
    """Completion tokens a second of `batch` requests sent together, from the first token on."""
    def one(i: int):
        t0 = time.perf_counter()
        first, total, n = stream(url, [{"role": "user", "content": f"Story {i}: once"}], f"decode-{i}", tokens)
        return t0 + first, t0 + total, n

    with ThreadPoolExecutor(batch) as pool:
        runs = list(pool.map(one, range(batch)))
    start, end = min(r[0] for r in runs), max(r[1] for r in runs)
    return sum(r[2] - 1 for r in runs) / (end - start)


def ttfts(url: str, rounds: int, words: int) -> tuple[float, float]:
    """Median TTFT of an agent's turn 2 (turn 1 hot), and of a prompt as long that nothing cached
    begins (cold)."""
    hot, cold = [], []
    notes = "Notes on the harbour and its boats. " * (words // 7)

    def turn_2(opening: str) -> list[dict]:
        first = [{"role": "user", "content": opening + notes}]
        return [*first, {"role": "assistant", "content": "Noted."}, {"role": "user", "content": "And the tides?"}]

    for r in range(rounds):
        stream(url, turn_2(f"Round {r}. ")[:1], f"agent-{r}", 8)
        hot.append(stream(url, turn_2(f"Round {r}. "), f"agent-{r}", 4)[0])
        cold.append(stream(url, turn_2(f"Cold round {r}. "), f"new-{r}", 4)[0])
    return statistics.median(hot), statistics.median(cold)


def measure(name: str, command, folder: Path, args) -> dict:
    server = ServerProcess(name, command, clean_env(), folder / "logs")
    server.start()
    try:
        stream(server.url, [{"role": "user", "content": "warm up"}], "warm-up", 8)
        rate = decode_rate(server.url, args.batch, args.tokens)
        hot, cold = ttfts(server.url, args.rounds, args.prompt_words)
    finally:
        server.stop("crash")  # the launcher and both ranks (its process group); nothing to save
    return {"load_s": server.load_s, "tok_s": rate, "hot_ttft": hot, "cold_ttft": cold}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--pipeline", action="store_true", help="also a tiny qwen2 split by pipeline")
    parser.add_argument("--batch", type=int, default=4)
    parser.add_argument("--tokens", type=int, default=48)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--prompt-words", type=int, default=1000)
    args = parser.parse_args()

    from agent_memory.models.tiny import build_tiny

    from bench.server import free_port

    flags = ("--kv-bits", "16", "--disk-budget-mb", "0", "--speculation", "off")
    families = [("llama", "tensor")] + ([("qwen2", "pipeline")] if args.pipeline else [])
    print(f"batch {args.batch} × {args.tokens} tokens; TTFT medians of {args.rounds}; ~{args.prompt_words}-word turn 1")
    print("| model | processes | load (s) | decode tok/s | agent's turn 2 TTFT, hot (s) | as long, cold (s) |")
    print("|---|---|---|---|---|---|")
    with tempfile.TemporaryDirectory() as tmp:
        root = Path(tmp)
        for arch, mode in families:
            model = build_tiny(root / arch, arch=arch)
            for n in (1, 2):
                cache = root / f"{arch}-{n}"

                def command(port: int, n=n, cache=cache) -> list[str]:
                    cmd = ours_command(port, [model], cache, *flags, "--distributed", mode)  # read when split
                    return two_ranks(cmd, free_port()) if n == 2 else cmd

                m = measure(f"{arch}-{n}", command, root, args)
                label = "1" if n == 1 else f"2 ({mode}, ring on 127.0.0.1)"
                print(f"| tiny {arch} | {label} | {m['load_s']:.1f} | {m['tok_s']:.1f} | {m['hot_ttft']:.3f} | "
                      f"{m['cold_ttft']:.3f} |", flush=True)


if __name__ == "__main__":
    main()

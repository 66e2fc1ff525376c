#!/usr/bin/env python
"""How the prefill chunk size sets prefill speed and peak memory on this machine.

    .venv/bin/python scripts/bench_prefill_chunk.py                     # the demo model
    .venv/bin/python scripts/bench_prefill_chunk.py --chunks 2048,256 --prompt-tokens 1600

A prompt is prefilled into a fresh mlx-lm cache a chunk at a time, the way the engine's
prefill.py does; each (chunk, length) pair runs in its own process, so every peak (MLX's
peak memory, the process's VmHWM) is its own. On a CPU, attention over a chunk materializes
chunk x context scores, and a chunk as long as the prompt computes the masked half as well.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from pathlib import Path


def worker(model_dir: str, chunk: int, n: int) -> dict:
    import agent_memory.blas  # noqa: F401
    import mlx.core as mx
    from mlx_lm import load
    from mlx_lm.models.cache import make_prompt_cache

    model, _ = load(model_dir)
    tokens = mx.array([(i * 7919) % 40000 + 256 for i in range(n)])
    cache = make_prompt_cache(model)
    mx.reset_peak_memory()
    started = time.perf_counter()
    for start in range(0, n, chunk):
        model(tokens[start : start + chunk][None], cache=cache)
        mx.eval([c.state for c in cache])
    seconds = time.perf_counter() - started
    with open("/proc/self/status") as f:
        hwm = next(int(line.split()[1]) * 1024 for line in f if line.startswith("VmHWM"))
    return {"chunk": chunk, "prompt_tokens": n, "seconds": seconds, "tok_s": n / seconds,
            "mlx_peak_bytes": mx.get_peak_memory(), "vm_hwm_bytes": hwm}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--model", default=None, help="model folder (default: the demo model in the cache dir)")
    parser.add_argument("--chunks", default="2048,512,256,128")
    parser.add_argument("--prompt-tokens", default="500,1600,4000")
    parser.add_argument("--json", type=Path, help="also write the results here")
    parser.add_argument("--worker", nargs=3, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.worker:
        print(json.dumps(worker(args.worker[0], int(args.worker[1]), int(args.worker[2]))))
        return
    cache = Path(os.environ.get("XDG_CACHE_HOME", Path.home() / ".cache"))
    model = args.model or str(cache / "agent-memory/models/smollm2-135m-instruct")
    rows = []
    print("| prompt tokens | chunk | prefill s | tok/s | MLX peak MB | process peak MB |")
    print("|---|---|---|---|---|---|")
    for n in [int(x) for x in args.prompt_tokens.split(",")]:
        for chunk in [int(x) for x in args.chunks.split(",")]:
            out = subprocess.run([sys.executable, __file__, "--worker", model, str(chunk), str(n)],
                                 capture_output=True, text=True, check=True)
            row = json.loads(out.stdout.strip().splitlines()[-1])
            rows.append(row)
            print(f"| {n} | {chunk} | {row['seconds']:.2f} | {row['tok_s']:.0f} | "
                  f"{row['mlx_peak_bytes'] >> 20} | {row['vm_hwm_bytes'] >> 20} |", flush=True)
    if args.json:
        args.json.write_text(json.dumps(rows, indent=1))


if __name__ == "__main__":
    main()

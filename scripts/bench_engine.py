#!/usr/bin/env python
"""Engine throughput on one model: prefill and decode tok/s with and without OpenBLAS,
aggregate decode tok/s for 1/2/4/8 concurrent requests, what constrained decoding costs
8 concurrent requests (tool_choice auto's grammar; a JSON schema) against none, and what
logprobs (top 5) and penalties (frequency, presence, repetition) cost them.

    .venv/bin/python scripts/bench_engine.py                 # the demo model
    .venv/bin/python scripts/bench_engine.py --model DIR --json out.json
    .venv/bin/python scripts/bench_engine.py --only-sampling --concurrency 8   # logprobs and penalties only

Each configuration runs in its own process (OpenBLAS is chosen at import time), side by side
in one run, so the ratios hold on a noisy machine. Requests go straight to the BatchEngine
(no HTTP; bench_agents.py measures the server end to end) with end-of-sequence suppressed so
every request decodes exactly --decode-tokens tokens, and with no cache reuse (random prompts).
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import subprocess
import sys
import threading
import time
from pathlib import Path


# JSON that cannot end before the run does (a request that finished early would end the stretch
# in which all decode together).
JSON_TEXT = {"type": "object", "properties": {"text": {"type": "string", "minLength": 400}}, "required": ["text"]}
# What each sampling comparison adds to a plain greedy request.
SAMPLING = {
    "plain": {},
    "logprobs": {"logprobs": 5},
    "penalties": {"frequency_penalty": 0.5, "presence_penalty": 0.5, "repetition_penalty": 1.1},
}


def per_token_costs(vocab_size: int, batch: int) -> dict:
    """What penalties and logprobs add per generated token, in milliseconds, timed on their
    own (medians of 100): steadier than the end-to-end ratios on a shared machine."""
    import mlx.core as mx

    from agent_memory.engine.tokens.logprobs import token_logprobs
    from agent_memory.engine.tokens.penalties import Penalties

    def median_ms(fn) -> float:
        times = []
        for _ in range(100):
            t0 = time.perf_counter()
            fn()
            times.append(time.perf_counter() - t0)
        return statistics.median(times) * 1000

    logits = mx.random.normal((1, vocab_size))
    rows = mx.random.normal((batch, vocab_size))
    rows = rows - mx.logsumexp(rows, axis=-1, keepdims=True)
    mx.eval(logits, rows)
    penalties = Penalties(list(range(0, 2000, 3)), vocab_size, 0.5, 0.5, 1.1)
    token = mx.array([5])
    return {
        "penalties": median_ms(lambda: mx.eval(penalties(token, logits))),
        "logprobs": median_ms(lambda: token_logprobs(rows, [1] * batch, [5] * batch)) / batch,
    }


def run_worker(args) -> dict:
    import agent_memory.blas as blas
    from agent_memory.engine.config import EngineConfig
    from agent_memory.engine.engine import BatchEngine
    from agent_memory.engine.requests import Finished, GenerationRequest, SamplingParams, TextDelta

    from agent_memory.chat.grammar import GrammarCompiler

    engine = BatchEngine(EngineConfig(model_path=Path(args.model), max_batch=max(args.concurrency), hot_budget_bytes=0))
    engine.start()
    if error := engine.wait_loaded():
        raise SystemExit(error)
    tokenizer = engine.model.tokenizer
    grammars = GrammarCompiler(tokenizer, engine.model.vocab_size)
    vocab = len(tokenizer)
    no_eos = {t: -100.0 for t in tokenizer.eos_token_ids}
    counter = iter(range(10**9))

    def prompt(n: int) -> list[int]:
        seed = next(counter)
        return [(seed * 7919 + i * 104729) % (vocab - 300) + 256 for i in range(n)]

    def generated() -> float:
        return engine.metrics.get_sample_value("agent_memory_generated_tokens_total")

    def grammar(kind: str):
        """A fresh matcher of one of the grammars constrained requests use, or None."""
        from agent_memory.chat.conversation import Conversation, Message, OutputFormat, Tool

        if kind == "none":
            return None
        if kind == "auto":
            params = {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]}
            conv = Conversation([Message("user", "")], [Tool("get_weather", "", params)])
        else:
            conv = Conversation([Message("user", "")], output=OutputFormat("json_schema", JSON_TEXT))
        return grammars.output(grammars.grammar(conv, "tools", "response_format"), conv.calls_tools)

    def run(prompts: list[list[int]], max_tokens: int, kind: str = "none", sampling: dict | None = None) -> dict:
        """Submit all at once. Returns when the last finished and, for the stretch in which
        all of them decode together, the tokens generated and the time it took."""
        marks: dict = {}
        started, finished = set(), threading.Event()

        def sink_for(i):
            def sink(event):  # runs on the engine thread, in step with generation
                now = time.perf_counter()
                if isinstance(event, TextDelta):
                    started.add(i)
                    if len(started) == len(prompts) and "all_decoding" not in marks:
                        marks["all_decoding"] = (now, generated())
                    return
                assert isinstance(event, Finished), event
                marks.setdefault("first_done", (now, generated()))
                marks.setdefault("done", []).append(now)
                if len(marks["done"]) == len(prompts):
                    finished.set()

            return sink

        start = time.perf_counter()
        for i, p in enumerate(prompts):
            params = SamplingParams(max_tokens=max_tokens, temperature=0.0, logit_bias=no_eos, **(sampling or {}))
            engine.submit(GenerationRequest(prompt=p, params=params, grammar=grammar(kind)), sink_for(i))
        finished.wait()
        (t0, c0), (t1, c1) = marks.get("all_decoding", (start, 0.0)), marks["first_done"]
        return {"elapsed": max(marks["done"]) - start, "tokens": c1 - c0, "span": t1 - t0}

    run([prompt(32)], 4)  # warm up
    result = {"openblas": blas.OPENBLAS_LOADED, "prefill_tokens": args.prompt_tokens}
    result["prefill_tok_s"] = args.prompt_tokens / run([prompt(args.prompt_tokens)], 1)["elapsed"]
    decode = {}
    for n in args.concurrency:
        r = run([prompt(16) for _ in range(n)], args.decode_tokens)
        decode[n] = r["tokens"] / r["span"]
    result["decode_tok_s"] = decode
    if args.constrained:
        n, rates = max(args.concurrency), {"none": [], "auto": [], "json": []}
        for _ in range(args.constrained):  # alternating, so drift hits every kind alike
            for kind in rates:
                r = run([prompt(16) for _ in range(n)], args.decode_tokens, kind)
                rates[kind].append(r["tokens"] / r["span"])
        result["constrained"] = {"concurrency": n, "decode_tok_s": rates}
    if args.sampling:
        n, rates = max(args.concurrency), {kind: [] for kind in SAMPLING}
        for _ in range(args.sampling):  # alternating, as above
            for kind, sampling in SAMPLING.items():
                r = run([prompt(16) for _ in range(n)], args.decode_tokens, sampling=sampling)
                rates[kind].append(r["tokens"] / r["span"])
        costs = per_token_costs(engine.model.vocab_size, n)
        result["sampling"] = {"concurrency": n, "decode_tok_s": rates, "ms": costs}
    engine.stop()
    return result


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--model", default=None, help="model folder (default: the demo model in the cache dir)")
    parser.add_argument("--prompt-tokens", type=int, default=512)
    parser.add_argument("--decode-tokens", type=int, default=64)
    parser.add_argument("--concurrency", type=lambda s: [int(x) for x in s.split(",")], default=[1, 2, 4, 8])
    parser.add_argument("--no-blas-prompt-tokens", type=int, default=128, help="shorter: reference BLAS is slow")
    parser.add_argument("--constrained", type=int, default=3, help="rounds of the constrained comparison (0: skip)")
    parser.add_argument("--sampling", type=int, default=3, help="rounds of the logprobs/penalties comparison (0: skip)")
    parser.add_argument("--only-sampling", action="store_true", help="only the OpenBLAS run, only that comparison")
    parser.add_argument("--json", type=Path, help="also write the results here")
    parser.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args()

    if args.model is None:
        from agent_memory.config import default_cache_dir
        from agent_memory.models.demo import DEMO_NAME

        args.model = str(default_cache_dir() / "models" / DEMO_NAME)
    if args.worker:
        print(json.dumps(run_worker(args)))
        return

    runs = {}
    configurations = [("openblas", "1", args.prompt_tokens, args.concurrency)]
    if args.only_sampling:
        args.constrained = 0
    else:
        configurations.append(("reference BLAS", "0", args.no_blas_prompt_tokens, [1]))
    for label, blas, prompt_tokens, concurrency in configurations:
        cmd = [sys.executable, __file__, "--worker", "--model", args.model, "--prompt-tokens", str(prompt_tokens)]
        cmd += ["--decode-tokens", str(args.decode_tokens), "--concurrency", ",".join(map(str, concurrency))]
        cmd += ["--constrained", str(args.constrained if blas == "1" else 0)]
        cmd += ["--sampling", str(args.sampling if blas == "1" else 0)]
        env = {**os.environ, "AGENT_MEMORY_OPENBLAS": blas, "HF_HUB_OFFLINE": "1"}
        print(f"running {label} ...", file=sys.stderr)
        out = subprocess.run(cmd, env=env, capture_output=True, text=True, check=True)
        runs[label] = json.loads(out.stdout.strip().splitlines()[-1])

    if args.json:
        args.json.write_text(json.dumps({"model": Path(args.model).name, "runs": runs}, indent=2))
    fast = runs["openblas"]
    print(f"\nmodel: {Path(args.model).name}   machine: {platform.machine()}, {os.cpu_count()} cores\n")
    if "sampling" in fast:
        c = fast["sampling"]
        plain = statistics.median(c["decode_tok_s"]["plain"])
        print(f"| {c['concurrency']} concurrent requests | aggregate decode tok/s (median) | vs plain |")
        print("|---|---|---|")
        for kind in SAMPLING:
            tps = statistics.median(c["decode_tok_s"][kind])
            print(f"| {kind} | {tps:.1f} | {tps / plain:.2f}x |")
        ms, step = c["ms"], c["concurrency"] / plain * 1000
        print(f"\nper token, timed alone: penalties {ms['penalties']:.2f} ms, logprobs (top 5) {ms['logprobs']:.2f} ms;"
              f" a step of {c['concurrency']} takes {step:.0f} ms here\n")
    if args.only_sampling:
        return
    slow, single = runs["reference BLAS"], fast["decode_tok_s"]["1"]
    print("| BLAS | prefill tok/s | decode tok/s (1 request) |")
    print("|---|---|---|")
    for label, r in runs.items():
        print(f"| {label} | {r['prefill_tok_s']:.1f} ({r['prefill_tokens']}-token prompt) | {r['decode_tok_s']['1']:.1f} |")
    print(f"\nOpenBLAS speed-up: prefill {fast['prefill_tok_s'] / slow['prefill_tok_s']:.1f}x, "
          f"decode {single / slow['decode_tok_s']['1']:.1f}x\n")
    print("| concurrent requests | aggregate decode tok/s | vs 1 request |")
    print("|---|---|---|")
    for n, tps in fast["decode_tok_s"].items():
        print(f"| {n} | {tps:.1f} | {tps / single:.2f}x |")
    if "constrained" in fast:
        c = fast["constrained"]
        free = statistics.median(c["decode_tok_s"]["none"])
        print(f"\n| {c['concurrency']} concurrent requests | aggregate decode tok/s (median) | vs unconstrained |")
        print("|---|---|---|")
        for kind, label in (("none", "unconstrained"), ("auto", "tool_choice auto grammar"), ("json", "JSON schema (a long string)")):
            tps = statistics.median(c["decode_tok_s"][kind])
            print(f"| {label} | {tps:.1f} | {tps / free:.2f}x |")


if __name__ == "__main__":
    main()

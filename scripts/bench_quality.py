#!/usr/bin/env python
"""What quantized KV costs: perplexity, greedy agreement with float KV, and decode speed.

    .venv/bin/python scripts/bench_quality.py                  # the demo model, all schemes
    .venv/bin/python scripts/bench_quality.py --windows 2 --json out.json

Text: the GPL-3 and Apache-2.0 licences Debian ships in /usr/share/common-licenses. Perplexity
runs over --windows windows of 1,024 tokens, each fed through the cache in 128-token steps,
the way an agent's conversation grows. How the server uses a precision:

- exact while hot (the default): an agent active recently gets its KV back as computed: the
  float row. Once its blocks cooled (the hot budget's pressure, or a restart: the disk holds
  --kv-bits), a returning request attends to its prefix dequantized and to its own new tokens
  at full precision: here each 128-token step is a request, the steps before it come back from
  64-token blocks cooled to the precision (engine/kinds/, as the engine stores and restores them).
- decode-quantized (`--decode-quantized`): everything attended to is quantized, through
  mlx-lm's QuantizedKVCache (the batched cache decodes the same tokens, tests/test_quantized.py).

Greedy agreement: float KV's greedy continuation (256 tokens after a 1,024-token prompt) fed
back through each scheme: the share of positions where the scheme's top token is the same
(teacher-forced). Free-running: the scheme generates its own greedy reply from the restored
prompt; the share of the reply before its first token unlike float KV's (what a user who
repeats a temperature-0 request sees). Decode speed: tok/s for 1 and 8 sequences decoding
together over a --context-token history, with the batch caches the engine uses.

    .venv/bin/python scripts/bench_quality.py --schemes exact,q4g64,q8g64   # some schemes only
"""

from __future__ import annotations

import argparse
import json
import math
import os
import platform
import sys
import time
from dataclasses import dataclass
from pathlib import Path

import agent_memory.blas  # noqa: F401
import mlx.core as mx
from mlx_lm import load
from mlx_lm.models.cache import BatchKVCache

from agent_memory.config import default_cache_dir
from agent_memory.engine.kinds import attention as kv
from agent_memory.engine.kinds.layers import ModelLayers
from agent_memory.engine.batch.quantized import BatchQuantizedKVCache
from agent_memory.memory.warm.format.records import BLOCK_TOKENS
from agent_memory.models.registry import resolve_model
from agent_memory.precision import KVPrecision

TEXTS = [Path("/usr/share/common-licenses/GPL-3"), Path("/usr/share/common-licenses/Apache-2.0")]
WINDOW, STEP = 1024, 128
FULL = KVPrecision()


@dataclass(frozen=True)
class Scheme:
    precision: KVPrecision
    decode_quantized: bool = False

    @property
    def name(self) -> str:
        if not self.precision.quantized:
            return "exact (float, as computed): while hot"
        mode = "decode-quantized" if self.decode_quantized else "once cooled"
        return f"Q{self.precision.bits} g{self.precision.group_size}, {mode}"


def schemes(wanted: str | None) -> list[Scheme]:
    """Every scheme, or those named: exact, q4g64, q4g64-dq (decode-quantized), ..."""
    out = {"exact": Scheme(FULL)}
    for bits in (8, 4):
        for group in (32, 64):
            for decode_quantized in (False, True):
                name = f"q{bits}g{group}" + ("-dq" if decode_quantized else "")
                out[name] = Scheme(KVPrecision(bits, group), decode_quantized)
    if wanted is None:
        return list(out.values())
    unknown = [w for w in wanted.split(",") if w not in out]
    if unknown:
        raise SystemExit(f"unknown schemes {unknown}; known: {', '.join(out)}")
    return [out[w] for w in wanted.split(",")]


class Runner:
    """Feeds tokens through a model's cache the way the engine would for a scheme."""

    def __init__(self, model, scheme: Scheme) -> None:
        self.model, self.scheme = model, scheme
        self.layers = ModelLayers(model)
        working = scheme.precision if scheme.decode_quantized else FULL
        self.cache = self.layers.new_cache(working)
        self.runs: list[kv.StoredRun] = []  # what the current request restored, block by block
        self.length = 0

    def at_rest(self) -> bool:
        return self.scheme.precision.quantized and not self.scheme.decode_quantized

    def new_request(self) -> None:
        """Commit what the cache holds in blocks, let them cool to the scheme's precision, and
        restore them, as a returning agent's request does after its KV was quantized."""
        if not self.at_rest() or self.length == 0:
            return
        blocks = []
        for start in range(0, self.length, BLOCK_TOKENS):
            end = min(start + BLOCK_TOKENS, self.length)
            block = self.layers.cut_at(self.cache, start, end, self.runs, FULL)
            if block.precision != self.scheme.precision:
                block = kv.demote(block, self.scheme.precision)
            blocks.append((start, end, block))
        self.runs = [kv.StoredRun(start, end, block) for start, end, block in blocks]
        self.cache = self.layers.new_cache(FULL)
        self.layers.append(self.cache, [(block, end - start) for start, end, block in blocks], FULL)

    def forward(self, tokens: list[int]) -> mx.array:
        logits = self.model(mx.array(tokens)[None], cache=self.cache)
        self.length += len(tokens)
        return logits[0].astype(mx.float32)


def perplexity(model, ids: list[int], starts: list[int], scheme: Scheme) -> float:
    nll, count = 0.0, 0
    for s in starts:
        window = ids[s : s + WINDOW + 1]
        runner = Runner(model, scheme)
        for i in range(0, WINDOW, STEP):
            runner.new_request()
            logits = runner.forward(window[i : i + STEP])
            targets = mx.array(window[i + 1 : i + STEP + 1])
            logprobs = logits - mx.logsumexp(logits, axis=-1, keepdims=True)
            nll -= mx.take_along_axis(logprobs, targets[:, None], axis=-1).sum().item()
            count += STEP
    return math.exp(nll / count)


def greedy(model, prompt: list[int], n: int) -> list[int]:
    """The float-KV greedy continuation: the reference."""
    runner = Runner(model, Scheme(FULL))
    runner.forward(prompt[:-1])
    token, out = prompt[-1], []
    for _ in range(n):
        token = runner.forward([token])[-1].argmax().item()
        out.append(token)
    return out


def agreement(model, prompt: list[int], reference: list[int], scheme: Scheme) -> float:
    """The share of the reference's tokens that the scheme also picks greedily, given the same
    text before each (teacher-forced, so one early near-tie does not hide the rest). The
    prompt comes back from the cache as a returning request's would; the continuation is the
    request's own tokens."""
    runner = Runner(model, scheme)
    runner.forward(prompt[:-1])
    runner.new_request()
    picks = runner.forward([prompt[-1], *reference[:-1]]).argmax(axis=-1).tolist()
    return sum(a == b for a, b in zip(picks, reference)) / len(reference)


def free_running(model, prompt: list[int], reference: list[int], scheme: Scheme) -> float:
    """The share of the scheme's own greedy reply before its first token unlike the reference."""
    runner = Runner(model, scheme)
    runner.forward(prompt[:-1])
    runner.new_request()
    token = prompt[-1]
    for i, expected in enumerate(reference):
        token = runner.forward([token])[-1].argmax().item()
        if token != expected:
            return i / len(reference)
    return 1.0


def decode_speed(model, scheme: Scheme, batch: int, context: int, steps: int) -> float:
    """Aggregate tok/s of `batch` sequences decoding together over `context` cached tokens."""
    history = mx.random.randint(0, 1000, (1, context), key=mx.random.key(0))
    single = ModelLayers(model).new_cache(scheme.precision if scheme.decode_quantized else FULL)
    model(history, cache=single)
    mx.eval([c.state for c in single])
    merge = BatchQuantizedKVCache.merge if scheme.decode_quantized else BatchKVCache.merge
    cache = [merge([c] * batch) for c in single]
    y = mx.zeros((batch, 1), dtype=mx.int32)
    for _ in range(3):
        y = model(y, cache=cache)[:, -1].argmax(axis=-1)[:, None]
        mx.eval(y)
    start = time.perf_counter()
    for _ in range(steps):
        y = model(y, cache=cache)[:, -1].argmax(axis=-1)[:, None]
        mx.eval(y)
    return batch * steps / (time.perf_counter() - start)


def kv_bytes_per_1k_tokens(model, precision: KVPrecision) -> int:
    return 1000 * ModelLayers(model).bytes_per_token(precision)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--model", default="demo", help="model folder, 'demo' (default) or 'tiny'")
    parser.add_argument("--windows", type=int, default=8, help="1,024-token windows for perplexity")
    parser.add_argument("--generate", type=int, default=256, help="greedy tokens compared with float KV")
    parser.add_argument("--prompts", type=int, default=4, help="prompts for greedy agreement")
    parser.add_argument("--context-tokens", type=int, default=1024, help="history for the decode speed")
    parser.add_argument("--decode-steps", type=int, default=32)
    parser.add_argument("--schemes", default=None, help="comma-separated: exact, q4g64, q4g64-dq, ... (default: all)")
    parser.add_argument("--json", type=Path, help="also write the results here")
    args = parser.parse_args()
    args.model = str(resolve_model(args.model, default_cache_dir() / "models"))  # never a hub
    model, tokenizer = load(args.model)
    ids = tokenizer.encode("".join(p.read_text() for p in TEXTS))
    span = len(ids) - WINDOW - 1
    starts = [i * span // max(1, args.windows - 1) for i in range(args.windows)]
    prompts = [ids[i * span // max(1, args.prompts) :][:WINDOW] for i in range(args.prompts)]
    print(f"model {Path(args.model).name}: {len(ids)} tokens of text, {args.windows} windows", file=sys.stderr)

    references = [greedy(model, p, args.generate) for p in prompts]
    results, base = [], None
    for scheme in schemes(args.schemes):
        t0 = time.perf_counter()
        ppl = perplexity(model, ids, starts, scheme)
        base = base or ppl
        agree = [agreement(model, p, r, scheme) for p, r in zip(prompts, references)]
        free = [free_running(model, p, r, scheme) for p, r in zip(prompts, references)]
        row = {
            "scheme": scheme.name,
            "bits": scheme.precision.bits,
            "group_size": scheme.precision.group_size if scheme.precision.quantized else None,
            "decode_quantized": scheme.decode_quantized,
            "perplexity": ppl,
            "perplexity_change": ppl / base - 1,
            "greedy_agreement": sum(agree) / len(agree),
            "free_running_match": sum(free) / len(free),
            "kv_bytes_per_1k_tokens": kv_bytes_per_1k_tokens(model, scheme.precision),
            "decode_tok_s": {
                n: decode_speed(model, scheme, n, args.context_tokens, args.decode_steps) for n in (1, 8)
            },
        }
        results.append(row)
        print(f"{scheme.name}: ppl {ppl:.3f} ({time.perf_counter() - t0:.0f} s)", file=sys.stderr)

    print(f"\nmodel: {Path(args.model).name}   machine: {platform.machine()}, {os.cpu_count()} cores")
    print(f"perplexity: {args.windows} windows of {WINDOW} tokens in {STEP}-token steps; greedy: "
          f"{args.prompts} prompts x {args.generate} tokens; decode over {args.context_tokens} cached tokens\n")
    print("| KV | perplexity | vs float | greedy agreement | free-running, same until | KV bytes / 1k tokens "
          "| decode tok/s, 1 | decode tok/s, 8 |")
    print("|---|---|---|---|---|---|---|---|")
    for r in results:
        print(f"| {r['scheme']} | {r['perplexity']:.3f} | {r['perplexity_change'] * 100:+.2f} % "
              f"| {r['greedy_agreement'] * 100:.1f} % | {r['free_running_match'] * 100:.1f} % "
              f"| {r['kv_bytes_per_1k_tokens'] / 2**20:.1f} MiB | {r['decode_tok_s'][1]:.1f} | {r['decode_tok_s'][8]:.1f} |")
    if args.json:
        args.json.write_text(json.dumps({"model": Path(args.model).name, "results": results}, indent=2))


if __name__ == "__main__":
    main()

#!/usr/bin/env python3
"""Speculative decoding: decode tok/s of agent-memory with --speculation lookup and with
--speculation draft against --speculation off, and of mlx-lm's server without and with a draft
model (--draft-model), on two workloads, one agent alone and N agents together.

    .venv/bin/python scripts/bench_speculation.py                  # the demo model
    .venv/bin/python scripts/bench_speculation.py --reps 5 --json out.json

Workloads (greedy, streamed; each agent's prompt its own):
  edit   an agent sends a ~400-token Python file and asks for it back with one change, then a
         search/replace block quoting the lines it changes: output that repeats its input.
  free   an agent asks for a story: output that repeats nothing.

Decode tok/s counts from a request's first streamed text to its last (prefill left out): one
agent, its own rate; N agents, all their tokens over the span from the first one's first text to
the last one's last. Every prompt is new to every server (the repetition's number first), so
none is read from a cache; all servers get the same prompts. Tokens are the output text's tokens
(the model's tokenizer), the same count for every server where the text is the same. Every server runs in its own process and all are up
at once; each repetition runs every server in turn (its order rotating), and the table shows
medians, so the ratios hold on a noisy machine.

The draft model, for our --draft-model and mlx-lm's, is built here from the model itself: its
first --draft-layers layers, embeddings and final norm saved as a smaller model with the same
tokenizer (for the demo model, SmolLM2-135M, 4 of its 30 layers).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import shutil
import statistics
import sys
import tempfile
import time
from pathlib import Path

import httpx

sys.path.insert(0, str(Path(__file__).resolve().parent))
from bench.processes import find_openblas  # noqa: E402
from bench.server import REPO, ServerProcess, clean_env, offline_env, ours_command  # noqa: E402

SERVERS = ("lookup", "draft", "off", "mlx-lm", "mlx-lm-draft")


def source_file(agent: int) -> str:
    """A ~400-token Python module, different for each agent."""
    lines = [f'"""Handlers of service {agent}."""', "", "import json", ""]
    for i in range(10):
        lines += [
            f"def handle_{agent}_{i}(request, config):",
            f"    value = request.get('field_{i}', {i + agent})",
            f"    return json.dumps({{'id': {i}, 'value': config.scale(value)}})",
            "",
        ]
    return "\n".join(lines)


def edit_prompt(agent: int) -> str:
    return (
        f"Here is service_{agent}.py:\n```python\n{source_file(agent)}\n```\n"
        f"Rename the parameter config to settings in handle_{agent}_3. Write the whole file with the change, "
        "then a search/replace block (<<<<<<< SEARCH, =======, >>>>>>> REPLACE) quoting the lines you changed."
    )


def free_prompt(agent: int) -> str:
    topics = ["a lighthouse keeper", "a desert caravan", "a night train", "a mountain village"]
    return f"Write a long story about {topics[agent % len(topics)]} who finds a letter. Story {agent}."


def build_draft(model: Path, layers: int, out: Path) -> Path:
    """The model's first `layers` layers as a model of its own (same tokenizer)."""
    import mlx.core as mx

    config = json.loads((model / "config.json").read_text())
    out.mkdir(parents=True, exist_ok=True)
    weights = {}
    for f in sorted(model.glob("*.safetensors")):
        for name, w in mx.load(str(f)).items():
            parts = name.split(".")
            if "layers" in parts and int(parts[parts.index("layers") + 1]) >= layers:
                continue
            weights[name] = w
    mx.save_safetensors(str(out / "model.safetensors"), weights)
    (out / "config.json").write_text(json.dumps({**config, "num_hidden_layers": layers}, indent=1))
    for f in model.iterdir():
        if f.suffix != ".safetensors" and f.name != "config.json" and f.is_file():
            shutil.copy(f, out / f.name)
    return out


class Server:
    """Ours with --speculation lookup|draft|off, or mlx-lm's server with or without its draft
    model, launched at once (a ServerProcess; several load side by side)."""

    def __init__(self, kind: str, model: Path, draft: Path, work: Path, args) -> None:
        self.kind = kind
        self.model = "default_model" if kind.startswith("mlx-lm") else model.name
        if kind in ("lookup", "draft", "off"):
            flags = ["--kv-bits", "16", "--speculation", kind]
            flags += ["--draft-model", str(draft)] if kind == "draft" else []
            command = lambda port: ours_command(port, [model], work / kind, *flags)  # noqa: E731
            env = clean_env(PYTHONPATH=str(REPO))
        else:
            def command(port: int) -> list[str]:
                cmd = [sys.executable, "-m", "mlx_lm", "server", "--model", str(model), "--port", str(port)]
                cmd += ["--temp", "0", "--log-level", "WARNING"]
                if kind == "mlx-lm-draft":
                    cmd += ["--draft-model", str(draft), "--num-draft-tokens", str(args.num_draft_tokens)]
                return cmd
            lib = find_openblas()
            env = offline_env(**({"LD_PRELOAD": lib} if lib else {}))
        self.process = ServerProcess(kind, command, env, work).launch()

    @property
    def port(self) -> int:
        return self.process.port

    def ready(self) -> None:
        self.process.wait_ready(300)

    def stop(self) -> None:
        self.process.stop(timeout=60)


async def one(client: httpx.AsyncClient, server: Server, prompt: str, max_tokens: int) -> tuple[str, float, float]:
    """(text, time of its first text, time of its last)."""
    body = {
        "model": server.model,
        "messages": [{"role": "user", "content": prompt}],
        "max_tokens": max_tokens,
        "temperature": 0,
        "stream": True,
    }
    text, first, last = "", None, None
    url = f"http://127.0.0.1:{server.port}/v1/chat/completions"
    async with client.stream("POST", url, json=body, timeout=1800) as r:
        async for line in r.aiter_lines():
            if not line.startswith("data: ") or line == "data: [DONE]":
                continue
            chunk = json.loads(line[6:])
            for choice in chunk.get("choices") or []:
                piece = (choice.get("delta") or {}).get("content") or ""
                if piece:
                    last = time.perf_counter()
                    first = first or last
                    text += piece
    return text, first, last


def run(server: Server, prompts: list[str], max_tokens: int, count, n: int | str) -> dict:
    """One run of a workload, its prompts new to the server (run `n` first; every server gets
    the same): mlx-lm's server with --draft-model answers a prompt it has cached with no text
    (0.32.2). Several agents are returning agents: each sends its prompt once with max_tokens 1
    first (its prefill, kept by the server's cache), so the span counted is their decoding, not
    one agent's prefill interleaved with the others' decoding. mlx-lm's server with a draft is
    not primed (its cache would answer with no text)."""
    prompts = [f"(run {n}) {p}" for p in prompts]

    async def together():
        async with httpx.AsyncClient() as client:
            if len(prompts) > 1 and server.kind != "mlx-lm-draft":
                await asyncio.gather(*(one(client, server, p, 1) for p in prompts))
            return await asyncio.gather(*(one(client, server, p, max_tokens) for p in prompts))

    results = asyncio.run(together())
    tokens = [count(text) for text, _, _ in results]
    span = max(last for _, _, last in results) - min(first for _, first, _ in results)
    decoded = sum(tokens) - len(tokens)  # each request's first token is the prefill's
    return {"tok_s": decoded / span, "tokens": tokens, "texts": [t for t, _, _ in results]}


def main() -> None:
    from agent_memory.config import default_cache_dir

    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--model", type=Path, default=default_cache_dir() / "models" / "smollm2-135m-instruct")
    p.add_argument("--agents", type=int, default=8, help="agents together in the batched runs")
    p.add_argument("--reps", type=int, default=2)
    p.add_argument("--edit-tokens", type=int, default=400, help="max_tokens of an edit, one agent")
    p.add_argument("--free-tokens", type=int, default=150, help="max_tokens of a story, one agent")
    p.add_argument("--batch-edit-tokens", type=int, default=120, help="max_tokens of an edit, N agents")
    p.add_argument("--batch-free-tokens", type=int, default=60, help="max_tokens of a story, N agents")
    p.add_argument("--draft-layers", type=int, default=4)
    p.add_argument("--num-draft-tokens", type=int, default=3, help="mlx-lm's default")
    p.add_argument("--servers", default=",".join(SERVERS), help=f"some of {', '.join(SERVERS)}")
    p.add_argument("--workloads", default="edit x1,edit xN,free x1,free xN", help="some of these (N: --agents)")
    p.add_argument("--json", type=Path)
    args = p.parse_args()

    from tokenizers import Tokenizer

    tokenizer = Tokenizer.from_file(str(args.model / "tokenizer.json"))

    def count(text: str) -> int:
        return len(tokenizer.encode(text, add_special_tokens=False).ids)

    work = Path(tempfile.mkdtemp(prefix="bench-speculation-"))
    draft = build_draft(args.model, args.draft_layers, work / "draft")
    kinds = args.servers.split(",")
    servers = [Server(k, args.model, draft, work, args) for k in kinds]
    workloads = {
        "edit x1": ([edit_prompt(0)], args.edit_tokens),
        f"edit x{args.agents}": ([edit_prompt(i) for i in range(args.agents)], args.batch_edit_tokens),
        "free x1": ([free_prompt(0)], args.free_tokens),
        f"free x{args.agents}": ([free_prompt(i) for i in range(args.agents)], args.batch_free_tokens),
    }
    chosen = [w.replace("xN", f"x{args.agents}") for w in args.workloads.split(",")]
    workloads = {name: workloads[name] for name in chosen}
    results: dict = {w: {k: [] for k in kinds} for w in workloads}
    texts: dict = {}
    try:
        for s in servers:
            s.ready()
        for name, (prompts, max_tokens) in workloads.items():
            for s in servers:  # a warm-up: each server compiles its shapes and caches the prompts
                run(s, prompts[:1], 8, count, "warm-up")
            for rep in range(args.reps):
                for s in servers[rep % len(servers) :] + servers[: rep % len(servers)]:
                    r = run(s, prompts, max_tokens, count, rep)
                    results[name][s.kind].append(r["tok_s"])
                    texts.setdefault(name, {})[s.kind] = r["texts"]
                    print(f"{name:10} {s.kind:13} {r['tok_s']:7.1f} tok/s  tokens {r['tokens']}", flush=True)
    finally:
        for s in servers:
            s.stop()

    base = "off" if "off" in kinds else kinds[0]
    print(f"\n| workload | {' | '.join(kinds)} |\n|---|{'---|' * len(kinds)}")
    summary = {}
    for name in workloads:
        medians = {k: statistics.median(v) for k, v in results[name].items()}
        summary[name] = medians
        cells = [f"{medians[k]:.1f} ({medians[k] / medians[base]:.2f}×)" for k in kinds]
        print(f"| {name} | {' | '.join(cells)} |")
    same = {n: {k: t == texts[n][base] for k, t in texts[n].items()} for n in texts}
    print(f"\nsame text as {base}: {same}")
    if args.json:
        args.json.write_text(json.dumps({"medians": summary, "runs": results, "same_text": same}, indent=1))
    shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    main()

#!/usr/bin/env python
"""Where the time of a returning agent's turn goes, part by part.

    .venv/bin/python scripts/profile_turn.py                   # the demo model, 2,000-token history
    .venv/bin/python scripts/profile_turn.py --history-tokens 4000 --model DIR

Times, on one thread and with nothing else running, each step the server takes for a turn of
an agent whose earlier conversation is cached: rendering and tokenizing the chat, hashing the
prompt into blocks, reading the blocks from disk (warm) or taking them from memory (hot),
assembling the working cache (from exact hot blocks: concatenate; from cooled ones: dequantize
too), prefilling the new message, one decode step. Then the same turn end to end through the real server (HTTP, streaming), so the
difference shows what the server adds. The cold prefill of the whole prompt is the yardstick.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path[:0] = [str(REPO), str(REPO / "scripts")]  # agent_memory, and scripts/bench

from agent_memory.engine.kinds import attention  # noqa: E402  (first: it loads OpenBLAS before MLX)

import mlx.core as mx  # noqa: E402
from openai import OpenAI  # noqa: E402

from agent_memory.config import default_cache_dir  # noqa: E402
from agent_memory.engine.kinds.layers import ModelLayers  # noqa: E402
from agent_memory.engine.loading.loader import describe_model, load_model  # noqa: E402
from agent_memory import files  # noqa: E402
from agent_memory.memory.hashing import BlockNames  # noqa: E402
from agent_memory.memory.warm.format import blockfile# noqa: E402
from agent_memory.memory.warm.format.records import BLOCK_TOKENS  # noqa: E402
from agent_memory.models.registry import resolve_model  # noqa: E402
from agent_memory.precision import KVPrecision  # noqa: E402
from bench.server import ServerProcess, offline_env, ours_command  # noqa: E402

TEXT = Path("/usr/share/common-licenses/GPL-3")


def timed(fn, repeats: int = 5) -> tuple[float, object]:
    """Median seconds of `repeats` calls (MLX results evaluated), and the last result."""
    times, out = [], None
    for _ in range(repeats):
        t = time.perf_counter()
        out = fn()
        if isinstance(out, mx.array):
            mx.eval(out)
        times.append(time.perf_counter() - t)
    return statistics.median(times), out


def conversation(tokenizer, history_tokens: int) -> list[dict]:
    """A system prompt and turns of licence text until the history reaches the size asked."""
    words = TEXT.read_text().split()
    messages = [{"role": "system", "content": "You are a careful legal assistant."}]
    i = 0
    while len(tokenizer.apply_chat_template(messages, tokenize=True)) < history_tokens:
        messages.append({"role": "user", "content": "Explain this: " + " ".join(words[i : i + 60])})
        messages.append({"role": "assistant", "content": " ".join(words[i + 60 : i + 160])})
        i = (i + 160) % (len(words) - 200)
    return messages


def engine_parts(loaded, messages: list[dict], precision: KVPrecision, work: Path) -> dict:
    model, tokenizer = loaded.model, loaded.tokenizer
    turn = messages + [{"role": "user", "content": "Now summarise all of that in one sentence."}]
    t_tok, prompt = timed(lambda: tokenizer.apply_chat_template(turn, add_generation_prompt=True))
    history = tokenizer.apply_chat_template(messages, tokenize=True)
    cached = len(history) // BLOCK_TOKENS * BLOCK_TOKENS
    full = KVPrecision()
    layers = ModelLayers(model)

    def prefill(tokens, cache=None):
        cache = cache or layers.new_cache(full)
        model(mx.array(tokens)[None], cache=cache)
        mx.eval([c.state for c in cache])
        return cache

    t_cold, _ = timed(lambda: prefill(prompt[:-1]), repeats=2)
    cache = prefill(prompt[:cached])
    exact = [layers.cut_at(cache, s, s + BLOCK_TOKENS, [], full) for s in range(0, cached, BLOCK_TOKENS)]
    blocks = [attention.demote(b, precision) for b in exact]  # cooled: what the disk and a full hot tier hold
    prefix = BlockNames(loaded.fingerprint, BLOCK_TOKENS)
    t_hash, _ = timed(lambda: prefix.chain(prompt[:-1]))

    # Warm: the blocks as files, read back with every check, as the kv-reader does.
    paths = []
    for i, block in enumerate(blocks):
        path = work / f"{i}.safetensors"
        files.write_atomic(path, blockfile.encode({"hash": str(i)}, attention.to_numpy(block.arrays)))
        paths.append(path)
    layout = layers.block_layout(BLOCK_TOKENS, precision)
    t_read, _ = timed(lambda: [blockfile.read(p, {"hash": str(i)}, layout) for i, p in enumerate(paths)])

    def assemble(parts=blocks):
        working = layers.new_cache(full)
        layers.append(working, [(b, BLOCK_TOKENS) for b in parts], full)
        return working

    t_exact, _ = timed(lambda: assemble(exact))
    t_assemble, working = timed(assemble)
    suffix = prompt[cached:-1]
    t_suffix, _ = timed(lambda: prefill(suffix, assemble()), repeats=3)
    t_suffix -= t_assemble
    working = prefill(suffix, working)

    def step():
        return model(mx.array([[prompt[-1]]]), cache=working)[0, -1].argmax()

    t_step, _ = timed(step)
    return {
        "prompt tokens": len(prompt),
        "cached tokens": cached,
        "tokenize (chat template)": t_tok,
        "hash the prompt into blocks": t_hash,
        f"read {len(blocks)} block files (warm)": t_read,
        "assemble the working cache from exact blocks (hot: concatenate)": t_exact,
        "assemble the working cache from cooled blocks (dequantize + concatenate)": t_assemble,
        f"prefill the {len(suffix)} new tokens": t_suffix,
        "one decode step": t_step,
        "cold prefill of the whole prompt": t_cold,
    }


def server_ttft(model_dir: Path, messages: list[dict], work: Path) -> dict:
    """TTFT of the next turn through the real server: hot, then warm after a restart."""
    command = lambda port: ours_command(port, [model_dir], work / "cache")  # noqa: E731
    server = ServerProcess("server", command, offline_env(), work)

    def ttft(msgs) -> float:
        client = OpenAI(base_url=server.base_url, api_key="x")
        t = time.perf_counter()
        stream = client.chat.completions.create(
            model="m", messages=msgs, max_tokens=8, temperature=0, stream=True, extra_body={"prompt_cache_key": "p"}
        )
        first = None
        for chunk in stream:
            if first is None and chunk.choices and chunk.choices[0].delta.content:
                first = time.perf_counter() - t
        return first

    turn = messages + [{"role": "user", "content": "Now summarise all of that in one sentence."}]
    with server.start():
        cold = ttft(messages)
        hot = ttft(turn)
    with server.start():
        warm = ttft(turn)
    return {"server TTFT, cold (history uncached)": cold, "server TTFT, hot": hot, "server TTFT, warm (after restart)": warm}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--model", default="demo", help="model folder, 'demo' (default) or 'tiny'")
    parser.add_argument("--history-tokens", type=int, default=2000)
    parser.add_argument("--kv-bits", type=int, default=4)
    parser.add_argument("--kv-group-size", type=int, default=64)
    args = parser.parse_args()
    model_dir = resolve_model(args.model, default_cache_dir() / "models")
    precision = KVPrecision(args.kv_bits, args.kv_group_size)
    with tempfile.TemporaryDirectory(prefix="profile-turn-") as tmp:
        work = Path(tmp)
        loaded = load_model(describe_model(model_dir))
        messages = conversation(loaded.tokenizer, args.history_tokens)
        parts = engine_parts(loaded, messages, precision, work)
        parts.update(server_ttft(model_dir, messages, work))
    print(f"\nmodel {model_dir.name}, KV cached as {precision.tag}\n")
    print("| step | ms |")
    print("|---|---:|")
    for name, value in parts.items():
        shown = f"{value:,} tokens" if isinstance(value, int) else f"{value * 1000:.1f}"
        print(f"| {name} | {shown} |")


if __name__ == "__main__":
    main()

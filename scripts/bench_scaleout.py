#!/usr/bin/env python3
"""Measure the shared warm tier (docs/scale-out.md): real servers, a real redis-server.

    python scripts/bench_scaleout.py ttft   [--rounds 5] [--words 1500]   # servers side by side
    python scripts/bench_scaleout.py budget                               # Redis memory, no model

`ttft` starts five servers of the demo model (or --model) and times turn 2 of a fresh
conversation, streamed, in each way its cache can come back, the configurations alternating
round by round (the order rotates) so that a busy machine weighs on all alike:

    hot          the same server, its previous turn still in memory
    warm_folder  the same server, read from its cache folder (--hot-budget-mb 0)
    warm_redis   the same server, read from Redis (--hot-budget-mb 0)
    failover     another server, which never saw the agent: probe, then read from Redis
    cold         a server without any cache: everything recomputed

Each figure is printed with the load average at that moment (`uptime`). `budget` writes
blocks of the demo model's Q4 size through RedisBackend into a Redis with a small maxmemory and
reports what a block costs Redis, how eviction behaves, and the probe's round trip.
"""

from __future__ import annotations

import argparse
import json
import random
import shutil
import statistics
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))  # scripts/bench

from bench.processes import load_average  # noqa: E402
from bench.server import DEMO_MODEL, REPO, ServerProcess, clean_env, ours_command, start_redis  # noqa: E402

CONFIGS = ["hot", "warm_folder", "warm_redis", "failover", "cold"]


def load() -> str:
    return "load " + load_average()


class Redis:
    """redis-server (bench/server.py's start_redis) and a client of it, for its memory figures."""

    def __init__(self, folder: Path, maxmemory: str) -> None:
        import redis

        self.process, self.url = start_redis(folder, maxmemory)
        self.client = redis.Redis(port=self.process.port)

    def stop(self) -> None:
        self.process.stop()


class Server:
    """`agent-memory serve` on a folder of its own, launched at once (a ServerProcess: the five
    load side by side), waited for later."""

    def __init__(self, name: str, model: Path, folder: Path, *args: str) -> None:
        self.name = name
        command = lambda port: ours_command(port, [model], folder, *args)  # noqa: E731
        self.process = ServerProcess("server", command, clean_env(), folder).launch()

    @property
    def url(self) -> str:
        return self.process.url

    def wait(self) -> None:
        try:
            self.process.wait_ready(300)
        except RuntimeError as e:
            raise SystemExit(f"{self.name} did not start: {e}") from e

    def stop(self) -> None:
        self.process.stop(timeout=60)


def document(rng: random.Random, words: int) -> str:
    vocab = "harbour lamp keeper storm north ledger tide rope signal fog bell night ship rock light".split()
    return " ".join(rng.choice(vocab) for _ in range(words))


def turn(server: Server, msgs: list[dict], agent: str, max_tokens: int = 16) -> dict:
    """One streamed turn: TTFT (first content), total, usage."""
    import openai

    client = openai.OpenAI(base_url=server.url + "/v1", api_key="unused", max_retries=0, timeout=600)
    start = time.perf_counter()
    first, text, usage = None, [], None
    stream = client.chat.completions.create(
        model="demo", messages=msgs, max_tokens=max_tokens, temperature=0, stream=True,
        stream_options={"include_usage": True}, extra_body={"prompt_cache_key": agent},
    )
    for chunk in stream:
        if chunk.choices and chunk.choices[0].delta.content:
            first = first or time.perf_counter()
            text.append(chunk.choices[0].delta.content)
        if chunk.usage:
            usage = chunk.usage
    details = usage.prompt_tokens_details.model_extra if usage and usage.prompt_tokens_details else {}
    return {
        "ttft_s": (first or time.perf_counter()) - start,
        "total_s": time.perf_counter() - start,
        "prompt_tokens": usage.prompt_tokens if usage else None,
        "hot": details.get("hot_tokens"),
        "warm": details.get("warm_tokens"),
        "reply": "".join(text),
        "load": load(),
    }


def ttft(args) -> dict:
    work = Path(tempfile.mkdtemp(prefix="bench-scaleout-"))
    redis = Redis(work, "2gb")
    kv = ["--kv-bits", str(args.kv_bits)]
    servers = {
        "hot": Server("hot", args.model, work / "hot", *kv),
        "folder": Server("folder", args.model, work / "folder", "--hot-budget-mb", "0", *kv),
        "redis_a": Server("redis_a", args.model, work / "ra", "--warm-store", redis.url, "--hot-budget-mb", "0", *kv),
        "redis_b": Server("redis_b", args.model, work / "rb", "--warm-store", redis.url, "--hot-budget-mb", "0", *kv),
        "cold": Server("cold", args.model, work / "cold", "--disk-budget-mb", "0", "--hot-budget-mb", "0", *kv),
    }
    route = {  # (server of turn 1, server of turn 2)
        "hot": ("hot", "hot"),
        "warm_folder": ("folder", "folder"),
        "warm_redis": ("redis_a", "redis_a"),
        "failover": ("redis_a", "redis_b"),
        "cold": ("cold", "cold"),
    }
    results: dict[str, list[dict]] = {c: [] for c in CONFIGS}
    try:
        for s in servers.values():
            s.wait()
        print(f"servers up ({load()})", flush=True)
        rng = random.Random(7)
        for r in range(args.rounds + 1):  # round 0 warms every server up and is not counted
            doc = document(rng, args.words)
            order = CONFIGS[r % len(CONFIGS) :] + CONFIGS[: r % len(CONFIGS)]
            for config in order:
                first, second = (servers[n] for n in route[config])
                agent = f"{config}-{r}"
                msgs = [{"role": "system", "content": "You summarise a harbour master's log."},
                        {"role": "user", "content": f"The log:\n{doc}\n\nWhat happened first?"}]
                one = turn(first, msgs, agent)
                time.sleep(1.0)  # its blocks written (and, with a 0 hot budget, out of memory)
                msgs += [{"role": "assistant", "content": one["reply"]}, {"role": "user", "content": "And then?"}]
                two = turn(second, msgs, agent)
                if r:
                    results[config].append(two)
                    print(f"round {r} {config:12s} ttft {two['ttft_s'] * 1000:7.0f} ms  prompt {two['prompt_tokens']}"
                          f"  hot {two['hot']} warm {two['warm']}  ({two['load']})", flush=True)
        info = redis.client.info("memory")
        keys = list(redis.client.scan_iter(match="am:*:b:*"))
        sizes = [redis.client.strlen(k) for k in keys]
        memory = {
            "blocks": len(keys),
            "block_bytes": sum(sizes),
            "used_memory": info["used_memory"],
            "used_memory_dataset": info.get("used_memory_dataset"),
        }
    finally:
        for s in servers.values():
            s.stop()
        redis.stop()
        shutil.rmtree(work, ignore_errors=True)
    summary = {
        c: {
            "median_ttft_ms": round(statistics.median(x["ttft_s"] for x in rs) * 1000),
            "min_ttft_ms": round(min(x["ttft_s"] for x in rs) * 1000),
            "max_ttft_ms": round(max(x["ttft_s"] for x in rs) * 1000),
            "prompt_tokens": statistics.median(x["prompt_tokens"] for x in rs),
            "warm_tokens": statistics.median(x["warm"] or 0 for x in rs),
            "hot_tokens": statistics.median(x["hot"] or 0 for x in rs),
            "loads": [x["load"] for x in rs],
        }
        for c, rs in results.items()
    }
    return {"summary": summary, "redis_memory": memory, "rounds": results}


def budget(args) -> dict:
    """Blocks of the demo model's Q4 size (header + tensors) into a Redis of 64 MB."""
    sys.path.insert(0, str(REPO))
    from agent_memory.agent_key import AgentKey
    from agent_memory.memory.warm.format.records import Manifest
    from agent_memory.memory.warm.redis.backend import RedisBackend

    block = args.block_bytes
    work = Path(tempfile.mkdtemp(prefix="bench-redis-"))
    redis = Redis(work, "64mb")
    try:
        store = RedisBackend(redis.url, "demo-0123456789ab-q4g64")
        store.open({"name": "demo"}, lambda fp: True)
        rng = random.Random(1)
        agents, per_agent = 40, 8  # 320 blocks: about 2.3 x what 64 MB holds
        t0 = time.perf_counter()
        for a in range(agents):
            hashes = [f"{a:04x}{i:04x}".ljust(32, "0") for i in range(per_agent)]
            for h in hashes:
                store.put_block(h, [rng.randbytes(block)])
            m = Manifest(AgentKey(f"agent-{a}"), "f" * 32, list(range(per_agent * 64)), hashes, time.time())
            store.write_manifest(m, None, f"e{a}")
        put_s = time.perf_counter() - t0
        info = redis.client.info()
        survivors = [
            sum(1 for i in range(per_agent) if redis.client.exists(store.keys.block_key(f"{a:04x}{i:04x}".ljust(32, "0"))))
            for a in range(agents)
        ]
        manifests = sum(1 for a in range(agents) if store.read_manifest(AgentKey(f"agent-{a}")))
        # The probe a returning agent's request makes (manifest unchanged, 32 block names).
        t0 = time.perf_counter()
        for _ in range(200):
            store.probe(AgentKey("agent-39"), "e39", [f"{39:04x}{i:04x}".ljust(32, "0") for i in range(8)] * 4)
        probe_ms = (time.perf_counter() - t0) / 200 * 1000
        t0 = time.perf_counter()
        for _ in range(50):
            store.get_block_bytes(f"{39:04x}{0:04x}".ljust(32, "0"))
        get_ms = (time.perf_counter() - t0) / 50 * 1000
        # One block alone: what Redis holds for it beyond its bytes.
        redis.client.flushall()
        base = redis.client.info("memory")["used_memory"]
        for i in range(20):
            store.put_block(f"ff{i:030x}", [rng.randbytes(block)])
        per_block = (redis.client.info("memory")["used_memory"] - base) / 20
    finally:
        redis.stop()
        shutil.rmtree(work, ignore_errors=True)
    return {
        "block_bytes": block,
        "written_blocks": agents * per_agent,
        "maxmemory": 64 << 20,
        "used_memory_after": info["used_memory"],
        "evicted_keys": info["evicted_keys"],
        "manifests_kept": f"{manifests}/{agents}",
        "blocks_kept_by_agent_oldest_first": survivors,
        "redis_bytes_per_block": round(per_block),
        "overhead_per_block": round(per_block - block),
        "put_ms_per_block": round(put_s / (agents * per_agent) * 1000, 2),
        "probe_ms": round(probe_ms, 3),
        "get_block_ms": round(get_ms, 3),
        "load": load(),
    }


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    sub = parser.add_subparsers(dest="what", required=True)
    t = sub.add_parser("ttft")
    t.add_argument("--model", type=Path, default=DEMO_MODEL)
    t.add_argument("--rounds", type=int, default=5)
    t.add_argument("--words", type=int, default=1500, help="words of the conversation's document (~1.3 tokens each)")
    t.add_argument("--kv-bits", type=int, default=4)
    t.add_argument("--out", type=Path)
    b = sub.add_parser("budget")
    b.add_argument("--block-bytes", type=int, default=462_848, help="a demo Q4 block file (header included)")
    b.add_argument("--out", type=Path)
    args = parser.parse_args()
    result = ttft(args) if args.what == "ttft" else budget(args)
    text = json.dumps(result if args.what == "budget" else {k: v for k, v in result.items() if k != "rounds"}, indent=2)
    print(text)
    if args.out:
        args.out.write_text(json.dumps(result, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())

"""The soak's hung-Redis part (scripts/bench_soak.py): a server on a shared warm tier in a real
redis-server, agents whose prompts are in its memory, and Redis stopped (SIGSTOP, as a hung
host) for a while. Hot agents' time to first token is measured in rounds without the stall and
during it, side by side (the machine is shared and noisy: compare the ratio, not the seconds);
every turn must be answered, and the server must say in its log when it skips Redis, when
Redis answers again, and what it writes back."""

from __future__ import annotations

import json
import shutil
import signal
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import httpx

from bench.server import start_redis
from bench.soak import Figures, Server, conversation, percentile


def stream_ttft(url: str, messages: list[dict], agent: str, max_tokens: int, timeout: float) -> tuple:
    """(TTFT or None, the answer, an error or None) of one streamed turn."""
    body = {
        "model": "m", "messages": messages, "max_tokens": max_tokens, "temperature": 0, "stream": True,
        "prompt_cache_key": agent,
    }
    t0, ttft, text = time.perf_counter(), None, ""
    try:
        with httpx.stream("POST", url + "/v1/chat/completions", json=body, timeout=timeout) as r:
            if r.status_code != 200:
                return None, "", f"HTTP {r.status_code}"
            for line in r.iter_lines():
                if not line.startswith("data:") or line.strip() == "data: [DONE]":
                    continue
                delta = json.loads(line[5:])["choices"][0]["delta"].get("content") or ""
                if delta and ttft is None:
                    ttft = time.perf_counter() - t0
                text += delta
    except (httpx.HTTPError, ValueError, KeyError) as e:
        return None, text, f"{type(e).__name__}: {e}"
    return ttft, text, None


def part_hung_redis(args, model: Path, work: Path, deadline: float, figs: Figures) -> None:
    if shutil.which("redis-server") is None:
        figs.add("hung_redis", "skipped", "redis-server is not installed")
        return
    stall_s = args.redis_stall_s or max(5.0, min(30.0, (deadline - time.monotonic()) / 2))
    redis, url = start_redis(work)
    server = Server(model, work / "redis-server", work / "logs", "hung-redis", "--warm-store", url)
    agents = [f"hot-{i}" for i in range(max(2, args.agents))]
    replies: dict[str, list[str]] = {a: [] for a in agents}
    errors: list[str] = []

    def turn(agent: str) -> float | None:
        i = int(agent.split("-")[1])
        messages = conversation(i)
        for n, reply in enumerate(replies[agent]):
            question = {"role": "user", "content": f"And after that, part {n + 2}?"}
            messages += [{"role": "assistant", "content": reply}, question]
        ttft, text, error = stream_ttft(server.url, messages, agent, args.max_tokens, timeout=60)
        if error:
            errors.append(f"{agent}: {error}")
        replies[agent].append(text)
        return ttft

    def round_() -> list[float]:
        with ThreadPoolExecutor(len(agents)) as pool:
            return [t for t in pool.map(turn, agents) if t is not None]

    try:
        server.start()
        round_()  # first turns: the agents' prompts are in memory from now on
        calm = round_() + round_()
        time.sleep(1.0)
        redis.proc.send_signal(signal.SIGSTOP)
        stopped, first, later = time.monotonic(), round_(), []
        while time.monotonic() - stopped < stall_s:
            later += round_()
        stall = time.monotonic() - stopped
        redis.proc.send_signal(signal.SIGCONT)
        back = time.monotonic()
        while "answers again after" not in server.log() and time.monotonic() - back < 30:
            time.sleep(0.1)
        back_s = time.monotonic() - back if "answers again after" in server.log() else None
        time.sleep(2.0)
        log = server.log()
        after = round_()
    finally:
        redis.proc.send_signal(signal.SIGCONT)
        server.stop()
        redis.stop(timeout=10)

    def p50(values: list[float]) -> str:
        return f"{percentile(values, 0.5):.2f}" if values else "n/a"

    base = percentile(calm, 0.5)
    figs.add("hung_redis", "agents (prompts in memory) / Redis stopped for (s)", f"{len(agents)} / {stall:.0f}")
    figs.add("hung_redis", "turns during the stall", len(first) + len(later))
    figs.add("hung_redis", "request errors", len(errors), "0")
    figs.add("hung_redis", "hot TTFT p50 (s): no stall / stall's first round / its later rounds / after",
             f"{p50(calm)} / {p50(first)} / {p50(later)} / {p50(after)}")
    if base:
        ratios = " / ".join(f"{percentile(v, 0.5) / base:.2f}x" if v else "n/a" for v in (first, later, after))
        figs.add("hung_redis", "the same against no stall", ratios)
    peaks = f"{max(calm, default=0):.2f} / {max(first + later, default=0):.2f}"
    figs.add("hung_redis", "hot TTFT max (s): no stall / during the stall", peaks)
    said = " / ".join(str(p in log) for p in ("skipped until it answers again", "answers again after", "writing back"))
    figs.add("hung_redis", "log: skipped / answers again / written back", said, "True / True / True")
    figs.add("hung_redis", "Redis used again after SIGCONT (s)", f"{back_s:.1f}" if back_s is not None else "never")
    figs.data["hung_redis"].update({"ttft_calm_s": calm, "ttft_stall_first_s": first, "ttft_stall_later_s": later,
                                    "ttft_after_s": after, "errors_detail": errors[:10]})

"""The agents and their turns against an OpenAI-compatible server: one streamed request (TTFT,
usage's cached tokens), a phase of staggered agents, the warm-up and the shared-prefix probe."""

from __future__ import annotations

import asyncio
import json
import sys
import time
from dataclasses import dataclass, field

import httpx

from bench.text import persona, user_message

@dataclass
class Record:
    agent: int
    phase: str  # "first" | "later" | "crash" | "graceful"
    turn: int
    start: float = 0.0
    ttft: float | None = None
    latency: float | None = None
    prompt_tokens: int | None = None
    cached_tokens: int | None = None  # None where the server does not report it
    log_cached_tokens: int | None = None  # vllm-mlx: what its own log says it reused
    hot_tokens: int | None = None
    warm_tokens: int | None = None
    completion_tokens: int | None = None
    error: str | None = None


@dataclass
class Agent:
    index: int
    messages: list[dict] = field(default_factory=list)

    @property
    def id(self) -> str:
        return f"bench-agent-{self.index:03d}"


async def one_request(client: httpx.AsyncClient, base_url: str, model: str, agent: Agent, args) -> tuple[Record, str]:
    body = {
        "model": model,
        "messages": agent.messages,
        "max_tokens": args.max_tokens,
        "temperature": 0,
        "stream": True,
        "stream_options": {"include_usage": True},
        "prompt_cache_key": agent.id,
    }
    rec = Record(agent.index, "", 0)
    text: list[str] = []
    t0 = time.perf_counter()
    rec.start = time.time()
    try:
        async with client.stream("POST", base_url + "/chat/completions", json=body,
                                 headers={"X-Agent-Id": agent.id, "Authorization": f"Bearer {args.api_key}"}) as r:
            if r.status_code != 200:
                raw = (await r.aread()).decode(errors="replace")
                rec.error = f"HTTP {r.status_code}: {raw[:300]}"
                return rec, ""
            async for line in r.aiter_lines():
                if not line.startswith("data:"):
                    continue  # blank separators, ': keepalive' comments
                data = line[5:].strip()
                if data == "[DONE]":
                    break
                chunk = json.loads(data)
                if "error" in chunk and chunk["error"]:
                    rec.error = f"stream error: {json.dumps(chunk['error'])[:300]}"
                    break
                for choice in chunk.get("choices") or []:
                    delta = choice.get("delta") or {}
                    piece = delta.get("content") or ""
                    if (piece or choice.get("finish_reason")) and rec.ttft is None:
                        # The first real token (a role-only first chunk does not count).
                        rec.ttft = time.perf_counter() - t0
                    text.append(piece)
                usage = chunk.get("usage")
                if usage:
                    rec.prompt_tokens = usage.get("prompt_tokens")
                    rec.completion_tokens = usage.get("completion_tokens")
                    details = usage.get("prompt_tokens_details") or {}
                    rec.cached_tokens = details.get("cached_tokens")
                    rec.hot_tokens = details.get("hot_tokens")
                    rec.warm_tokens = details.get("warm_tokens")
    except (httpx.HTTPError, json.JSONDecodeError) as e:
        rec.error = f"{type(e).__name__}: {e}"[:300]
    rec.latency = time.perf_counter() - t0
    return rec, "".join(text)


async def run_phase(base_url: str, model: str, agents: list[Agent], turns: int, phase_of, first_turn: int,
                    args) -> tuple[list[Record], float]:
    """Every agent starts after index x stagger seconds and runs `turns` turns, `--think`
    seconds apart (the time an agent spends on a reply, or a tool, before its next turn)."""
    limits = httpx.Limits(max_connections=len(agents) + 4, max_keepalive_connections=len(agents) + 4)
    timeout = httpx.Timeout(args.request_timeout, connect=30)
    records: list[Record] = []

    async with httpx.AsyncClient(limits=limits, timeout=timeout) as client:
        async def drive(agent: Agent, delay: float) -> None:
            await asyncio.sleep(delay)
            for k in range(turns):
                turn = first_turn + k
                if k and args.think:
                    await asyncio.sleep(args.think)
                agent.messages.append({"role": "user", "content": user_message(agent.index, turn)})
                rec, reply = await one_request(client, base_url, model, agent, args)
                rec.phase, rec.turn = phase_of(turn), turn
                records.append(rec)
                if rec.error:
                    agent.messages.pop()
                    print(f"  ! agent {agent.index} turn {turn}: {rec.error}", file=sys.stderr)
                    return
                agent.messages.append({"role": "assistant", "content": reply})

        t0 = time.perf_counter()
        await asyncio.gather(*(drive(a, i * args.stagger) for i, a in enumerate(agents)))
        wall = time.perf_counter() - t0
    return records, wall


async def warm_up(base_url: str, model: str, args) -> None:
    """One tiny anonymous request so lazy initialisation is not billed to the first agent."""
    async with httpx.AsyncClient(timeout=args.request_timeout) as client:
        try:
            await client.post(base_url + "/completions", json={"model": model, "prompt": "Warm up.", "max_tokens": 2,
                                                                "temperature": 0},
                              headers={"Authorization": f"Bearer {args.api_key}"})
        except httpx.HTTPError as e:
            print(f"  warm-up failed: {e}", file=sys.stderr)


async def probe_shared_prefix(base_url: str, model: str, doc: str, args) -> int | None:
    """How many tokens the agents share, as the server sees it: an anonymous request with the
    shared document and a persona no agent has reports the longest cached prefix it reused.
    Sent after the cache state was read, so it does not count in the hot bytes."""
    async with httpx.AsyncClient(timeout=args.request_timeout) as client:
        try:
            r = await client.post(base_url + "/chat/completions", headers={"Authorization": f"Bearer {args.api_key}"},
                                  json={"model": model, "max_tokens": 1, "temperature": 0, "messages": [
                                      {"role": "system", "content": doc + "\n\nZ" + persona(10**6)[1:]},
                                      {"role": "user", "content": "?"}]})
            return ((r.json().get("usage") or {}).get("prompt_tokens_details") or {}).get("cached_tokens")
        except (httpx.HTTPError, ValueError, AttributeError):
            return None


"""What the soak's parts share (scripts/bench_soak.py, scripts/soak_redis.py): its server,
its conversations and requests, `cache verify`, and the figures it reports."""

from __future__ import annotations

import json
import subprocess
import sys
from dataclasses import dataclass, field
from pathlib import Path

import httpx

from bench.server import REPO, ServerProcess, clean_env, ours_command

DOC = (
    "You keep the logbook of a harbour. Every entry names the ship, the berth, the cargo, the weather, "
    "and the hour it arrived or left. Entries are short and exact. "
)


class Server:
    """`agent-memory serve` at --kv-bits 16 on a cache folder (a ServerProcess, restartable),
    and what the soak asks it."""

    def __init__(self, model: Path, cache_dir: Path, logs: Path, name: str, *args: str) -> None:
        self.cache_dir = cache_dir
        command = lambda port: ours_command(port, [model], cache_dir, "--kv-bits", "16", *args)  # noqa: E731
        self.process = ServerProcess(name, command, clean_env(), logs)

    @property
    def url(self) -> str:
        return self.process.url

    def start(self, timeout: float = 120) -> Server:
        self.cache_dir.mkdir(parents=True, exist_ok=True)
        self.process.start(timeout)
        return self

    def log(self) -> str:
        return self.process.log()

    def stop(self) -> None:
        self.process.stop()

    def kill(self) -> None:
        self.process.stop("crash")

    def health(self) -> dict:
        return httpx.get(self.url + "/health", timeout=10).json()

    def agents(self) -> list[str]:
        """The named agents (an unnamed conversation's id is a hash of its content)."""
        listed = httpx.get(self.url + "/v1/agents", timeout=30).json()["data"]
        return [a["id"] for a in listed if a["kind"] == "agent"]

    def sequences(self) -> float:
        """Sequences the engine still holds (the metrics gauge, every state together)."""
        text = httpx.get(self.url + "/metrics", timeout=10).text
        return sum(float(line.rsplit(" ", 1)[1]) for line in text.splitlines() if line.startswith("agent_memory_sequences{"))


def cache_cli(cache_dir: Path, *args: str) -> subprocess.CompletedProcess:
    cmd = [sys.executable, "-m", "agent_memory", "cache", *args, "--cache-dir", str(cache_dir)]
    return subprocess.run(cmd, capture_output=True, text=True, env=clean_env(), cwd=REPO, timeout=120)


def verify(cache_dir: Path) -> list[dict]:
    """`cache verify`'s problems but strays (files the server did not write)."""
    done = cache_cli(cache_dir, "verify", "--format", "json")
    try:
        problems = json.loads(done.stdout)["problems"]
    except (ValueError, KeyError):
        return [{"kind": "verify", "reason": (done.stderr or done.stdout)[-300:]}]
    return [p for p in problems if p["kind"] != "stray"]


def conversation(agent: int, turn: str = "What came in last night?") -> list[dict]:
    return [
        {"role": "system", "content": f"Logbook {agent}. " + DOC * (2 + agent % 3)},
        {"role": "user", "content": f"[{agent}] {turn}"},
    ]


def chat(url: str, messages: list[dict], agent: str | None, max_tokens: int, timeout: float = 60, **extra) -> dict:
    body = {"model": "m", "messages": messages, "max_tokens": max_tokens, "temperature": 0, **extra}
    if agent is not None:
        body["prompt_cache_key"] = agent
    response = httpx.post(url + "/v1/chat/completions", json=body, timeout=timeout)
    response.raise_for_status()
    return response.json()


def text_of(response: dict) -> str:
    return response["choices"][0]["message"]["content"] or ""


def percentile(values: list[float], q: float) -> float | None:
    if not values:
        return None
    values = sorted(values)
    return values[min(len(values) - 1, max(0, round(q * (len(values) - 1))))]


@dataclass
class Figures:
    rows: list[tuple[str, str, str, str]] = field(default_factory=list)  # part, figure, value, must be
    data: dict = field(default_factory=dict)

    def add(self, part: str, figure: str, value, must: str = "") -> None:
        self.rows.append((part, figure, str(value), must))
        self.data.setdefault(part, {})[figure] = value

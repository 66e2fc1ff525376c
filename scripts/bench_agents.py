#!/usr/bin/env python3
"""Multi-agent benchmark for OpenAI-compatible servers: agent-memory against mlx-lm's server.

The workload: N agents x M turns. Every agent's system message is one shared ~1,000-token
document (tool descriptions and an operating policy, generated here deterministically) plus a
persona line of its own; optionally a pre-existing conversation (`--history-tokens`). Agent i
starts after i x `--stagger` seconds and then runs its turns back to back, each turn appending
the user's message and the assistant's reply. Greedy decoding, streaming with usage, so every
request yields its time to first token (TTFT) and `usage.prompt_tokens_details.cached_tokens`.
The agent id goes out as `prompt_cache_key` and as `X-Agent-Id`.

When the script starts the server itself it then restarts it on the same cache folder and
lets every agent take one more turn: agent-memory reloads the agents from disk, mlx-lm's
server (prompt caches in memory only) starts from nothing.

    # one server, started here on the demo model
    .venv/bin/python scripts/bench_agents.py --serve ours
    # both servers, alternating, same workload, ratios ours/peer
    .venv/bin/python scripts/bench_agents.py --compare --repeats 2 --json bench.json
    # returning agents with a 2,000-token history: cold vs warm vs after restart
    .venv/bin/python scripts/bench_agents.py --serve ours --history-tokens 2000
    # any running server (no restart phase)
    .venv/bin/python scripts/bench_agents.py --base-url http://127.0.0.1:8000/v1
    # grow agents and history; plots into docs/img
    .venv/bin/python scripts/bench_agents.py --scale --compare --scale-agents 8,32 --scale-history 1000,4000

Only the standard library, httpx and (for --scale plots) matplotlib.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import math
import os
import random
import re
import shlex
import shutil
import signal
import socket
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path

import httpx

REPO = Path(__file__).resolve().parent.parent
DEMO_MODEL = Path(os.environ.get("XDG_CACHE_HOME", Path.home() / ".cache")) / "agent-memory/models/smollm2-135m-instruct"
CHARS_PER_TOKEN = 4.4  # the generated English below, measured with SmolLM2's tokenizer


# --------------------------------------------------------------------------------------
# Deterministic text
# --------------------------------------------------------------------------------------

_TOOLS = [
    ("search_documents", "Search the internal document store", ["query: string", "limit: integer", "after: date"]),
    ("read_file", "Read a file from the shared workspace", ["path: string", "offset: integer", "length: integer"]),
    ("write_file", "Write or replace a file in the shared workspace", ["path: string", "content: string"]),
    ("run_query", "Run a read-only SQL query against the analytics warehouse", ["sql: string", "timeout: seconds"]),
    ("send_message", "Send a message to another agent or to a human reviewer", ["to: string", "body: string"]),
    ("create_ticket", "Open a ticket in the issue tracker", ["title: string", "priority: low|normal|high", "body: string"]),
    ("schedule_task", "Schedule a task to run later", ["when: datetime", "task: string", "repeat: string"]),
    ("fetch_metrics", "Fetch time series from the monitoring system", ["name: string", "start: datetime", "end: datetime"]),
    ("summarize", "Summarize a long text into a few sentences", ["text: string", "max_words: integer"]),
    ("translate", "Translate a text between two languages", ["text: string", "source: string", "target: string"]),
    ("calendar_lookup", "List the events of a person's calendar", ["person: string", "day: date"]),
    ("compute", "Evaluate an arithmetic expression exactly", ["expression: string"]),
]

_SUBJECTS = ["The agent", "Every reply", "A careful answer", "The reviewer", "Each tool call", "The final report",
             "A short plan", "The user", "Any estimate", "The summary", "A good explanation", "The team"]
_VERBS = ["should state", "must include", "always checks", "never hides", "briefly explains", "clearly lists",
          "carefully weighs", "first confirms", "openly admits", "quickly records", "politely asks for", "compares"]
_OBJECTS = ["the assumptions behind it", "the sources that were used", "what remains uncertain",
            "the cost of each option", "the risks of the change", "the next concrete step", "the deadline",
            "the owner of every task", "which data was missing", "how the numbers were computed",
            "the trade-offs involved", "the expected outcome"]
_TAILS = ["before acting.", "in plain words.", "without jargon.", "when asked.", "at the end.", "in one sentence.",
          "for the record.", "with care.", "if it matters.", "as a list.", "every time.", "to the reviewer."]

_ROLES = ["research analyst", "release manager", "data engineer", "support specialist", "security reviewer",
          "technical writer", "product planner", "site reliability engineer", "finance assistant", "recruiter",
          "legal assistant", "QA engineer", "sales engineer", "teacher", "travel planner", "project coordinator"]
_TOPICS = ["database migrations", "quarterly reports", "incident reviews", "customer onboarding", "API design",
           "cost forecasting", "test automation", "vendor contracts", "hiring plans", "documentation quality",
           "capacity planning", "privacy rules", "product launches", "sprint planning", "cloud budgets"]
_QUESTIONS = [
    "What should we check first about {topic}?",
    "Give me three risks related to {topic}.",
    "Summarize the current plan for {topic} in two sentences.",
    "Which tool would you call next for {topic}, and why?",
    "Draft a short status update about {topic}.",
    "What is one question we still need to answer about {topic}?",
    "List the owners we need to contact about {topic}.",
    "How would you measure progress on {topic}?",
]


def _sentence(rng: random.Random) -> str:
    return f"{rng.choice(_SUBJECTS)} {rng.choice(_VERBS)} {rng.choice(_OBJECTS)} {rng.choice(_TAILS)}"


def shared_document(tokens: int) -> str:
    """A fixed tool-description and policy document of about `tokens` tokens."""
    rng = random.Random(1234)
    parts = ["You work inside a team of software agents. This document describes the tools you may call "
             "and the policy every agent follows.", "", "## Tools"]
    for name, what, params in _TOOLS:
        parts.append(f"- {name}({', '.join(params)}): {what}. Returns JSON; errors come back as an 'error' field.")
    parts += ["", "## Policy"]
    budget = tokens * CHARS_PER_TOKEN
    n = 1
    while len("\n".join(parts)) < budget:
        parts.append(f"{n}. {_sentence(rng)} {_sentence(rng)}")
        n += 1
    return "\n".join(parts)


def persona(agent: int) -> str:
    return (f"You are agent {agent}, a {_ROLES[agent % len(_ROLES)]} who works on "
            f"{_TOPICS[agent % len(_TOPICS)]}. Answer briefly.")


def user_message(agent: int, turn: int) -> str:
    topic = _TOPICS[(agent * 7 + turn) % len(_TOPICS)]
    return f"[{agent}.{turn}] " + _QUESTIONS[(agent + turn) % len(_QUESTIONS)].format(topic=topic)


def prior_history(agent: int, tokens: int) -> list[dict]:
    """An agent's own earlier conversation, about `tokens` tokens, different for each agent."""
    if tokens <= 0:
        return []
    rng = random.Random(f"history-{agent}")
    messages, chars, k = [], 0, 0
    budget = tokens * CHARS_PER_TOKEN
    while chars < budget:
        user = f"(earlier, {agent}.{k}) " + _QUESTIONS[rng.randrange(len(_QUESTIONS))].format(topic=rng.choice(_TOPICS))
        reply = " ".join(_sentence(rng) for _ in range(8))
        messages += [{"role": "user", "content": user}, {"role": "assistant", "content": reply}]
        chars += len(user) + len(reply) + 8 * CHARS_PER_TOKEN  # template overhead per pair
        k += 1
    return messages


# --------------------------------------------------------------------------------------
# Servers
# --------------------------------------------------------------------------------------

def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def find_openblas() -> str | None:
    """The libopenblas.so.0 path, as the dynamic loader knows it (agent_memory/blas.py loads it by name)."""
    try:
        out = subprocess.run(["ldconfig", "-p"], capture_output=True, text=True, timeout=10).stdout
    except (OSError, subprocess.SubprocessError):
        out = ""
    for line in out.splitlines():
        if "libopenblas.so.0" in line and "=>" in line:
            return line.split("=>", 1)[1].strip()
    for path in ("/lib/x86_64-linux-gnu/libopenblas.so.0", "/usr/lib/x86_64-linux-gnu/libopenblas.so.0",
                 "/lib/aarch64-linux-gnu/libopenblas.so.0", "/usr/lib/aarch64-linux-gnu/libopenblas.so.0"):
        if os.path.exists(path):
            return path
    return None


def proc_status(pid: int) -> dict[str, int]:
    """VmRSS / VmHWM of a process, in bytes (Linux); {} elsewhere or once it is gone."""
    out = {}
    try:
        with open(f"/proc/{pid}/status") as f:
            for line in f:
                if line.startswith(("VmRSS:", "VmHWM:")):
                    key, value = line.split(":", 1)
                    out[key] = int(value.split()[0]) * 1024
    except OSError:
        pass
    return out


def has_openblas(pid: int) -> bool | None:
    try:
        with open(f"/proc/{pid}/maps") as f:
            return "libopenblas" in f.read()
    except OSError:
        return None


class RSSSampler:
    """Polls a process's VmRSS in a thread; peak = max(sampled VmRSS, VmHWM read at stop)."""

    def __init__(self, pid: int, interval: float = 0.1) -> None:
        self.pid, self.interval = pid, interval
        self.peak = 0
        self.last = 0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._thread.start()

    def _run(self) -> None:
        while not self._stop.is_set():
            self._sample()
            self._stop.wait(self.interval)

    def _sample(self) -> None:
        st = proc_status(self.pid)
        if st:
            self.last = st.get("VmRSS", 0)
            self.peak = max(self.peak, self.last, st.get("VmHWM", 0))

    def stop(self) -> int:
        self._sample()
        self._stop.set()
        self._thread.join()
        return self.peak


class ManagedServer:
    """One of the two servers, run as a child process on a free loopback port."""

    def __init__(self, kind: str, model: str, cache_dir: Path, log_dir: Path, args: argparse.Namespace) -> None:
        self.kind, self.model, self.cache_dir, self.log_dir = kind, model, cache_dir, log_dir
        self.opts = args
        self.proc: subprocess.Popen | None = None
        self.port = 0
        self.starts = 0
        self.log_path: Path | None = None
        self._log = None
        self.load_s: float | None = None

    @property
    def root(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    @property
    def base_url(self) -> str:
        return self.root + "/v1"

    @property
    def pid(self) -> int | None:
        return self.proc.pid if self.proc else None

    def command(self) -> list[str]:
        if self.kind == "ours":
            cmd = shlex.split(self.opts.ours_cmd) + ["--model", self.model, "--port", str(self.port),
                                                     "--cache-dir", str(self.cache_dir)]
            return cmd + shlex.split(self.opts.ours_args)
        cmd = shlex.split(self.opts.peer_cmd) + ["--model", self.model, "--port", str(self.port), "--temp", "0",
                                                 "--log-level", "WARNING"]
        return cmd + shlex.split(self.opts.peer_args)

    def env(self) -> dict[str, str]:
        env = {**os.environ, "HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1", "PYTHONUNBUFFERED": "1",
               "TOKENIZERS_PARALLELISM": "false"}
        env.pop("AGENT_MEMORY_API_KEY", None)
        if self.kind == "peer":
            lib = find_openblas()
            if lib:
                env["LD_PRELOAD"] = ":".join(filter(None, [lib, env.get("LD_PRELOAD")]))
            else:
                print("warning: libopenblas.so.0 not found; mlx_lm.server will use MLX's slow reference BLAS",
                      file=sys.stderr)
        return env

    def start(self, timeout: float = 300) -> None:
        self.port = free_port()
        self.starts += 1
        self.cache_dir.mkdir(parents=True, exist_ok=True)
        self.log_path = self.log_dir / f"{self.kind}-{self.cache_dir.name}-start{self.starts}.log"
        self._log = open(self.log_path, "ab")
        t0 = time.monotonic()
        self.proc = subprocess.Popen(self.command(), stdout=self._log, stderr=subprocess.STDOUT, env=self.env(),
                                     cwd=REPO, start_new_session=True)
        wait_ready(self.root, timeout, self.proc, self.log_path)
        self.load_s = time.monotonic() - t0

    def stop(self, timeout: float = 60) -> int | None:
        if self.proc is None:
            return None
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(timeout)
            except subprocess.TimeoutExpired:
                print(f"warning: {self.kind} did not stop within {timeout}s of SIGTERM; killing it", file=sys.stderr)
                self.proc.kill()
                self.proc.wait()
        code = self.proc.returncode
        self.proc = None
        if self._log:
            self._log.close()
            self._log = None
        return code


def wait_ready(root: str, timeout: float, proc: subprocess.Popen | None = None, log: Path | None = None) -> None:
    """Poll /health (503 while loading) and, where a server has none, /v1/models."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if proc is not None and proc.poll() is not None:
            tail = log.read_text(errors="replace")[-3000:] if log and log.exists() else ""
            raise RuntimeError(f"server exited with {proc.returncode} before it was ready:\n{tail}")
        try:
            r = httpx.get(root + "/health", timeout=5)
            if r.status_code == 200:
                return
            if r.status_code == 404 and httpx.get(root + "/v1/models", timeout=30).status_code == 200:
                return
        except httpx.HTTPError:
            pass
        time.sleep(0.25)
    raise RuntimeError(f"{root} not ready after {timeout:.0f}s (log: {log})")


# --------------------------------------------------------------------------------------
# The workload
# --------------------------------------------------------------------------------------

@dataclass
class Record:
    agent: int
    phase: str  # "first" | "later" | "restart"
    turn: int
    start: float = 0.0
    ttft: float | None = None
    latency: float | None = None
    prompt_tokens: int | None = None
    cached_tokens: int | None = None
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
    """Every agent starts after index x stagger seconds and runs `turns` turns back to back."""
    limits = httpx.Limits(max_connections=len(agents) + 4, max_keepalive_connections=len(agents) + 4)
    timeout = httpx.Timeout(args.request_timeout, connect=30)
    records: list[Record] = []

    async with httpx.AsyncClient(limits=limits, timeout=timeout) as client:
        async def drive(agent: Agent, delay: float) -> None:
            await asyncio.sleep(delay)
            for k in range(turns):
                turn = first_turn + k
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


def fetch_cache_state(root: str) -> dict:
    """Hot/disk bytes as agent-memory reports them (GET /v1/agents and /metrics); {} for other servers."""
    out: dict = {}
    try:
        r = httpx.get(root + "/v1/agents", timeout=30)
        if r.status_code == 200:
            body = r.json()
            for key in ("hot_bytes", "disk_bytes", "hot_budget_bytes", "hot_blocks", "warm_blocks", "cold_blocks"):
                if key in body:
                    out[key] = body[key]
            out["agents"] = len(body.get("data", []))
            out["agent_tokens"] = {a["id"]: a.get("tokens") for a in body.get("data", [])}
    except (httpx.HTTPError, ValueError):
        pass
    try:
        r = httpx.get(root + "/metrics", timeout=30)
        if r.status_code == 200:
            for m in re.finditer(r'^agent_memory_cache_bytes\{tier="(\w+)"\}\s+(\S+)', r.text, re.M):
                out[f"metrics_{m.group(1)}_bytes"] = int(float(m.group(2)))
    except httpx.HTTPError:
        pass
    return out


def kv_precision_from_log(log: Path | None) -> str | None:
    try:
        m = re.findall(r"KV cached as (\w+)", log.read_text(errors="replace"))
    except (OSError, AttributeError):
        return None
    return m[-1] if m else None


def model_geometry(model_dir: str | None) -> dict:
    """KV bytes per token = layers x kv_heads x head_dim x 2 (K and V) x bytes per element."""
    if not model_dir:
        return {}
    try:
        cfg = json.loads((Path(model_dir) / "config.json").read_text())
    except (OSError, ValueError):
        return {}
    cfg = cfg.get("text_config", cfg)
    layers = cfg["num_hidden_layers"]
    heads = cfg["num_attention_heads"]
    kv_heads = cfg.get("num_key_value_heads", heads)
    head_dim = cfg.get("head_dim") or cfg["hidden_size"] // heads
    dtype = str(cfg.get("torch_dtype", cfg.get("dtype", "float16")))
    elem = 4 if "32" in dtype else 2
    return {"layers": layers, "kv_heads": kv_heads, "head_dim": head_dim, "dtype": dtype, "bytes_per_element": elem,
            "kv_bytes_per_token": layers * kv_heads * head_dim * 2 * elem,
            "context": cfg.get("max_position_embeddings")}


# --------------------------------------------------------------------------------------
# Statistics
# --------------------------------------------------------------------------------------

def pct(values: list[float], q: float) -> float | None:
    if not values:
        return None
    v = sorted(values)
    k = (len(v) - 1) * q
    lo, hi = math.floor(k), math.ceil(k)
    return v[lo] + (v[hi] - v[lo]) * (k - lo)


def ttft_stats(records: list[Record]) -> dict:
    vals = [r.ttft for r in records if r.ttft is not None and not r.error]
    return {"median": pct(vals, 0.5), "p90": pct(vals, 0.9), "n": len(vals)}


def hit_ratio(records: list[Record]) -> float | None:
    ok = [r for r in records if not r.error and r.prompt_tokens]
    if not ok or any(r.cached_tokens is None for r in ok):
        return None  # the server does not report cached tokens
    return sum(r.cached_tokens for r in ok) / sum(r.prompt_tokens for r in ok)


def ratio(a, b) -> float | None:
    return a / b if a is not None and b not in (None, 0) else None


def summarize(records: list[Record], wall: float, restart_records: list[Record], restart_wall: float | None) -> dict:
    first = [r for r in records if r.phase == "first"]
    later = [r for r in records if r.phase == "later"]
    ok = [r for r in records if not r.error]
    completion = sum(r.completion_tokens or 0 for r in ok)
    agent0 = [r for r in first if r.agent == 0 and r.ttft is not None]
    out = {
        "wall_s": wall,
        "restart_wall_s": restart_wall,
        # The whole workload: the turns, then one more turn each after the restart.
        "workload_wall_s": wall + (restart_wall or 0.0),
        "requests": len(records) + len(restart_records),
        "errors": sum(1 for r in records + restart_records if r.error),
        "ttft": {"first": ttft_stats(first), "later": ttft_stats(later), "restart": ttft_stats(restart_records),
                 "cold_agent0": agent0[0].ttft if agent0 else None},
        "output_tok_s": completion / wall if wall else None,
        "completion_tokens": completion,
        "prompt_tokens": sum(r.prompt_tokens or 0 for r in ok),
        "cached_tokens": sum(r.cached_tokens or 0 for r in ok),
        "hit_ratio": {"all": hit_ratio(records), "first": hit_ratio(first), "later": hit_ratio(later),
                      "restart": hit_ratio(restart_records)},
    }
    t = out["ttft"]
    out["ratios"] = {
        "cold_over_later": ratio(t["first"]["median"], t["later"]["median"]),
        "cold_over_restart": ratio(t["first"]["median"], t["restart"]["median"]),
        "cold_agent0_over_later": ratio(t["cold_agent0"], t["later"]["median"]),
        "cold_agent0_over_restart": ratio(t["cold_agent0"], t["restart"]["median"]),
    }
    return out


# --------------------------------------------------------------------------------------
# One run: (start server) -> agents x turns -> (restart) -> one more turn each
# --------------------------------------------------------------------------------------

def run_workload(kind: str, args, agents_n: int, turns: int, history_tokens: int, work_dir: Path,
                 tag: str) -> dict:
    geometry = model_geometry(args.model if kind != "external" else args.model_dir)
    server = None
    if kind == "external":
        base_url, root = args.base_url.rstrip("/"), args.base_url.rstrip("/").removesuffix("/v1")
        wait_ready(root, 30)
        pid = args.server_pid
    else:
        cache_dir = work_dir / f"{tag}-cache"
        if cache_dir.exists():
            shutil.rmtree(cache_dir)
        server = ManagedServer(kind, args.model, cache_dir, work_dir, args)
        server.start(args.start_timeout)
        base_url, root, pid = server.base_url, server.root, server.pid
    # mlx_lm.server loads whatever `model` names (a hub id or path) unless it is "default_model".
    model_name = args.model_name or ("default_model" if kind == "peer" else
                                     Path(args.model).name if args.model else "default")

    doc = shared_document(args.system_tokens)
    agents = [Agent(i, [{"role": "system", "content": doc + "\n\n" + persona(i)}] + prior_history(i, history_tokens))
              for i in range(agents_n)]

    result: dict = {"server": kind, "tag": tag, "agents": agents_n, "turns": turns, "history_tokens": history_tokens,
                    "system_tokens_target": args.system_tokens, "max_tokens": args.max_tokens,
                    "stagger_s": args.stagger, "geometry": geometry, "pid": pid,
                    "openblas": has_openblas(pid) if pid else None,
                    "load_s": server.load_s if server else None,
                    "log": str(server.log_path) if server else None}
    sampler = RSSSampler(pid) if pid else None
    restart_records: list[Record] = []
    restart_wall = None
    try:
        if not args.no_warmup:
            asyncio.run(warm_up(base_url, model_name, args))
        print(f"  [{tag}] {kind}: {agents_n} agents x {turns} turns, history {history_tokens} tokens ...", flush=True)
        records, wall = asyncio.run(run_phase(base_url, model_name, agents, turns,
                                              lambda t: "first" if t == 0 else "later", 0, args))
        result["cache_after_turns"] = fetch_cache_state(root)
        result["probe_shared_prefix_tokens"] = asyncio.run(probe_shared_prefix(base_url, model_name, doc, args))
        if sampler:
            result["peak_rss_bytes_turns"] = sampler.stop()
            result["rss_after_turns_bytes"] = sampler.last
            sampler = None
        if server and not args.no_restart:
            server.stop()
            server.start(args.start_timeout)
            base_url, root = server.base_url, server.root
            result["restart_load_s"] = server.load_s
            sampler = RSSSampler(server.pid)
            if not args.no_warmup:
                asyncio.run(warm_up(base_url, model_name, args))
            restart_records, restart_wall = asyncio.run(run_phase(base_url, model_name, agents, 1,
                                                                  lambda t: "restart", turns, args))
            result["cache_after_restart"] = fetch_cache_state(root)
            result["peak_rss_bytes_restart"] = sampler.stop()
            sampler = None
        elif kind == "external" or args.no_restart:
            result["restart_skipped"] = "external server" if kind == "external" else "--no-restart"
    finally:
        if sampler:
            sampler.stop()
        if server:
            server.stop()

    result.update(summarize(records, wall, restart_records, restart_wall))
    result["peak_rss_bytes"] = max(result.get("peak_rss_bytes_turns") or 0, result.get("peak_rss_bytes_restart") or 0) or None

    # Hot KV against the ideal: one copy of the shared prefix plus each agent's own tokens.
    ok_first = [r for r in records if r.phase == "first" and not r.error and r.agent > 0 and r.cached_tokens]
    shared = max([r.cached_tokens for r in ok_first] + [result.get("probe_shared_prefix_tokens") or 0]) or None
    last_of: dict[int, Record] = {}
    for r in records:
        if not r.error and r.prompt_tokens is not None:
            if r.agent not in last_of or r.turn > last_of[r.agent].turn:
                last_of[r.agent] = r
    totals = {a: r.prompt_tokens + (r.completion_tokens or 0) for a, r in last_of.items()}
    first_prompt = [r.prompt_tokens for r in records if r.phase == "first" and r.prompt_tokens]
    result["tokens_first_prompt_median"] = pct(first_prompt, 0.5)
    result["shared_prefix_tokens"] = shared
    kvb = geometry.get("kv_bytes_per_token")
    # agent-memory may keep KV quantized at rest (its log says "KV cached as q4g64"); the ideal
    # is then taken at that precision: bits per element plus a scale and a bias per group.
    precision = kv_precision_from_log(server.log_path) if server and kind == "ours" else None
    result["kv_precision"] = precision or geometry.get("dtype")
    if kvb and precision and precision.startswith("q"):
        bits, group = (int(x) for x in precision[1:].split("g"))
        elem = geometry["bytes_per_element"]
        kvb = kvb * (bits / 8 + 2 * elem / group) / elem
    result["kv_bytes_per_token_cached"] = kvb
    if kvb and totals:
        s = shared or 0
        unique = s + sum(t - s for t in totals.values())
        result["ideal_hot_bytes"] = unique * kvb
        result["unshared_hot_bytes"] = sum(totals.values()) * kvb
    cache = result.get("cache_after_turns") or {}
    hot = cache.get("hot_bytes", cache.get("metrics_hot_bytes"))
    result["hot_bytes"] = hot
    result["hot_over_ideal"] = ratio(hot, result.get("ideal_hot_bytes"))
    result["records"] = [asdict(r) for r in records + restart_records]
    return result


# --------------------------------------------------------------------------------------
# Reporting
# --------------------------------------------------------------------------------------

def fmt(v, unit: str = "", digits: int = 2) -> str:
    if v is None:
        return "n/a"
    if isinstance(v, float):
        return f"{v:.{digits}f}{unit}"
    return f"{v}{unit}"


def mb(v) -> str:
    return "n/a" if v is None else f"{v / 2**20:.0f}"


def median_of(runs: list[dict], getter) -> float | None:
    vals = []
    for r in runs:
        try:
            v = getter(r)
        except (KeyError, TypeError):
            v = None
        if v is not None:
            vals.append(v)
    return statistics.median(vals) if vals else None


METRICS = {
    "wall_s": lambda r: r["wall_s"],
    "workload_wall_s": lambda r: r["workload_wall_s"],
    "ttft_first_median": lambda r: r["ttft"]["first"]["median"],
    "ttft_first_p90": lambda r: r["ttft"]["first"]["p90"],
    "ttft_later_median": lambda r: r["ttft"]["later"]["median"],
    "ttft_later_p90": lambda r: r["ttft"]["later"]["p90"],
    "ttft_restart_median": lambda r: r["ttft"]["restart"]["median"],
    "ttft_restart_p90": lambda r: r["ttft"]["restart"]["p90"],
    "ttft_cold_agent0": lambda r: r["ttft"]["cold_agent0"],
    "output_tok_s": lambda r: r["output_tok_s"],
    "hit_ratio_all": lambda r: r["hit_ratio"]["all"],
    "hit_ratio_later": lambda r: r["hit_ratio"]["later"],
    "hit_ratio_restart": lambda r: r["hit_ratio"]["restart"],
    "peak_rss_bytes": lambda r: r["peak_rss_bytes"],
    "hot_bytes": lambda r: r["hot_bytes"],
    "ideal_hot_bytes": lambda r: r.get("ideal_hot_bytes"),
    "errors": lambda r: r["errors"],
    "cold_over_later": lambda r: r["ratios"]["cold_over_later"],
    "cold_over_restart": lambda r: r["ratios"]["cold_over_restart"],
    "first_prompt_tokens": lambda r: r["tokens_first_prompt_median"],
}


def aggregate(runs: list[dict]) -> dict:
    return {name: median_of(runs, get) for name, get in METRICS.items()} | {"runs": len(runs)}


def table(summary: dict[str, dict]) -> str:
    head = ("| server | runs | prompt tok (1st) | wall s | TTFT first med / p90 | TTFT later med / p90 | "
            "TTFT restart med / p90 | out tok/s | hit later | hit restart | peak RSS MB | hot MB / ideal MB | errors |")
    lines = [head, "|" + "---|" * (head.count("|") - 1)]
    for name, s in summary.items():
        lines.append(
            f"| {name} | {s['runs']} | {fmt(s['first_prompt_tokens'], digits=0)} | {fmt(s['wall_s'], digits=1)} | "
            f"{fmt(s['ttft_first_median'])} / {fmt(s['ttft_first_p90'])} | "
            f"{fmt(s['ttft_later_median'])} / {fmt(s['ttft_later_p90'])} | "
            f"{fmt(s['ttft_restart_median'])} / {fmt(s['ttft_restart_p90'])} | {fmt(s['output_tok_s'], digits=1)} | "
            f"{fmt(s['hit_ratio_later'])} | {fmt(s['hit_ratio_restart'])} | {mb(s['peak_rss_bytes'])} | "
            f"{mb(s['hot_bytes'])} / {mb(s['ideal_hot_bytes'])} | {fmt(s['errors'], digits=0)} |")
    return "\n".join(lines)


def cold_table(summary: dict[str, dict]) -> str:
    lines = ["| server | TTFT cold (1st turn) | TTFT cold agent 0 | TTFT warm (next turn) | TTFT after restart | "
             "cold / warm | cold / after restart |", "|---|---|---|---|---|---|---|"]
    for name, s in summary.items():
        lines.append(f"| {name} | {fmt(s['ttft_first_median'])} | {fmt(s['ttft_cold_agent0'])} | "
                     f"{fmt(s['ttft_later_median'])} | {fmt(s['ttft_restart_median'])} | "
                     f"{fmt(s['cold_over_later'], 'x', 1)} | {fmt(s['cold_over_restart'], 'x', 1)} |")
    return "\n".join(lines)


def compare_table(summary: dict[str, dict]) -> tuple[str, dict]:
    ours, peer = summary.get("ours"), summary.get("peer")
    if not ours or not peer:
        return "", {}
    keys = [("workload_wall_s", "workload wall time (turns + turn after restart)"), ("wall_s", "wall time, turns only"), ("ttft_first_median", "first-turn TTFT median"),
            ("ttft_later_median", "later-turn TTFT median"), ("ttft_restart_median", "after-restart TTFT median"),
            ("output_tok_s", "output tok/s"), ("hit_ratio_all", "hit ratio (all main turns)"),
            ("hit_ratio_later", "hit ratio (later turns)"), ("hit_ratio_restart", "hit ratio (after restart)"),
            ("peak_rss_bytes", "peak server RSS")]
    ratios = {k: ratio(ours[k], peer[k]) for k, _ in keys}
    lines = ["| metric | ours | peer | ours / peer |", "|---|---|---|---|"]
    for k, label in keys:
        if k == "peak_rss_bytes":
            a, b = mb(ours[k]) + " MB", mb(peer[k]) + " MB"
        else:
            a, b = fmt(ours[k], digits=3), fmt(peer[k], digits=3)
        lines.append(f"| {label} | {a} | {b} | {fmt(ratios[k], 'x', 2)} |")
    return "\n".join(lines), ratios


# --------------------------------------------------------------------------------------
# --scale
# --------------------------------------------------------------------------------------

def plot_scale(points: list[dict], plot_dir: Path) -> list[str]:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    plot_dir.mkdir(parents=True, exist_ok=True)
    written = []
    for axis, xkey, xlabel in (("agents", "agents", "agents"), ("history", "history_tokens", "history tokens per agent")):
        pts = [p for p in points if p["axis"] == axis]
        if not pts:
            continue
        fig, (ax1, ax2) = plt.subplots(1, 2, figsize=(11, 4.2))
        for server, color in (("ours", "tab:blue"), ("peer", "tab:orange")):
            sp = sorted((p for p in pts if p["server"] == server), key=lambda p: p[xkey])
            if not sp:
                continue
            xs = [p[xkey] for p in sp]
            for metric, style, label in (("ttft_later_median", "-o", "later turns"),
                                         ("ttft_restart_median", "--s", "after restart"),
                                         ("ttft_first_median", ":^", "first turn")):
                ys = [p[metric] for p in sp]
                if any(y is not None for y in ys):
                    ax1.plot(xs, [math.nan if y is None else y for y in ys], style, color=color,
                             label=f"{server}: {label}")
            ax2.plot(xs, [(p["peak_rss_bytes"] or math.nan) / 2**20 for p in sp], "-o", color=color,
                     label=f"{server}: peak RSS")
            if server == "ours":
                ax2.plot(xs, [(p["hot_bytes"] or math.nan) / 2**20 for p in sp], "--s", color=color,
                         label="ours: hot KV")
                ax2.plot(xs, [(p["ideal_hot_bytes"] or math.nan) / 2**20 for p in sp], ":", color="gray",
                         label="ideal KV (shared prefix once)")
        ax1.set(xlabel=xlabel, ylabel="TTFT median (s)", title=f"Time to first token vs {xlabel}")
        ax1.set_yscale("log")
        ax2.set(xlabel=xlabel, ylabel="MiB", title=f"Server memory vs {xlabel}")
        for ax in (ax1, ax2):
            if axis == "agents":
                ax.set_xscale("log", base=2)
            ax.grid(alpha=0.3)
            ax.legend(fontsize=7)
        fig.tight_layout()
        path = plot_dir / f"bench_scale_{axis}.png"
        fig.savefig(path, dpi=110)
        plt.close(fig)
        written.append(str(path))
    return written


# --------------------------------------------------------------------------------------
# main
# --------------------------------------------------------------------------------------

def int_list(s: str) -> list[int]:
    return [int(float(x)) for x in s.split(",") if x.strip()]


def parse_args(argv=None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    g = p.add_argument_group("server")
    g.add_argument("--serve", choices=["ours", "peer", "both"], default=None,
                   help="start the server(s) here (default: ours, unless --base-url is given)")
    g.add_argument("--compare", action="store_true", help="same as --serve both")
    g.add_argument("--base-url", help="benchmark a running server instead (no restart phase)")
    g.add_argument("--server-pid", type=int, help="with --base-url: its PID, to sample memory")
    g.add_argument("--model", default=None, help=f"model folder for the started servers (default {DEMO_MODEL})")
    g.add_argument("--model-dir", default=None, help="with --base-url: model folder to read config.json from")
    g.add_argument("--model-name", default=None, help="'model' field sent (default: the folder's name)")
    g.add_argument("--api-key", default="unused")
    g.add_argument("--ours-cmd", default=f"{shlex.quote(sys.executable)} -m agent_memory serve")
    g.add_argument("--ours-args", default="", help="extra flags for agent-memory serve, e.g. '--hot-budget-mb 512'")
    g.add_argument("--peer-cmd", default=f"{shlex.quote(sys.executable)} -m mlx_lm server")
    g.add_argument("--peer-args", default="", help="extra flags for mlx_lm server")
    g.add_argument("--repeats", type=int, default=1, help="runs per server, alternating ours/peer")
    g.add_argument("--start-timeout", type=float, default=300)
    g.add_argument("--work-dir", type=Path, default=None, help="cache folders and logs (default: a temp dir)")
    g.add_argument("--keep", action="store_true", help="keep the work dir (always kept when a run fails)")

    w = p.add_argument_group("workload")
    w.add_argument("--agents", type=int, default=8)
    w.add_argument("--turns", type=int, default=4)
    w.add_argument("--system-tokens", type=int, default=1000, help="size of the shared system document")
    w.add_argument("--history-tokens", type=int, default=0, help="each agent's pre-existing conversation")
    w.add_argument("--max-tokens", type=int, default=64)
    w.add_argument("--stagger", type=float, default=0.5, help="agent i starts after i x this many seconds")
    w.add_argument("--no-restart", action="store_true", help="skip the restart phase")
    w.add_argument("--no-warmup", action="store_true", help="no tiny request after each server start")
    w.add_argument("--request-timeout", type=float, default=900)

    s = p.add_argument_group("scale")
    s.add_argument("--scale", action="store_true", help="grow agents, then history length; plot")
    s.add_argument("--scale-agents", type=int_list, default=[8, 32, 128])
    s.add_argument("--scale-agents-history", type=int, default=200, help="history per agent on the agents axis")
    s.add_argument("--scale-history", type=int_list, default=[1000, 4000, 8000])
    s.add_argument("--scale-history-agents", type=int, default=8, help="agents on the history axis")
    s.add_argument("--scale-turns", type=int, default=2)
    s.add_argument("--plot-dir", type=Path, default=REPO / "docs/img")

    o = p.add_argument_group("output")
    o.add_argument("--json", type=Path, help="write every number (and every request) here")
    args = p.parse_args(argv)

    if args.compare:
        args.serve = "both"
    if args.base_url and args.serve:
        p.error("--base-url and --serve/--compare exclude each other")
    if not args.base_url and not args.serve:
        args.serve = "ours"
    if args.serve:
        args.model = str(Path(args.model or DEMO_MODEL).expanduser())
        if not (Path(args.model) / "config.json").exists():
            p.error(f"no model at {args.model} (run: agent-memory models fetch demo)")
    return args


def servers_of(args) -> list[str]:
    if args.base_url:
        return ["external"]
    return ["ours", "peer"] if args.serve == "both" else [args.serve]


def clip_history(args, history: int, turns: int) -> int:
    ctx = model_geometry(args.model or args.model_dir).get("context")
    if not ctx:
        return history
    need = args.system_tokens + 64 + (turns + 1) * (args.max_tokens + 40)
    if history + need > ctx:
        clipped = max(0, ctx - need)
        print(f"note: history {history} + ~{need} workload tokens exceed the model's context ({ctx}); "
              f"using {clipped}", file=sys.stderr)
        return clipped
    return history


def _exit_on_signal(signum, frame) -> None:
    raise SystemExit(128 + signum)  # unwinds through the finally blocks that stop the servers


def main(argv=None) -> int:
    args = parse_args(argv)
    signal.signal(signal.SIGTERM, _exit_on_signal)
    signal.signal(signal.SIGINT, signal.default_int_handler)  # even when started in the background
    work_dir = args.work_dir or Path(tempfile.mkdtemp(prefix="bench-agents-"))
    work_dir.mkdir(parents=True, exist_ok=True)
    print(f"work dir: {work_dir}", flush=True)
    servers = servers_of(args)
    out: dict = {"argv": sys.argv[1:], "model": args.model or args.model_dir, "started": time.strftime("%FT%T%z"),
                 "settings": {k: (str(v) if isinstance(v, Path) else v) for k, v in vars(args).items()}}
    failed = False
    try:
        if args.scale:
            points = []
            grid = [("agents", n, args.scale_agents_history) for n in args.scale_agents]
            grid += [("history", args.scale_history_agents, h) for h in args.scale_history]
            runs = []
            for axis, n, h in grid:
                h = clip_history(args, h, args.scale_turns)
                for kind in servers:
                    tag = f"scale-{axis}-{n}a-{h}h-{kind}"
                    r = run_workload(kind, args, n, args.scale_turns, h, work_dir, tag)
                    runs.append(r)
                    agg = aggregate([r])
                    points.append({"axis": axis, "server": kind, "agents": n, "history_tokens": h, **agg})
                    print(f"    TTFT later {fmt(agg['ttft_later_median'])}s, restart "
                          f"{fmt(agg['ttft_restart_median'])}s, peak RSS {mb(agg['peak_rss_bytes'])} MB, "
                          f"errors {agg['errors']}", flush=True)
            out["scale"] = points
            out["runs"] = runs
            lines = ["| axis | server | agents | history | TTFT first | TTFT later | TTFT restart | hit later | "
                     "peak RSS MB | hot MB / ideal MB | errors |", "|---|---|---|---|---|---|---|---|---|---|---|"]
            for pt in points:
                lines.append(f"| {pt['axis']} | {pt['server']} | {pt['agents']} | {pt['history_tokens']} | "
                             f"{fmt(pt['ttft_first_median'])} | {fmt(pt['ttft_later_median'])} | "
                             f"{fmt(pt['ttft_restart_median'])} | {fmt(pt['hit_ratio_later'])} | "
                             f"{mb(pt['peak_rss_bytes'])} | {mb(pt['hot_bytes'])} / {mb(pt['ideal_hot_bytes'])} | "
                             f"{fmt(pt['errors'], digits=0)} |")
            text = "\n".join(lines)
            print("\n" + text)
            out["table"] = text
            try:
                out["plots"] = plot_scale(points, args.plot_dir)
                print("plots: " + ", ".join(out["plots"]))
            except ImportError:
                print("matplotlib is not installed: no plots", file=sys.stderr)
        else:
            history = clip_history(args, args.history_tokens, args.turns)
            runs = []
            for rep in range(args.repeats):
                for kind in servers:
                    runs.append(run_workload(kind, args, args.agents, args.turns, history, work_dir, f"{kind}-r{rep}"))
            out["runs"] = runs
            summary = {k: aggregate([r for r in runs if r["server"] == k]) for k in servers}
            out["summary"] = summary
            text = table(summary)
            if history:
                text += "\n\n" + cold_table(summary)
            cmp_text, ratios = compare_table(summary)
            if cmp_text:
                text += "\n\n" + cmp_text
                out["ratios_ours_over_peer"] = ratios
            kvb = next((r["geometry"].get("kv_bytes_per_token") for r in runs if r.get("geometry")), None)
            shared = next((r["shared_prefix_tokens"] for r in runs if r["server"] == "ours"), None)
            prec = next((r.get("kv_precision") for r in runs if r["server"] == "ours"), None)
            kvc = next((r.get("kv_bytes_per_token_cached") for r in runs if r["server"] == "ours"), None)
            text += (f"\n\n{args.agents} agents x {args.turns} turns (+1 after restart), history {history} tokens, "
                     f"shared system ~{args.system_tokens} tokens (shared prefix seen: {fmt(shared)}), "
                     f"max_tokens {args.max_tokens}, stagger {args.stagger}s; KV bytes/token {fmt(kvb)} at the model's "
                     f"dtype" + (f", {fmt(kvc, digits=0)} as ours caches it ({prec}; the ideal uses this)"
                                 if kvc and kvc != kvb else ""))
            print("\n" + text)
            out["table"] = text
        failed = any(r["errors"] for r in out.get("runs", []))
    except BaseException:
        failed = True
        raise
    finally:
        if args.json:
            args.json.parent.mkdir(parents=True, exist_ok=True)
            args.json.write_text(json.dumps(out, indent=1, default=str))
            print(f"json: {args.json}")
        if not args.keep and not failed and not args.work_dir:
            shutil.rmtree(work_dir, ignore_errors=True)
        elif failed:
            print(f"work dir kept (logs): {work_dir}", file=sys.stderr)
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())

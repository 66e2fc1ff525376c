#!/usr/bin/env python3
"""Multi-agent benchmark for OpenAI-compatible servers: agent-memory against mlx-lm's server and vllm-mlx.

The workload: N agents x M turns. Every agent's system message is one shared ~1,000-token
document (tool descriptions and an operating policy, generated here deterministically) plus a
persona line of its own; optionally a pre-existing conversation (`--history-tokens`). Agent i
starts after i x `--stagger` seconds and then runs its turns, `--think` seconds apart, each
turn appending the user's message and the assistant's reply. Greedy decoding, streaming with
usage, so every request yields its time to first token (TTFT) and
`usage.prompt_tokens_details.cached_tokens` (n/a where a server does not report it). The agent
id goes out as `prompt_cache_key` and as `X-Agent-Id`.

When the script starts the servers itself it then restarts each on the same cache folder,
twice, and lets every agent take one more turn after each restart: first a crash (SIGKILL,
`--crash-delay` seconds after the last turn, as an OOM kill or a power cut would), then a
graceful restart (SIGTERM). agent-memory reloads its agents from disk; mlx-lm's server keeps
prompt caches in memory only; vllm-mlx saves its RAM prefix cache to ~/.cache/vllm-mlx when
it is stopped gracefully (here a private HOME inside its cache folder) and reloads it at start.

The three servers, started here on the same model folder, each in its own process, with
Debian's OpenBLAS for MLX's CPU matmuls (agent-memory loads it itself; the others get it
through LD_PRELOAD), HF_HUB_OFFLINE=1:

    ours      python -m agent_memory serve (its defaults)
    mlx-lm    python -m mlx_lm server (its defaults: prompt cache in RAM)
    vllm-mlx  vllm-mlx serve --continuous-batching --enable-prefix-cache --ssd-cache-dir DIR
              (0.6.0, in its own venv .venv-peers/vllm-mlx, created on first use, or with
              `--setup-vllm-mlx`: pip install --no-deps vllm-mlx==0.6.0 plus mlx[cpu],
              mlx-lm>=0.31.3,<0.32 and its server's imports; no torch)

    # one server, started here on the demo model
    .venv/bin/python scripts/bench_agents.py --serve ours
    # all three servers, alternating, same workload, ratios ours/peer and the targets
    .venv/bin/python scripts/bench_agents.py --compare --repeats 2 --json bench.json
    # 12 agents x 3 turns, 5 s think time between an agent's turns
    .venv/bin/python scripts/bench_agents.py --compare --repeats 2 --agents 12 --turns 3 --think 5
    # the guard against a regression: this checkout against an older commit (and a variant), alternating
    .venv/bin/python scripts/bench_agents.py --baseline b088a13 --variant spec-off='--speculation off' \
        --repeats 2 --agents 12 --turns 3 --think 5 --max-tokens 32
    # where our server's time goes (queue, disk reads, prefill, writes), from its --trace-file
    .venv/bin/python scripts/bench_agents.py --serve ours --trace
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

SERVERS = ("ours", "mlx-lm", "vllm-mlx")
BASE = "base"  # --baseline: our server at an older commit


@dataclass(frozen=True)
class OursCode:
    """Our server as one of the compared ones: the checkout it runs from and its extra flags
    (this checkout and --ours-args for "ours"; a worktree of --baseline; a --variant's flags)."""

    folder: Path
    args: str
PEERS = ("mlx-lm", "vllm-mlx")
ALIASES = {"peer": "mlx-lm", "mlx_lm": "mlx-lm", "vllm": "vllm-mlx", "vllm_mlx": "vllm-mlx"}

VLLM_MLX = "vllm-mlx==0.6.0"
# Its server's own imports on Linux CPU; `--no-deps` keeps out torch, torchvision, gradio, opencv.
VLLM_MLX_DEPS = ["mlx[cpu]", "mlx-lm>=0.31.3,<0.32", "fastapi", "uvicorn", "python-multipart", "psutil",
                 "jsonschema", "requests", "tabulate", "pillow", "pytz", "transformers"]
VLLM_MLX_VENV = REPO / ".venv-peers" / "vllm-mlx"


def vllm_mlx_setup_line(venv: Path = VLLM_MLX_VENV) -> str:
    pip = f"{venv}/bin/pip install -q"
    return (f"python3.11 -m venv {venv} && {pip} --no-deps {VLLM_MLX} && "
            f"{pip} {' '.join(shlex.quote(d) for d in VLLM_MLX_DEPS)}")


def ensure_vllm_mlx(venv: Path, install: bool = True) -> Path:
    """The vllm-mlx executable in its own venv; the venv is made here on first use (the
    project's .venv is never touched)."""
    exe = venv / "bin" / "vllm-mlx"
    if exe.exists():
        return exe
    if not install:
        raise SystemExit(f"vllm-mlx is not installed at {venv}; create it with:\n  {vllm_mlx_setup_line(venv)}")
    print(f"vllm-mlx is not installed: creating its own venv at {venv} — pip install --no-deps {VLLM_MLX}, "
          f"then {', '.join(VLLM_MLX_DEPS)} (no torch; the project's .venv is not changed). "
          f"One time, a few minutes.", flush=True)
    base = getattr(sys, "_base_executable", None) or sys.executable
    pip = [str(venv / "bin" / "python"), "-m", "pip", "install", "-q", "--disable-pip-version-check"]
    try:
        subprocess.run([base, "-m", "venv", str(venv)], check=True)
        subprocess.run(pip + ["--no-deps", VLLM_MLX], check=True)
        subprocess.run(pip + VLLM_MLX_DEPS, check=True)
    except (OSError, subprocess.CalledProcessError) as e:
        shutil.rmtree(venv, ignore_errors=True)
        raise SystemExit(f"could not install vllm-mlx ({e}); by hand:\n  {vllm_mlx_setup_line(venv)}") from e
    print(f"vllm-mlx installed in {venv}", flush=True)
    return exe


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


def process_tree(pid: int) -> list[int]:
    """The process and its descendants (Linux)."""
    out, todo = [], [pid]
    while todo:
        p = todo.pop()
        out.append(p)
        try:
            for task in os.listdir(f"/proc/{p}/task"):
                with open(f"/proc/{p}/task/{task}/children") as f:
                    todo += [int(c) for c in f.read().split()]
        except OSError:
            pass
    return out


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
    """Whether Debian's OpenBLAS is mapped (numpy's own bundled OpenBLAS does not count)."""
    lib = find_openblas()
    real = os.path.realpath(lib) if lib else None
    try:
        with open(f"/proc/{pid}/maps") as f:
            maps = f.read()
    except OSError:
        return None
    return bool(real and real in maps) or "libopenblas.so.0" in maps


class RSSSampler:
    """Polls the VmRSS of a process and its children in a thread; peak = max(sampled sum,
    the process's own VmHWM read at stop)."""

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
        own = proc_status(self.pid)
        if own:
            pids = process_tree(self.pid)
            self.last = own.get("VmRSS", 0) + sum(proc_status(p).get("VmRSS", 0) for p in pids[1:])
            self.peak = max(self.peak, self.last, own.get("VmHWM", 0))

    def stop(self) -> int:
        self._sample()
        self._stop.set()
        self._thread.join()
        return self.peak


class ManagedServer:
    """One of the servers, run as a child process (its own session) on a free loopback port."""

    def __init__(self, kind: str, model: str, cache_dir: Path, log_dir: Path, args: argparse.Namespace,
                 trace: bool = False) -> None:
        self.kind, self.model, self.cache_dir, self.log_dir = kind, model, cache_dir, log_dir
        self.opts = args
        self.trace = trace
        self.proc: subprocess.Popen | None = None
        self.port = 0
        self.starts = 0
        self.log_path: Path | None = None
        self.logs: list[Path] = []
        self.traces: list[Path] = []
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

    @property
    def code(self) -> OursCode | None:
        """Which checkout of our server this is, and its extra flags (None: a peer)."""
        return self.opts.ours_like.get(self.kind)

    def command(self) -> list[str]:
        if self.code:
            serve = ["--model", self.model, "--port", str(self.port), "--cache-dir", str(self.cache_dir)]
            serve += shlex.split(self.code.args)
            if self.trace:  # the server's own trace of its engine (engine/observability/trace.py)
                path = self.log_dir / f"{self.cache_dir.name}-trace-start{self.starts}.jsonl"
                self.traces.append(path)
                serve += ["--trace-file", str(path)]
            return shlex.split(self.opts.ours_cmd) + serve
        if self.kind == "mlx-lm":
            cmd = shlex.split(self.opts.peer_cmd) + ["--model", self.model, "--port", str(self.port), "--temp", "0",
                                                     "--log-level", "WARNING"]
            return cmd + shlex.split(self.opts.peer_args)
        exe = ensure_vllm_mlx(self.opts.vllm_venv, install=not self.opts.no_install)
        # Prefix cache: on by default (memory-aware, 20 % of RAM); said anyway, for the reader.
        cmd = [str(exe), "serve", self.model, "--host", "127.0.0.1", "--port", str(self.port),
               "--served-model-name", Path(self.model).name, "--continuous-batching", "--enable-prefix-cache",
               "--ssd-cache-dir", str(self.cache_dir / "ssd")]
        return cmd + shlex.split(self.opts.vllm_args)

    def env(self) -> dict[str, str]:
        env = {**os.environ, "HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1", "PYTHONUNBUFFERED": "1",
               "TOKENIZERS_PARALLELISM": "false"}
        env.pop("AGENT_MEMORY_API_KEY", None)
        if self.code:
            # The checkout whose code runs (default this one): a clean worktree of a commit keeps
            # a measurement still while others edit this one.
            env["PYTHONPATH"] = ":".join(filter(None, [str(self.code.folder), env.get("PYTHONPATH")]))
            env["BENCH_OURS_DIR"] = str(self.code.folder)
        else:
            lib = find_openblas()
            if lib:
                env["LD_PRELOAD"] = ":".join(filter(None, [lib, env.get("LD_PRELOAD")]))
            else:
                print(f"warning: libopenblas.so.0 not found; {self.kind} will use MLX's slow reference BLAS",
                      file=sys.stderr)
        if self.kind == "vllm-mlx":
            # It saves its RAM prefix cache under ~/.cache/vllm-mlx on SIGTERM and loads it at
            # start: a HOME of its own per cache folder, so runs never see each other's.
            home = self.cache_dir / "home"
            home.mkdir(parents=True, exist_ok=True)
            env["HOME"] = str(home)
            env.pop("XDG_CACHE_HOME", None)
        return env

    def start(self, timeout: float = 300) -> None:
        self.port = free_port()
        self.starts += 1
        self.cache_dir.mkdir(parents=True, exist_ok=True)
        self.log_path = self.log_dir / f"{self.kind}-{self.cache_dir.name}-start{self.starts}.log"
        self.logs.append(self.log_path)
        self._log = open(self.log_path, "ab")
        t0 = time.monotonic()
        cwd = self.code.folder if self.code else REPO
        self.proc = subprocess.Popen(self.command(), stdout=self._log, stderr=subprocess.STDOUT, env=self.env(),
                                     cwd=cwd, start_new_session=True)
        wait_ready(self.root, timeout, self.proc, self.log_path)
        self.load_s = time.monotonic() - t0

    def stop(self, mode: str = "graceful", timeout: float = 120) -> int | None:
        """graceful: SIGTERM and wait (the server saves what it saves on the way out); crash:
        SIGKILL to its whole process group, nothing saved beyond what is already on disk."""
        if self.proc is None:
            return None
        if self.proc.poll() is None:
            if mode == "crash":
                try:
                    os.killpg(self.proc.pid, signal.SIGKILL)
                except ProcessLookupError:
                    pass
                self.proc.wait()
            else:
                self.proc.send_signal(signal.SIGTERM)
                try:
                    self.proc.wait(timeout)
                except subprocess.TimeoutExpired:
                    print(f"warning: {self.kind} did not stop within {timeout}s of SIGTERM; killing it",
                          file=sys.stderr)
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


def vllm_log_fetches(log: Path) -> list[tuple[int, int]]:
    """(prompt tokens, cached tokens) of each request, from vllm-mlx's own log: its
    `[cache_fetch]` lines (RAM prefix cache) and `[ssd_promote]` lines (its SSD tier). Its API
    reports no cached tokens."""
    try:
        text = log.read_text(errors="replace")
    except OSError:
        return []
    found: dict[str, list[int]] = {}
    for m in re.finditer(r"\[cache_fetch\] request=(\S+) (HIT|MISS) prompt_tokens=(\d+)(?: cached=(\d+))?", text):
        found[m.group(1)] = [int(m.group(3)), int(m.group(4) or 0) if m.group(2) == "HIT" else 0]
    for m in re.finditer(r"\[ssd_promote\] request=(\S+) .*?promote: (\d+)/(\d+) tokens from SSD", text):
        if m.group(1) in found:
            found[m.group(1)][1] = int(m.group(2))
    return [(p, c) for p, c in found.values()]


# --------------------------------------------------------------------------------------
# --trace: where our server's time goes, from the trace it writes (serve --trace-file)
# --------------------------------------------------------------------------------------

def read_trace(paths: list[Path]) -> list[list[dict]]:
    """Each start's events (a cut-off last line, from a SIGKILL, is dropped)."""
    starts = []
    for path in paths:
        events = []
        try:
            lines = path.read_text().splitlines()
        except OSError:
            lines = []
        for line in lines:
            try:
                events.append(json.loads(line))
            except ValueError:
                pass
        starts.append(events)
    return starts


def _overlap(a0: float, a1: float, spans: list[tuple[float, float]]) -> float:
    return sum(max(0.0, min(a1, b1) - max(a0, b0)) for b0, b1 in spans)


def analyze_trace(starts: list[list[dict]], phase_of_start: list[list[str]], records: list["Record"]) -> dict:
    """Per phase, medians of where each request's TTFT went (server clock): queued before its
    lookup (split: behind other requests' prefills, in decode steps, other), its disk reads,
    its prefill (its own compute, others' prefills and decode steps interleaved), the first
    decode step. Plus arrival -> warm blocks read, and the warm tier's writer: time per file and
    per commit (writes with their fsyncs), commit -> durable."""
    by_key: dict[tuple[str, int], list[str]] = {}
    for r in records:
        if r.prompt_tokens is not None and not r.error:
            by_key.setdefault((f"bench-agent-{r.agent:03d}", r.prompt_tokens), []).append(r.phase)
    rows: dict[str, list[dict]] = {}
    write_file, write_commit, durable, files_per_commit = [], [], [], []
    for events, phases in zip(starts, phase_of_start):
        prefills = [(e["t0"], e["t1"], e["seq"]) for e in events if e.get("kind") == "prefill"]
        decodes = [(e["t0"], e["t1"]) for e in events if e.get("kind") == "decode"]
        for e in events:
            if e.get("kind") != "seq" or e.get("prefill_only") or e.get("first_token") is None:
                continue
            cands = [p for p in by_key.get((e.get("agent"), e.get("prompt")), []) if p in phases]
            if not cands:
                continue
            phase = cands[0]
            sub, plan = e["submitted"], e.get("plan", e["submitted"])
            ready = max(e.get("plan_end", plan), e.get("reads_done") or 0.0)
            calls = e.get("prefill_calls") or []
            p0 = calls[0][0] if calls else ready
            p1 = e.get("prefill_end", calls[-1][1] if calls else ready)
            own = [(a, b) for a, b, _ in calls]
            others = [(a, b) for a, b, s in prefills if s != e["seq"]]
            row = {
                "ttft": e["first_token"] - sub,
                "queue": plan - sub,
                "queue_behind_prefills": _overlap(sub, plan, others),
                "queue_in_decode_steps": _overlap(sub, plan, decodes),
                "reads": (e["reads_done"] - e.get("plan_end", plan)) if e.get("reads_done") else 0.0,
                "wait_after_lookup": max(0.0, p0 - ready),
                "prefill": p1 - p0,
                "prefill_own": sum(b - a for a, b in own),
                "prefill_others": _overlap(p0, p1, others),
                "prefill_decode_steps": _overlap(p0, p1, decodes),
                "first_step": e["first_token"] - p1,
                "new_tokens": e["prompt"] - (e.get("cached") or 0),
                "warm_blocks": e.get("reads", 0),
                "arrival_to_warm_read": (e["reads_done"] - sub) if e.get("reads_done") else None,
            }
            rows.setdefault(phase, []).append(row)
        per_commit: dict[int, list[float]] = {}
        commit_t = {e["commit"]: e["t"] for e in events if e.get("kind") == "commit"}
        last_job: dict[int, float] = {}
        for e in events:
            if e.get("kind") != "job":
                continue
            if e["job"].startswith("save"):
                write_file.append(e["t1"] - e["t0"])
            if e.get("commit") is not None:
                per_commit.setdefault(e["commit"], []).append(e["t1"] - e["t0"])
                last_job[e["commit"]] = max(last_job.get(e["commit"], 0.0), e["t1"])
        for c, writes in per_commit.items():
            write_commit.append(sum(writes))
            files_per_commit.append(len(writes))
            if c in commit_t and c in last_job:
                durable.append(last_job[c] - commit_t[c])
    med = lambda xs: pct([x for x in xs if x is not None], 0.5)  # noqa: E731
    phases_out = {}
    for phase, rs in rows.items():
        keys = [k for k in rs[0] if k not in ("new_tokens", "warm_blocks")]
        phases_out[phase] = {"n": len(rs), **{k: med([r[k] for r in rs]) for k in keys},
                             "new_tokens": med([r["new_tokens"] for r in rs]),
                             "warm_blocks": med([r["warm_blocks"] for r in rs])}
    return {"phases": phases_out, "disk": {
        "files": len(write_file), "commits": len(write_commit),
        "write_per_file_median": med(write_file), "write_per_file_p90": pct(write_file, 0.9),
        "files_per_commit_median": med(files_per_commit),
        "write_per_commit_median": med(write_commit), "write_per_commit_p90": pct(write_commit, 0.9),
        "commit_to_durable_median": med(durable), "commit_to_durable_p90": pct(durable, 0.9),
        "commit_to_durable_max": max(durable) if durable else None}}


def trace_table(levers: dict) -> str:
    ms = lambda v: "n/a" if v is None else f"{v * 1000:.0f}"  # noqa: E731
    lines = ["| phase | n | TTFT | queued | ↳ behind others' prefills | ↳ in decode steps | disk reads | "
             "prefill span | ↳ own compute | ↳ others' prefills | ↳ decode steps | first step | arrival → warm read | "
             "new tokens |", "|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|"]
    for phase in ("first", "later", "crash", "graceful"):
        p = levers["phases"].get(phase)
        if not p:
            continue
        lines.append(f"| {phase} | {p['n']} | {ms(p['ttft'])} | {ms(p['queue'])} | {ms(p['queue_behind_prefills'])} | "
                     f"{ms(p['queue_in_decode_steps'])} | {ms(p['reads'])} | {ms(p['prefill'])} | "
                     f"{ms(p['prefill_own'])} | {ms(p['prefill_others'])} | {ms(p['prefill_decode_steps'])} | "
                     f"{ms(p['first_step'])} | {ms(p['arrival_to_warm_read'])} | {fmt(p['new_tokens'], digits=0)} |")
    d = levers["disk"]
    lines.append("")
    lines.append(f"warm tier's writer: {d['files']} files in {d['commits']} commits; write (with its fsyncs) per "
                 f"file median {ms(d['write_per_file_median'])} ms (p90 {ms(d['write_per_file_p90'])}); files per "
                 f"commit median {fmt(d['files_per_commit_median'], digits=0)}, write per commit median "
                 f"{ms(d['write_per_commit_median'])} ms (p90 {ms(d['write_per_commit_p90'])}); "
                 f"commit -> last file durable median {ms(d['commit_to_durable_median'])} ms "
                 f"(p90 {ms(d['commit_to_durable_p90'])}, max {ms(d['commit_to_durable_max'])})")
    return "\n".join(lines)

# --------------------------------------------------------------------------------------
# The workload
# --------------------------------------------------------------------------------------

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


def fetch_cache_state(root: str) -> dict:
    """Hot/disk bytes as agent-memory reports them (GET /v1/agents and /metrics): hot split into
    exact (as computed) and quantized (cooled); {} for other servers."""
    out: dict = {}
    try:
        r = httpx.get(root + "/v1/agents", timeout=30)
        if r.status_code == 200:
            body = r.json()
            for key in ("hot_bytes", "hot_exact_bytes", "hot_quantized_bytes", "disk_bytes", "hot_budget_bytes",
                        "hot_blocks", "warm_blocks", "cold_blocks", "snapshots", "snapshot_hot_bytes",
                        "snapshot_disk_bytes"):
                if key in body:
                    out[key] = body[key]
            data = body.get("data", [])
            out["agents"] = len(data)
            out["agent_tokens"] = {a["id"]: a.get("tokens") for a in data}
            out["agent_bytes"] = {a["id"]: a.get("bytes") for a in data}
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
    """The precision agent-memory's hot tier cools blocks to ("KV cached as q4g64")."""
    try:
        m = re.findall(r"KV cached as (\w+)", log.read_text(errors="replace"))
    except (OSError, AttributeError):
        return None
    return m[-1] if m else None


def weights_dtype(model_dir: Path) -> str | None:
    """The dtype of the first tensor in the model's safetensors (its KV is computed at it)."""
    names = {"F32": "float32", "F16": "float16", "BF16": "bfloat16"}
    for path in sorted(model_dir.glob("*.safetensors")):
        try:
            with open(path, "rb") as f:
                header = json.loads(f.read(int.from_bytes(f.read(8), "little")))
        except (OSError, ValueError):
            continue
        for name, entry in header.items():
            if name != "__metadata__" and isinstance(entry, dict) and entry.get("dtype") in names:
                return names[entry["dtype"]]
    return None


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
    dtype = str(cfg.get("torch_dtype") or cfg.get("dtype") or weights_dtype(Path(model_dir)) or "float16")
    elem = 4 if "32" in dtype else 2
    return {"layers": layers, "kv_heads": kv_heads, "head_dim": head_dim, "dtype": dtype, "bytes_per_element": elem,
            "kv_bytes_per_token": layers * kv_heads * head_dim * 2 * elem,
            "context": cfg.get("max_position_embeddings")}


# --------------------------------------------------------------------------------------
# Statistics
# --------------------------------------------------------------------------------------

PHASES = ("first", "later", "crash", "graceful")
RESTARTS = ("crash", "graceful")


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


def hit_ratio(records: list[Record], field_name: str = "cached_tokens") -> float | None:
    ok = [r for r in records if not r.error and r.prompt_tokens]
    if not ok or any(getattr(r, field_name) is None for r in ok):
        return None  # the server does not report cached tokens
    return sum(getattr(r, field_name) for r in ok) / sum(r.prompt_tokens for r in ok)


def ratio(a, b) -> float | None:
    return a / b if a is not None and b not in (None, 0) else None


def summarize(records: list[Record], walls: dict[str, float]) -> dict:
    """records: every request of a run; walls: seconds of each phase ("turns", "crash", "graceful")."""
    of = {p: [r for r in records if r.phase == p] for p in PHASES}
    main = of["first"] + of["later"]
    ok = [r for r in main if not r.error]
    completion = sum(r.completion_tokens or 0 for r in ok)
    agent0 = [r for r in of["first"] if r.agent == 0 and r.ttft is not None]
    wall = walls.get("turns")
    out = {
        "wall_s": wall,
        "phase_wall_s": walls,
        # The whole workload: the turns, then one more turn each after a restart.
        "workload_wall_s": {k: wall + walls[k] if wall is not None and walls.get(k) is not None else None
                            for k in RESTARTS},
        "requests": len(records),
        "errors": sum(1 for r in records if r.error),
        "ttft": {**{p: ttft_stats(of[p]) for p in PHASES}, "cold_agent0": agent0[0].ttft if agent0 else None},
        "output_tok_s": completion / wall if wall else None,
        "completion_tokens": completion,
        "prompt_tokens": sum(r.prompt_tokens or 0 for r in ok),
        "cached_tokens": sum(r.cached_tokens or 0 for r in ok),
        "hit_ratio": {"all": hit_ratio(main), **{p: hit_ratio(of[p]) for p in PHASES}},
        "log_hit_ratio": {"all": hit_ratio(main, "log_cached_tokens"),
                          **{p: hit_ratio(of[p], "log_cached_tokens") for p in PHASES}},
    }
    t = out["ttft"]
    out["ratios"] = {
        "cold_over_later": ratio(t["first"]["median"], t["later"]["median"]),
        **{f"cold_over_{k}": ratio(t["first"]["median"], t[k]["median"]) for k in RESTARTS},
        "cold_agent0_over_later": ratio(t["cold_agent0"], t["later"]["median"]),
        **{f"cold_agent0_over_{k}": ratio(t["cold_agent0"], t[k]["median"]) for k in RESTARTS},
    }
    return out


# --------------------------------------------------------------------------------------
# One run: (start server) -> agents x turns -> crash, one more turn each -> graceful restart,
# one more turn each
# --------------------------------------------------------------------------------------

def restart_plan(args) -> list[str]:
    if args.no_restart or args.restart == "none":
        return []
    return ["crash", "graceful"] if args.restart == "both" else [args.restart]


def model_name_for(kind: str, args) -> str:
    if args.model_name:
        return args.model_name
    # mlx_lm.server loads whatever `model` names (a hub id or path) unless it is "default_model".
    if kind == "mlx-lm":
        return "default_model"
    return Path(args.model).name if args.model else "default"


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
        server = ManagedServer(kind, args.model, cache_dir, work_dir, args, trace=args.trace and kind in args.ours_like and kind != BASE)
        server.start(args.start_timeout)
        base_url, root, pid = server.base_url, server.root, server.pid
    model_name = model_name_for(kind, args)

    doc = shared_document(args.system_tokens)
    agents = [Agent(i, [{"role": "system", "content": doc + "\n\n" + persona(i)}] + prior_history(i, history_tokens))
              for i in range(agents_n)]

    result: dict = {"server": kind, "tag": tag, "agents": agents_n, "turns": turns, "history_tokens": history_tokens,
                    "system_tokens_target": args.system_tokens, "max_tokens": args.max_tokens,
                    "stagger_s": args.stagger, "think_s": args.think, "geometry": geometry, "pid": pid,
                    "openblas": has_openblas(pid) if pid else None,
                    "load_s": server.load_s if server else None, "uptime": load_average()}
    sampler = RSSSampler(pid) if pid else None
    records: list[Record] = []
    walls: dict[str, float] = {}
    phase_of_start = [["first", "later"]]
    peaks = []
    try:
        if not args.no_warmup:
            asyncio.run(warm_up(base_url, model_name, args))
        print(f"  [{tag}] {kind}: {agents_n} agents x {turns} turns, history {history_tokens} tokens, "
              f"think {args.think:g}s (load {load_average()}) ...", flush=True)
        recs, walls["turns"] = asyncio.run(run_phase(base_url, model_name, agents, turns,
                                                     lambda t: "first" if t == 0 else "later", 0, args))
        records += recs
        last_turn_end = time.monotonic()
        result["cache_after_turns"] = fetch_cache_state(root)
        result["probe_shared_prefix_tokens"] = asyncio.run(probe_shared_prefix(base_url, model_name, doc, args))
        if sampler:
            peaks.append(sampler.stop())
            result["rss_after_turns_bytes"] = sampler.last
            sampler = None
        plan = restart_plan(args) if server else []
        if not plan:
            result["restart_skipped"] = "external server" if kind == "external" else "--no-restart"
        for n, mode in enumerate(plan):
            if mode == "crash":
                # As an OOM kill or a power cut would: a few seconds after the last turn ended.
                time.sleep(max(0.0, args.crash_delay - (time.monotonic() - last_turn_end)))
                result["crash_delay_s"] = time.monotonic() - last_turn_end
            server.stop(mode)
            server.start(args.start_timeout)
            base_url, root = server.base_url, server.root
            result[f"{mode}_load_s"] = server.load_s
            sampler = RSSSampler(server.pid)
            if not args.no_warmup:
                asyncio.run(warm_up(base_url, model_name, args))
            print(f"  [{tag}] {kind}: after a {mode} restart (ready in {server.load_s:.1f}s), one more turn each ...",
                  flush=True)
            recs, walls[mode] = asyncio.run(run_phase(base_url, model_name, agents, 1, lambda t, m=mode: m,
                                                      turns + n, args))
            records += recs
            last_turn_end = time.monotonic()
            phase_of_start.append([mode])
            result[f"cache_after_{mode}"] = fetch_cache_state(root)
            peaks.append(sampler.stop())
            sampler = None
    finally:
        if sampler:
            sampler.stop()
        if server:
            server.stop()

    if kind == "vllm-mlx" and server:
        # Its own log's count, per start, matched to the requests of the phase by prompt length.
        for log, phases in zip(server.logs, phase_of_start):
            fetches = vllm_log_fetches(log)
            for r in records:
                if r.phase in phases and r.prompt_tokens is not None:
                    hit = next((f for f in fetches if f[0] == r.prompt_tokens), None)
                    if hit is not None:
                        fetches.remove(hit)
                        r.log_cached_tokens = hit[1]
    result.update(summarize(records, walls))
    result["peak_rss_bytes"] = max(peaks) if peaks and max(peaks) else None
    result["log"] = [str(p) for p in server.logs] if server else None
    if server and server.traces:
        result["trace"] = [str(p) for p in server.traces]
        result["levers"] = analyze_trace(read_trace(server.traces), phase_of_start, records)

    # Hot KV against the ideal: one copy of the shared prefix plus each agent's own tokens.
    main = [r for r in records if r.phase in ("first", "later")]
    ok_first = [r for r in main if r.phase == "first" and not r.error and r.agent > 0 and r.cached_tokens]
    shared = max([r.cached_tokens for r in ok_first] + [result.get("probe_shared_prefix_tokens") or 0]) or None
    last_of: dict[int, Record] = {}
    for r in main:
        if not r.error and r.prompt_tokens is not None:
            if r.agent not in last_of or r.turn > last_of[r.agent].turn:
                last_of[r.agent] = r
    totals = {a: r.prompt_tokens + (r.completion_tokens or 0) for a, r in last_of.items()}
    first_prompt = [r.prompt_tokens for r in main if r.phase == "first" and r.prompt_tokens]
    result["tokens_first_prompt_median"] = pct(first_prompt, 0.5)
    result["shared_prefix_tokens"] = shared
    exact_kvb = geometry.get("kv_bytes_per_token")  # as computed: the model's dtype
    # agent-memory keeps hot KV exact while an agent is active and quantizes it when it cools
    # (its log: "KV cached as q4g64"): the ideal prices each token at the precision held.
    precision = kv_precision_from_log(server.logs[0]) if server and kind in args.ours_like else None
    result["kv_precision"] = precision or geometry.get("dtype")
    quant_kvb = exact_kvb
    if exact_kvb and precision and precision.startswith("q"):
        bits, group = (int(x) for x in precision[1:].split("g"))
        elem = geometry["bytes_per_element"]
        quant_kvb = exact_kvb * (bits / 8 + 2 * elem / group) / elem
    result["kv_bytes_per_token_exact"] = exact_kvb
    result["kv_bytes_per_token_quantized"] = quant_kvb
    cache = result.get("cache_after_turns") or {}
    hot = cache.get("hot_bytes", cache.get("metrics_hot_bytes"))
    exact = cache.get("hot_exact_bytes", cache.get("metrics_hot_exact_bytes"))
    quant = cache.get("hot_quantized_bytes", cache.get("metrics_hot_quantized_bytes"))
    if hot is None and exact is not None and quant is not None:
        hot = exact + quant
    result["hot_bytes"], result["hot_exact_bytes"], result["hot_quantized_bytes"] = hot, exact, quant
    # Models with window or recurrent layers: their snapshots, a part of hot_bytes (and of disk).
    result["snapshots"] = cache.get("snapshots")
    result["snapshot_hot_bytes"], result["snapshot_disk_bytes"] = cache.get("snapshot_hot_bytes"), cache.get("snapshot_disk_bytes")
    if exact_kvb and totals:
        s = shared or 0
        unique = s + sum(t - s for t in totals.values())
        result["unique_tokens"] = unique
        result["ideal_hot_bytes_exact"] = unique * exact_kvb
        result["ideal_hot_bytes_quantized"] = unique * quant_kvb
        held = None
        if exact is not None and quant is not None:
            held = exact / exact_kvb + quant / quant_kvb  # tokens held hot, at either precision
        elif hot is not None:
            held = hot / quant_kvb
        if held:
            result["hot_tokens_held"] = held
            # The ideal at the mix of precisions actually held.
            result["ideal_hot_bytes"] = unique * hot / held
            result["hot_over_ideal"] = held / unique
        result["unshared_hot_bytes"] = sum(totals.values()) * exact_kvb
    result["records"] = [asdict(r) for r in records]
    return result


def code_version(args) -> str | None:
    """Our server's commit, and whether its checkout has uncommitted changes under agent_memory/."""
    try:
        d = str(args.ours_dir)
        head = subprocess.run(["git", "-C", d, "rev-parse", "--short", "HEAD"], capture_output=True, text=True,
                              timeout=10).stdout.strip()
        dirty = subprocess.run(["git", "-C", d, "status", "--porcelain", "--", "agent_memory"], capture_output=True,
                               text=True, timeout=10).stdout.strip()
        return f"{head}{' + uncommitted changes' if dirty else ''}" if head else None
    except (OSError, subprocess.SubprocessError):
        return None


def load_average() -> str:
    try:
        return " ".join(f"{x:.2f}" for x in os.getloadavg())
    except OSError:
        return "n/a"


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
    "workload_wall_crash_s": lambda r: r["workload_wall_s"]["crash"],
    "workload_wall_graceful_s": lambda r: r["workload_wall_s"]["graceful"],
    "ttft_cold_agent0": lambda r: r["ttft"]["cold_agent0"],
    "output_tok_s": lambda r: r["output_tok_s"],
    "peak_rss_bytes": lambda r: r["peak_rss_bytes"],
    "hot_bytes": lambda r: r["hot_bytes"],
    "hot_exact_bytes": lambda r: r.get("hot_exact_bytes"),
    "hot_quantized_bytes": lambda r: r.get("hot_quantized_bytes"),
    "ideal_hot_bytes": lambda r: r.get("ideal_hot_bytes"),
    "ideal_hot_bytes_exact": lambda r: r.get("ideal_hot_bytes_exact"),
    "ideal_hot_bytes_quantized": lambda r: r.get("ideal_hot_bytes_quantized"),
    "snapshots": lambda r: r.get("snapshots"),
    "snapshot_hot_bytes": lambda r: r.get("snapshot_hot_bytes"),
    "snapshot_disk_bytes": lambda r: r.get("snapshot_disk_bytes"),
    "errors": lambda r: r["errors"],
    "first_prompt_tokens": lambda r: r["tokens_first_prompt_median"],
    "crash_load_s": lambda r: r.get("crash_load_s"),
    "graceful_load_s": lambda r: r.get("graceful_load_s"),
}
for _p in PHASES:
    METRICS[f"ttft_{_p}_median"] = lambda r, p=_p: r["ttft"][p]["median"]
    METRICS[f"ttft_{_p}_p90"] = lambda r, p=_p: r["ttft"][p]["p90"]
    METRICS[f"hit_ratio_{_p}"] = lambda r, p=_p: r["hit_ratio"][p]
    METRICS[f"log_hit_ratio_{_p}"] = lambda r, p=_p: r["log_hit_ratio"][p]
for _k in RESTARTS:
    METRICS[f"cold_over_{_k}"] = lambda r, k=_k: r["ratios"][f"cold_over_{k}"]
METRICS["hit_ratio_all"] = lambda r: r["hit_ratio"]["all"]
METRICS["log_hit_ratio_all"] = lambda r: r["log_hit_ratio"]["all"]
METRICS["cold_over_later"] = lambda r: r["ratios"]["cold_over_later"]


def aggregate(runs: list[dict]) -> dict:
    return {name: median_of(runs, get) for name, get in METRICS.items()} | {"runs": len(runs)}


def hit_cell(s: dict, phase: str) -> str:
    """Cached/prompt tokens as the API reports them; where it reports none, n/a (and what the
    server's own log says, in parentheses, where it says anything)."""
    v, log = s.get(f"hit_ratio_{phase}"), s.get(f"log_hit_ratio_{phase}")
    if v is None and log is not None:
        return f"n/a (log {log:.2f})"
    return fmt(v)


def hot_cell(s: dict) -> str:
    if s.get("hot_exact_bytes") is not None:
        return f"{mb(s['hot_exact_bytes'])} + {mb(s['hot_quantized_bytes'])} / {mb(s['ideal_hot_bytes'])}"
    return f"{mb(s['hot_bytes'])} / {mb(s['ideal_hot_bytes'])}"


def table(summary: dict[str, dict]) -> str:
    head = ("| server | runs | prompt tok (1st) | wall s (turns) | TTFT first med / p90 | TTFT later med / p90 | "
            "TTFT after crash med / p90 | TTFT after graceful med / p90 | out tok/s | hit later | hit crash | "
            "hit graceful | ready s crash / graceful | peak RSS MB | hot MB exact + Q / ideal | errors |")
    lines = [head, "|" + "---|" * (head.count("|") - 1)]
    for name, s in summary.items():
        lines.append(
            f"| {name} | {s['runs']} | {fmt(s['first_prompt_tokens'], digits=0)} | {fmt(s['wall_s'], digits=1)} | "
            f"{fmt(s['ttft_first_median'])} / {fmt(s['ttft_first_p90'])} | "
            f"{fmt(s['ttft_later_median'])} / {fmt(s['ttft_later_p90'])} | "
            f"{fmt(s['ttft_crash_median'])} / {fmt(s['ttft_crash_p90'])} | "
            f"{fmt(s['ttft_graceful_median'])} / {fmt(s['ttft_graceful_p90'])} | {fmt(s['output_tok_s'], digits=1)} | "
            f"{hit_cell(s, 'later')} | {hit_cell(s, 'crash')} | {hit_cell(s, 'graceful')} | "
            f"{fmt(s['crash_load_s'], digits=1)} / {fmt(s['graceful_load_s'], digits=1)} | {mb(s['peak_rss_bytes'])} | "
            f"{hot_cell(s)} | {fmt(s['errors'], digits=0)} |")
    return "\n".join(lines)


def cold_table(summary: dict[str, dict]) -> str:
    lines = ["| server | TTFT cold (1st turn) | TTFT cold agent 0 | TTFT warm (next turn) | TTFT after crash | "
             "TTFT after graceful restart | cold / warm | cold / after crash | cold / after graceful |",
             "|---|---|---|---|---|---|---|---|---|"]
    for name, s in summary.items():
        lines.append(f"| {name} | {fmt(s['ttft_first_median'])} | {fmt(s['ttft_cold_agent0'])} | "
                     f"{fmt(s['ttft_later_median'])} | {fmt(s['ttft_crash_median'])} | "
                     f"{fmt(s['ttft_graceful_median'])} | {fmt(s['cold_over_later'], 'x', 1)} | "
                     f"{fmt(s['cold_over_crash'], 'x', 1)} | {fmt(s['cold_over_graceful'], 'x', 1)} |")
    return "\n".join(lines)


COMPARED = [
    ("workload_wall_crash_s", "workload wall s (turns + turn after a crash)"),
    ("workload_wall_graceful_s", "workload wall s (turns + turn after a graceful restart)"),
    ("wall_s", "wall s, turns only"),
    ("ttft_first_median", "first-turn TTFT median"),
    ("ttft_later_median", "later-turn TTFT median"),
    ("ttft_crash_median", "TTFT median after a crash"),
    ("ttft_graceful_median", "TTFT median after a graceful restart"),
    ("output_tok_s", "output tok/s"),
    ("hit_ratio_later", "hit ratio, later turns"),
    ("hit_ratio_crash", "hit ratio after a crash"),
    ("hit_ratio_graceful", "hit ratio after a graceful restart"),
    ("peak_rss_bytes", "peak server RSS"),
]


def compare_table(summary: dict[str, dict], others: list[str]) -> tuple[str, dict]:
    """Ours against each of `others` (the peers; or the baseline and variants), metric by metric."""
    ours = summary.get("ours")
    peers = [k for k in others if k in summary and k != "ours"]
    if not ours or not peers:
        return "", {}
    ratios = {p: {k: ratio(ours[k], summary[p][k]) for k, _ in COMPARED} for p in peers}
    head = "| metric | ours | " + " | ".join(peers) + " | " + " | ".join(f"ours / {p}" for p in peers) + " |"
    lines = [head, "|" + "---|" * (head.count("|") - 1)]
    for k, label in COMPARED:
        cells = []
        for name in ["ours"] + peers:
            v = summary[name][k]
            if k == "peak_rss_bytes":
                cells.append(mb(v) + " MB" if v is not None else "n/a")
            elif k.startswith("hit_ratio") and v is None:
                cells.append(hit_cell(summary[name], k.removeprefix("hit_ratio_")))
            else:
                cells.append(fmt(v, digits=3 if k.startswith("hit") else 2))
        lines.append(f"| {label} | " + " | ".join(cells) + " | " +
                     " | ".join(fmt(ratios[p][k], "x", 2) for p in peers) + " |")
    return "\n".join(lines), ratios


def targets(summary: dict[str, dict]) -> tuple[str, list[dict]]:
    """The issue's targets, each against the peers it names, with the numbers."""
    ours = summary.get("ours")
    peers = [k for k in PEERS if k in summary]
    if not ours or not (peers or BASE in summary):
        return "", []
    rows = []

    def add(name: str, value, limit: float, better: str, against: str) -> None:
        met = None if value is None else (value <= limit if better == "<=" else value >= limit)
        rows.append({"target": name, "against": against, "value": value, "limit": limit, "met": met})

    for p in peers:
        add("later-turn TTFT ≤ 0.4× each peer's", ratio(ours["ttft_later_median"], summary[p]["ttft_later_median"]),
            0.4, "<=", p)
    for kind in RESTARTS:
        key = f"workload_wall_{kind}_s"
        vals = {p: summary[p][key] for p in peers if summary[p][key] is not None}
        if vals:
            fastest = min(vals, key=vals.get)
            add(f"workload wall time (turns + turn after a {'crash' if kind == 'crash' else 'graceful restart'}) "
                "≤ 0.6× the faster peer's", ratio(ours[key], vals[fastest]), 0.6, "<=", fastest)
    for p in peers:
        add("after a crash, TTFT ≥ 10× better than each peer's",
            ratio(summary[p]["ttft_crash_median"], ours["ttft_crash_median"]), 10.0, ">=", p)
    if "vllm-mlx" in summary:
        add("after a graceful restart, TTFT no worse than vllm-mlx's",
            ratio(ours["ttft_graceful_median"], summary["vllm-mlx"]["ttft_graceful_median"]), 1.0, "<=", "vllm-mlx")
    if BASE in summary:
        add("later-turn TTFT ≤ 0.8× the baseline's", ratio(ours["ttft_later_median"], summary[BASE]["ttft_later_median"]),
            0.8, "<=", BASE)
    rss = {p: summary[p]["peak_rss_bytes"] for p in peers if summary[p]["peak_rss_bytes"]}
    if rss:
        smaller = min(rss, key=rss.get)
        add("peak RSS ≤ 0.6× the smaller peer's", ratio(ours["peak_rss_bytes"], rss[smaller]), 0.6, "<=", smaller)
    lines = ["| target | against | measured | met |", "|---|---|---|---|"]
    for r in rows:
        shown = fmt(r["value"], "×", 2)
        lines.append(f"| {r['target']} | {r['against']} | {shown} | "
                     f"{'n/a' if r['met'] is None else ('yes' if r['met'] else '**no**')} |")
    return "\n".join(lines), rows


# --------------------------------------------------------------------------------------
# --scale
# --------------------------------------------------------------------------------------

COLORS = {"ours": "tab:blue", "mlx-lm": "tab:orange", "vllm-mlx": "tab:green", "external": "tab:gray"}


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
        for server in SERVERS + ("external",):
            color = COLORS[server]
            sp = sorted((p for p in pts if p["server"] == server), key=lambda p: p[xkey])
            if not sp:
                continue
            xs = [p[xkey] for p in sp]
            for metric, style, label in (("ttft_later_median", "-o", "later turns"),
                                         ("ttft_crash_median", "--s", "after a crash"),
                                         ("ttft_graceful_median", "-.d", "after a graceful restart"),
                                         ("ttft_first_median", ":^", "first turn")):
                ys = [p.get(metric) for p in sp]
                if any(y is not None for y in ys):
                    ax1.plot(xs, [math.nan if y is None else y for y in ys], style, color=color,
                             label=f"{server}: {label}")
            ax2.plot(xs, [(p["peak_rss_bytes"] or math.nan) / 2**20 for p in sp], "-o", color=color,
                     label=f"{server}: peak RSS")
            if server == "ours":
                exact = [(p.get("hot_exact_bytes") or 0) / 2**20 for p in sp]
                quant = [(p.get("hot_quantized_bytes") or 0) / 2**20 for p in sp]
                ax2.plot(xs, [(e + q) or math.nan for e, q in zip(exact, quant)], "--s", color=color,
                         label="ours: hot KV, all")
                exact, quant = [e or math.nan for e in exact], [q or math.nan for q in quant]  # log scale: 0 not drawn
                ax2.plot(xs, exact, "--^", color="tab:cyan", label="ours: hot KV exact (as computed)")
                ax2.plot(xs, quant, "--v", color="tab:purple", label="ours: hot KV quantized (cooled)")
                ax2.plot(xs, [(p.get("ideal_hot_bytes_exact") or math.nan) / 2**20 for p in sp], ":", color="gray",
                         label="ideal KV, all exact (shared prefix once)")
                ax2.plot(xs, [(p.get("ideal_hot_bytes_quantized") or math.nan) / 2**20 for p in sp], ":",
                         color="silver", label="ideal KV, all quantized")
        ax1.set(xlabel=xlabel, ylabel="TTFT median (s)", title=f"Time to first token vs {xlabel}")
        ax1.set_yscale("log")
        ax2.set(xlabel=xlabel, ylabel="MiB", title=f"Server memory vs {xlabel}")
        ax2.set_yscale("log")
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


def server_list(s: str) -> list[str]:
    out = []
    for name in s.split(","):
        name = ALIASES.get(name.strip(), name.strip())
        if name == "both":
            out += ["ours", "mlx-lm"]
        elif name == "all":
            out += list(SERVERS)
        elif name in SERVERS:
            out.append(name)
        elif name:
            raise argparse.ArgumentTypeError(f"unknown server {name!r} (ours, mlx-lm, vllm-mlx, both, all)")
    return list(dict.fromkeys(out))


def parse_args(argv=None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    g = p.add_argument_group("server")
    g.add_argument("--serve", type=server_list, default=None, metavar="LIST",
                   help="start these servers here, comma-separated: ours, mlx-lm (or peer), vllm-mlx, both "
                        "(ours,mlx-lm), all (default: ours, unless --base-url is given)")
    g.add_argument("--compare", action="store_true", help="ours and --peers (default: all three)")
    g.add_argument("--peers", type=server_list, default=list(PEERS), metavar="LIST",
                   help="with --compare: the peers (default mlx-lm,vllm-mlx)")
    g.add_argument("--base-url", help="benchmark a running server instead (no restart phase)")
    g.add_argument("--server-pid", type=int, help="with --base-url: its PID, to sample memory")
    g.add_argument("--model", default=None, help=f"model folder for the started servers (default {DEMO_MODEL})")
    g.add_argument("--model-dir", default=None, help="with --base-url: model folder to read config.json from")
    g.add_argument("--model-name", default=None, help="'model' field sent (default: the folder's name)")
    g.add_argument("--api-key", default="unused")
    g.add_argument("--ours-cmd", default=f"{shlex.quote(sys.executable)} -m agent_memory serve")
    g.add_argument("--ours-args", default="", help="extra flags for agent-memory serve, e.g. '--hot-budget-mb 512'")
    g.add_argument("--ours-dir", type=Path, default=REPO,
                   help="the checkout whose agent_memory our server runs (default this one; e.g. a git worktree "
                        "of a commit, unaffected by edits in progress here)")
    g.add_argument("--peer-cmd", default=f"{shlex.quote(sys.executable)} -m mlx_lm server",
                   help="mlx-lm's server command")
    g.add_argument("--peer-args", default="", help="extra flags for mlx_lm server")
    g.add_argument("--vllm-venv", type=Path, default=VLLM_MLX_VENV,
                   help=f"vllm-mlx's own venv (default {VLLM_MLX_VENV.relative_to(REPO)}; made on first use)")
    g.add_argument("--vllm-args", default="", help="extra flags for vllm-mlx serve")
    g.add_argument("--no-install", action="store_true", help="never create vllm-mlx's venv; fail instead")
    g.add_argument("--setup-vllm-mlx", action="store_true", help="create vllm-mlx's venv and exit")
    g.add_argument("--baseline", metavar="REV",
                   help="also run our server at this commit (a clean worktree made in the work dir), alternating "
                        "with this checkout's, and print ours / base: the guard against a regression")
    g.add_argument("--variant", action="append", default=[], metavar="NAME=FLAGS",
                   help="also run this checkout's server with these extra flags under NAME, alternating "
                        "(e.g. spec-off='--speculation off'); repeatable")
    g.add_argument("--repeats", type=int, default=1, help="runs per server, alternating between the servers")
    g.add_argument("--start-timeout", type=float, default=300)
    g.add_argument("--work-dir", type=Path, default=None, help="cache folders and logs (default: a temp dir)")
    g.add_argument("--keep", action="store_true", help="keep the work dir (always kept when a run fails)")
    g.add_argument("--trace", action="store_true",
                   help="our server only: read its --trace-file (queue, disk reads, prefill, warm-tier "
                        "writes); a table of where TTFT goes")

    w = p.add_argument_group("workload")
    w.add_argument("--agents", type=int, default=8)
    w.add_argument("--turns", type=int, default=4)
    w.add_argument("--think", type=float, default=0.0, help="seconds between an agent's reply and its next turn")
    w.add_argument("--system-tokens", type=int, default=1000, help="size of the shared system document")
    w.add_argument("--history-tokens", type=int, default=0, help="each agent's pre-existing conversation")
    w.add_argument("--max-tokens", type=int, default=64)
    w.add_argument("--stagger", type=float, default=0.5, help="agent i starts after i x this many seconds")
    w.add_argument("--restart", choices=["both", "crash", "graceful", "none"], default="both",
                   help="after the turns: a crash (SIGKILL), then a graceful restart (SIGTERM), one more turn "
                        "each after each (default both)")
    w.add_argument("--crash-delay", type=float, default=3.0,
                   help="seconds from the last turn's end to the SIGKILL (default 3)")
    w.add_argument("--no-restart", action="store_true", help="skip the restart phases (= --restart none)")
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

    if args.setup_vllm_mlx:
        return args
    if args.compare:
        args.serve = ["ours"] + [k for k in args.peers if k != "ours"]
    args.ours_like = {"ours": OursCode(args.ours_dir, args.ours_args)}
    for v in args.variant:
        name, sep, flags = v.partition("=")
        if not sep or not name or name in SERVERS + (BASE, "external"):
            p.error(f"--variant {v!r}: NAME=FLAGS, NAME not one of the servers' names")
        args.ours_like[name] = OursCode(args.ours_dir, f"{args.ours_args} {flags}")
    if args.baseline or args.variant:
        if args.base_url:
            p.error("--baseline and --variant start servers: not with --base-url")
        args.serve = (args.serve or ["ours"]) + ([BASE] if args.baseline else []) + [
            n for n in args.ours_like if n != "ours"]
    if args.base_url and args.serve:
        p.error("--base-url and --serve/--compare exclude each other")
    if not args.base_url and not args.serve:
        args.serve = ["ours"]
    if args.serve:
        args.model = str(Path(args.model or DEMO_MODEL).expanduser())
        if not (Path(args.model) / "config.json").exists():
            p.error(f"no model at {args.model} (run: agent-memory models fetch demo)")
    if args.trace and args.serve and "ours" not in args.serve:
        p.error("--trace times our server: --serve ours")
    return args


def add_baseline(args, work_dir: Path) -> Path | None:
    """A clean worktree of --baseline in the work dir (or the folder given), run as "base"."""
    if not args.baseline:
        return None
    folder = Path(args.baseline)
    made = None
    if not (folder / "agent_memory").is_dir():
        made = work_dir / f"baseline-{args.baseline}"
        subprocess.run(["git", "-C", str(REPO), "worktree", "add", "--detach", str(made), args.baseline],
                       check=True, capture_output=True)
        folder = made
    args.ours_like[BASE] = OursCode(folder, args.ours_args)
    return made


def drop_baseline(made: Path | None) -> None:
    if made is not None:
        subprocess.run(["git", "-C", str(REPO), "worktree", "remove", "--force", str(made)], capture_output=True)


def servers_of(args) -> list[str]:
    if args.base_url:
        return ["external"]
    return list(args.serve)


def clip_history(args, history: int, turns: int) -> int:
    ctx = model_geometry(args.model or args.model_dir).get("context")
    if not ctx:
        return history
    need = args.system_tokens + 64 + (turns + 1 + len(restart_plan(args))) * (args.max_tokens + 40)
    if history + need > ctx:
        clipped = max(0, ctx - need)
        print(f"note: history {history} + ~{need} workload tokens exceed the model's context ({ctx}); "
              f"using {clipped}", file=sys.stderr)
        return clipped
    return history


def _exit_on_signal(signum, frame) -> None:
    raise SystemExit(128 + signum)  # unwinds through the finally blocks that stop the servers


def main(argv=None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    args = parse_args(argv)
    if args.setup_vllm_mlx:
        print(ensure_vllm_mlx(args.vllm_venv))
        return 0
    if "vllm-mlx" in (args.serve or []):
        ensure_vllm_mlx(args.vllm_venv, install=not args.no_install)  # before any run, not in the middle
    signal.signal(signal.SIGTERM, _exit_on_signal)
    signal.signal(signal.SIGINT, signal.default_int_handler)  # even when started in the background
    work_dir = args.work_dir or Path(tempfile.mkdtemp(prefix="bench-agents-"))
    work_dir.mkdir(parents=True, exist_ok=True)
    print(f"work dir: {work_dir}", flush=True)
    baseline = add_baseline(args, work_dir)
    servers = servers_of(args)
    out: dict = {"argv": argv, "model": args.model or args.model_dir, "started": time.strftime("%FT%T%z"),
                 "load_average_at_start": load_average(), "ours_code": code_version(args),
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
                    points.append({"axis": axis, "server": kind, "agents": n, "history_tokens": h,
                                   "uptime": r.get("uptime"), **agg})
                    print(f"    TTFT later {fmt(agg['ttft_later_median'])}s, after crash "
                          f"{fmt(agg['ttft_crash_median'])}s, after graceful {fmt(agg['ttft_graceful_median'])}s, "
                          f"peak RSS {mb(agg['peak_rss_bytes'])} MB, hot {mb(agg['hot_exact_bytes'])} exact + "
                          f"{mb(agg['hot_quantized_bytes'])} quantized MB, errors {agg['errors']}", flush=True)
            out["scale"] = points
            out["runs"] = runs
            lines = ["| axis | server | agents | history | TTFT first | TTFT later | TTFT after crash | "
                     "TTFT after graceful | hit later | peak RSS MB | hot MB exact + Q / ideal | load at start | "
                     "errors |", "|---|---|---|---|---|---|---|---|---|---|---|---|---|"]
            for pt in points:
                lines.append(f"| {pt['axis']} | {pt['server']} | {pt['agents']} | {pt['history_tokens']} | "
                             f"{fmt(pt['ttft_first_median'])} | {fmt(pt['ttft_later_median'])} | "
                             f"{fmt(pt['ttft_crash_median'])} | {fmt(pt['ttft_graceful_median'])} | "
                             f"{hit_cell(pt, 'later')} | {mb(pt['peak_rss_bytes'])} | {hot_cell(pt)} | "
                             f"{pt['uptime'].split()[0] if pt.get('uptime') else 'n/a'} | "
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
                for kind in servers:  # alternating: ours, mlx-lm, vllm-mlx, ours, ...
                    runs.append(run_workload(kind, args, args.agents, args.turns, history, work_dir, f"{kind}-r{rep}"))
            out["runs"] = runs
            summary = {k: aggregate([r for r in runs if r["server"] == k]) for k in servers}
            out["summary"] = summary
            text = table(summary)
            if history:
                text += "\n\n" + cold_table(summary)
            if (ours := summary.get("ours")) and ours.get("snapshots"):
                text += (f"\n\nours after the turns: hot {ours['hot_bytes'] / 2**20:.2f} MiB, of which "
                         f"{ours['snapshots']:.0f} snapshots {ours['snapshot_hot_bytes'] / 2**20:.2f} MiB; snapshots "
                         f"on disk {ours['snapshot_disk_bytes'] / 2**20:.2f} MiB")
            cmp_text, ratios = compare_table(summary, list(PEERS))
            if cmp_text:
                text += "\n\n" + cmp_text
                out["ratios_ours_over_peer"] = ratios
            own_text, own_ratios = compare_table(summary, list(args.ours_like))
            if own_text:
                text += f"\n\nours against {args.baseline or 'the baseline'} and the variants\n\n" + own_text
                out["ratios_ours_over_own"] = own_ratios
            tgt_text, tgt_rows = targets(summary)
            if tgt_text:
                text += "\n\n" + tgt_text
                out["targets"] = tgt_rows
            levers = [r["levers"] for r in runs if r.get("levers")]
            if levers:
                out["levers"] = levers
                for i, lv in enumerate(levers):
                    text += f"\n\nours, run {i + 1}: where the time goes (medians, ms, server clock)\n\n" + trace_table(lv)
            r0 = next((r for r in runs if r["server"] == "ours"), runs[0] if runs else {})
            kvb, kvq = r0.get("kv_bytes_per_token_exact"), r0.get("kv_bytes_per_token_quantized")
            text += (f"\n\n{args.agents} agents x {args.turns} turns, think {args.think:g}s (+1 turn after each of: "
                     f"{', '.join(restart_plan(args)) or 'no restart'}; crash {args.crash_delay:g}s after the last "
                     f"turn), history {history} tokens, shared system ~{args.system_tokens} tokens (shared prefix "
                     f"seen: {fmt(r0.get('shared_prefix_tokens'))}), max_tokens {args.max_tokens}, stagger "
                     f"{args.stagger}s; KV bytes/token {fmt(kvb)} exact" +
                     (f", {fmt(kvq, digits=0)} {r0.get('kv_precision')} (cooled)" if kvq and kvq != kvb else "") +
                     f"; ours: {out.get('ours_code')} ({args.ours_dir})"
                     "; load average per run: " + ", ".join(f"{r['tag']} {r.get('uptime')}" for r in runs))
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
        drop_baseline(baseline)
        if not args.keep and not failed and not args.work_dir:
            shutil.rmtree(work_dir, ignore_errors=True)
        elif failed:
            print(f"work dir kept (logs): {work_dir}", file=sys.stderr)
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())

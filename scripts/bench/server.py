"""One way for the benchmarks to start, wait for and stop a server process (agent-memory's,
mlx-lm's, vllm-mlx's) on a free loopback port, each start with a log file of its own."""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Sequence
from pathlib import Path

import httpx

REPO = Path(__file__).resolve().parent.parent.parent
MODELS = Path(os.environ.get("XDG_CACHE_HOME", Path.home() / ".cache")) / "agent-memory/models"  # as `serve` keeps them
DEMO_MODEL = MODELS / "smollm2-135m-instruct"


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def offline_env(**extra: str) -> dict[str, str]:
    """This process's environment for a server: offline, unbuffered, no API key of ours."""
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1", "PYTHONUNBUFFERED": "1",
           "TOKENIZERS_PARALLELISM": "false"}
    env.pop("AGENT_MEMORY_API_KEY", None)
    return {**env, **extra}


def clean_env(**extra: str) -> dict[str, str]:
    """offline_env without any AGENT_MEMORY_* setting and with no config file: the server runs
    on its defaults and the flags it is given."""
    env = {k: v for k, v in offline_env().items() if not k.startswith("AGENT_MEMORY_")}
    env["AGENT_MEMORY_CONFIG"] = str(Path(tempfile.gettempdir()) / "agent-memory-bench-no-config.toml")
    return {**env, **extra}


def ours_command(port: int, models: Sequence[str | Path], cache_dir: Path, *flags: str) -> list[str]:
    """`python -m agent_memory serve` on loopback at `port`, each of `models` a --model."""
    cmd = [sys.executable, "-m", "agent_memory", "serve", "--port", str(port), "--cache-dir", str(cache_dir)]
    for model in models:
        cmd += ["--model", str(model)]
    return cmd + list(flags)


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


class ServerProcess:
    """A server run as a child process in its own session: `command(port)` on a fresh free
    port at each start, its output in `<log_dir>/<name>-start<N>.log`. Restartable (the
    benchmarks' crash and graceful restarts); `load_s` is the last start's time to ready."""

    def __init__(self, name: str, command: Callable[[int], list[str]], env: dict[str, str], log_dir: Path,
                 cwd: Path = REPO) -> None:
        self.name, self.command, self.env, self.log_dir, self.cwd = name, command, env, log_dir, cwd
        self.proc: subprocess.Popen | None = None
        self.port = 0
        self.starts = 0
        self.logs: list[Path] = []
        self.load_s: float | None = None
        self._launched = 0.0

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    @property
    def base_url(self) -> str:
        return self.url + "/v1"

    @property
    def pid(self) -> int | None:
        return self.proc.pid if self.proc else None

    @property
    def log_path(self) -> Path | None:
        return self.logs[-1] if self.logs else None

    def launch(self) -> ServerProcess:
        """Start the process and return at once (several servers load side by side)."""
        self.port = free_port()
        self.starts += 1
        self.log_dir.mkdir(parents=True, exist_ok=True)
        self.logs.append(self.log_dir / f"{self.name}-start{self.starts}.log")
        self._launched = time.monotonic()
        with open(self.log_path, "ab") as log:
            self.proc = subprocess.Popen(self.command(self.port), stdout=log, stderr=subprocess.STDOUT, env=self.env,
                                         cwd=self.cwd, start_new_session=True)
        return self

    def wait_ready(self, timeout: float = 300) -> ServerProcess:
        try:
            wait_ready(self.url, timeout, self.proc, self.log_path)
        except RuntimeError:
            self.stop("crash")
            raise
        self.load_s = time.monotonic() - self._launched
        return self

    def start(self, timeout: float = 300) -> ServerProcess:
        return self.launch().wait_ready(timeout)

    def log(self) -> str:
        """The last start's output so far."""
        path = self.log_path
        return path.read_text(errors="replace") if path and path.exists() else ""

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
                    print(f"warning: {self.name} did not stop within {timeout}s of SIGTERM; killing it",
                          file=sys.stderr)
                    self.proc.kill()
                    self.proc.wait()
        code, self.proc = self.proc.returncode, None
        return code

    def __enter__(self) -> ServerProcess:
        return self.start()

    def __exit__(self, *exc) -> None:
        self.stop()


def start_redis(folder: Path, maxmemory: str = "256mb", timeout: float = 20) -> tuple[ServerProcess, str]:
    """redis-server on loopback that saves nothing, volatile-lru at `maxmemory`, answering PING
    (sent by hand: the soak needs only the standard library and httpx): its process and URL."""
    def command(port: int) -> list[str]:
        return ["redis-server", "--port", str(port), "--bind", "127.0.0.1", "--save", "", "--appendonly", "no",
                "--maxmemory", maxmemory, "--maxmemory-policy", "volatile-lru", "--dir", str(folder)]

    redis = ServerProcess("redis", command, dict(os.environ), folder).launch()
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:
            with socket.create_connection(("127.0.0.1", redis.port), timeout=1) as s:
                s.sendall(b"PING\r\n")
                if s.recv(16).startswith(b"+PONG"):
                    return redis, f"redis://127.0.0.1:{redis.port}/0"
        except OSError:
            pass
        time.sleep(0.05)
    redis.stop("crash")
    raise RuntimeError(f"redis-server did not start (log: {redis.log_path})")

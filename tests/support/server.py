"""`agent-memory serve` as a child process: what the tests of process lifecycle, signals, flags
and the CLI start (the rest share an in-process server: tests/support/inprocess.py)."""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import httpx
import openai

REPO = Path(__file__).resolve().parents[2]


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class Serving:
    """What a test reaches any running server by, a process or in-process: its loopback URL and
    clients (`port` is set by the server)."""

    port: int

    @property
    def base_url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def client(self, **kw) -> openai.OpenAI:
        return openai.OpenAI(base_url=self.base_url + "/v1", api_key=kw.pop("api_key", "unused"), max_retries=0, **kw)

    def async_client(self, **kw) -> openai.AsyncOpenAI:
        return openai.AsyncOpenAI(
            base_url=self.base_url + "/v1", api_key=kw.pop("api_key", "unused"), max_retries=0, **kw
        )

    def http(self) -> httpx.Client:
        return httpx.Client(base_url=self.base_url, timeout=120)


class Server(Serving):
    """`agent-memory serve` as a child process on a free loopback port."""

    def __init__(
        self, model: Path | str, cache_dir: Path, *args: str, log: Path | None = None, env: dict | None = None
    ) -> None:
        self.model, self.cache_dir, self.args, self.env = str(model), cache_dir, list(args), env or {}
        self.port = free_port()
        self.log_path = log or cache_dir / f"server-{self.port}.log"
        self.proc: subprocess.Popen | None = None

    def start(self, timeout: float = 180) -> "Server":
        self.cache_dir.mkdir(parents=True, exist_ok=True)
        env = {k: v for k, v in os.environ.items() if not k.startswith("AGENT_MEMORY_")}
        env.update({"PYTHONUNBUFFERED": "1", "AGENT_MEMORY_CONFIG": str(self.cache_dir / "no-config.toml"), **self.env})
        cmd = [sys.executable, "-m", "agent_memory", "serve", "--model", self.model, "--port", str(self.port)]
        cmd += ["--cache-dir", str(self.cache_dir), *self.args]
        if "--kv-bits" not in self.args:  # tests compare outputs across cache states: exact at 16
            cmd += ["--kv-bits", "16"]
        self._log = open(self.log_path, "ab")
        self.proc = subprocess.Popen(cmd, stdout=self._log, stderr=subprocess.STDOUT, env=env, cwd=REPO)
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise RuntimeError(f"server exited with {self.proc.returncode}:\n{self.log()}")
            try:
                if httpx.get(self.base_url + "/health", timeout=2).status_code == 200:
                    return self
            except httpx.HTTPError:
                pass
            time.sleep(0.05)  # as InProcessServer: a start is seen within 50 ms
        self.stop()
        raise RuntimeError(f"server not ready after {timeout}s:\n{self.log()}")

    def log(self) -> str:
        return self.log_path.read_text(errors="replace") if self.log_path.exists() else ""

    def stop(self, sig: int = signal.SIGTERM, timeout: float = 60) -> int:
        if self.proc is None:
            return 0
        if self.proc.poll() is None:
            self.proc.send_signal(sig)
            try:
                self.proc.wait(timeout)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        self._log.close()
        code, self.proc = self.proc.returncode, None
        return code

    def kill(self) -> None:
        self.stop(signal.SIGKILL)

    def __enter__(self) -> "Server":
        return self.start()

    def __exit__(self, *exc) -> None:
        self.stop()

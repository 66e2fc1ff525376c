"""The server a launched program talks to: one already running (the given URL, a live server
recorded in the cache folder's model folders, or one on the configured port), else one
started here in the background, logging to a file, and stopped once the program exits."""

from __future__ import annotations

import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import httpx

from agent_memory.memory.warm.folder.paths import model_folders

READY_S = 900.0  # a first `--model demo` fetches the model before it serves
STOP_S = 60.0


class ServerError(Exception):
    """A server launch started did not come up; the message says why and where its log is."""


def answers(url: str) -> bool:
    try:
        return httpx.get(url + "/health", timeout=2.0).status_code == 200
    except httpx.HTTPError:
        return False


def running_servers(cache_dir: Path, host: str, port: int) -> list[str]:
    """Base URLs of servers that answer: those recorded in the cache folder's model folders
    (server.json, while their process lives), then the configured host and port."""
    urls = []
    for folder in model_folders(cache_dir / "kv"):
        record = folder.read_server_json()
        if record is not None and record.url not in urls:
            urls.append(record.url)
    default = f"http://{_client_host(host)}:{port}"
    if default not in urls:
        urls.append(default)
    return [url for url in urls if answers(url)]


def _client_host(host: str) -> str:
    """Where to reach a server bound to `host` from this machine."""
    if host in ("0.0.0.0", "::", ""):
        return "127.0.0.1"
    return f"[{host}]" if ":" in host and not host.startswith("[") else host


class StartedServer:
    """`agent-memory serve` run by launch: its own session, so the terminal's Ctrl-C goes to
    the program only; stopped (SIGTERM, as a user's Ctrl-C would) when the program is done."""

    def __init__(self, models: list[str], cache_dir: Path | None, port: int, log_path: Path) -> None:
        self.url = f"http://127.0.0.1:{port}"
        self.log_path = log_path
        command = [sys.executable, "-m", "agent_memory", "serve", "--host", "127.0.0.1", "--port", str(port)]
        for model in models:
            command += ["--model", model]
        if cache_dir is not None:
            command += ["--cache-dir", str(cache_dir)]
        log_path.parent.mkdir(parents=True, exist_ok=True)
        with open(log_path, "ab") as log:
            self.proc = subprocess.Popen(
                command, stdin=subprocess.DEVNULL, stdout=log, stderr=subprocess.STDOUT, start_new_session=True
            )

    def wait_ready(self) -> None:
        deadline = time.monotonic() + READY_S
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise ServerError(f"the server exited with {self.proc.returncode}:\n{self._tail()}")
            if answers(self.url):
                return
            time.sleep(0.25)
        self.stop()
        raise ServerError(f"the server was not ready after {READY_S:.0f} s (its log: {self.log_path})")

    def stop(self) -> int:
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(STOP_S)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        return self.proc.returncode

    def _tail(self, lines: int = 20) -> str:
        text = self.log_path.read_text(errors="replace").splitlines()[-lines:]
        return "\n".join(text) + f"\n(the whole log: {self.log_path})"


def free_port(preferred: int) -> int:
    """`preferred` if nothing listens there, else one the system picks."""
    for port in (preferred, 0):
        with socket.socket() as s:
            try:
                s.bind(("127.0.0.1", port))
            except OSError:
                continue
            return s.getsockname()[1]
    raise ServerError("no free port on 127.0.0.1")

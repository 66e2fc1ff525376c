"""`mlx.launch --backend ring -n 2 … agent-memory serve` on 127.0.0.1, as the tests of a model
split over processes start it (tests/test_distributed_start.py, test_distributed_serve.py): the
ranks' interleaved log, rank 0's /health and pid, its stop by SIGTERM (the launcher then stops
the others; it exits 0 itself even when a rank failed, so tests read rank 0's status and log);
`Pair`, a split server stopped and launched again on its folders next to a one-process reference."""

from __future__ import annotations

import os
import re
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import httpx

from tests.support.server import REPO, Serving, free_port

LAUNCH = Path(sys.executable).with_name("mlx.launch")


def free_ring(avoid: int) -> int:
    """A port whose next one is free too (rank 0 listens on it, rank 1 on the next), neither of
    them `avoid` (the API's port)."""
    while True:
        with socket.socket() as first, socket.socket() as second:
            first.bind(("127.0.0.1", 0))
            port = first.getsockname()[1]
            if avoid in (port, port + 1):
                continue
            try:
                second.bind(("127.0.0.1", port + 1))
            except OSError:  # taken: another pair
                continue
        return port


class Launched(Serving):
    """`mlx.launch --backend ring -n 2 … agent-memory serve` on loopback; its interleaved log."""

    def __init__(self, model: Path | tuple[Path, Path], cache_dir: Path, *args: str) -> None:
        """`model`: one for every rank, or rank 0's and rank 1's."""
        self.port = free_port()
        cache_dir.mkdir(parents=True, exist_ok=True)
        self.log_path = cache_dir / f"launch-{self.port}.log"
        ring = free_ring(avoid=self.port)  # rank r listens on ring + r
        cmd = [str(LAUNCH), "--backend", "ring", "-n", "2", "-p", str(ring), "--env", f"PYTHONPATH={REPO}"]
        cmd += ["--env", f"AGENT_MEMORY_CONFIG={cache_dir / 'no-config.toml'}", "--env", "PYTHONUNBUFFERED=1"]
        serve = [sys.executable, "-m", "agent_memory", "serve", "--port", str(self.port)]
        serve += ["--cache-dir", str(cache_dir), "--kv-bits", "16", *args]
        if isinstance(model, tuple):  # each rank its own folder: the launcher gives every rank one command
            pick = f'"$([ "$MLX_RANK" = 1 ] && echo {model[1]} || echo {model[0]})"'
            cmd += ["bash", "-c", f"exec {' '.join(serve)} --model {pick}"]
        else:
            cmd += [*serve, "--model", str(model)]
        env = {k: v for k, v in os.environ.items() if not k.startswith("AGENT_MEMORY_")}
        self._log = open(self.log_path, "ab")
        self.proc = subprocess.Popen(cmd, stdout=self._log, stderr=subprocess.STDOUT, env=env, cwd=REPO)

    def log(self) -> str:
        return self.log_path.read_text(errors="replace")

    def health(self, timeout: float = 180) -> dict:
        """/health once rank 0 serves (the launcher still running)."""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            assert self.proc.poll() is None, f"the launch ended with {self.proc.returncode}:\n{self.log()}"
            try:
                answer = httpx.get(f"http://127.0.0.1:{self.port}/health", timeout=2)
                if answer.status_code == 200:
                    return answer.json()
            except httpx.HTTPError:
                pass
            time.sleep(0.1)
        raise AssertionError(f"not ready after {timeout} s:\n{self.log()}")

    def wait_for(self, pattern: str, timeout: float = 60) -> str:
        """The log once it holds `pattern` (a regex): the ranks write as they go."""
        deadline = time.monotonic() + timeout
        while not re.search(pattern, log := self.log()):
            assert time.monotonic() < deadline and self.proc.poll() is None, f"no {pattern!r} in:\n{log}"
            time.sleep(0.1)
        return log

    def ended(self, timeout: float = 120) -> str:
        """The log once every rank exited."""
        self.proc.wait(timeout)
        self._log.close()
        return self.log()

    def rank_0_pid(self) -> int:
        """Rank 0's process id, from uvicorn's line (a signal to the launcher would orphan the ranks)."""
        return int(re.search(r"rank=0/2 uvicorn\.error: Started server process \[(\d+)\]", self.log())[1])

    def rank_1_pid(self) -> int:
        """Rank 1's process id: the launcher's other child (Linux's /proc)."""
        children = []
        for stat in Path("/proc").glob("[0-9]*/stat"):
            try:
                fields = stat.read_text().rsplit(")", 1)[1].split()  # after the command's name: state, parent, …
            except OSError:  # ended meanwhile
                continue
            if int(fields[1]) == self.proc.pid:
                children.append(int(stat.parent.name))
        (pid,) = [c for c in children if c != self.rank_0_pid()]
        return pid

    def stop(self) -> None:
        if self.proc.poll() is None:
            os.kill(self.rank_0_pid(), signal.SIGTERM)
            try:
                self.proc.wait(60)
            except subprocess.TimeoutExpired:
                self.proc.kill()
        if not self._log.closed:
            self._log.close()


class Pair:
    """A model's two-process server (`split`, launched again on the same folders by `start`) and
    its one-process reference (`one`, an in-process server): the tests of one split share both."""

    def __init__(self, model: Path, folder: Path, args: list[str], one: Serving) -> None:
        self.model, self.folder, self.args, self.one = model, folder, args, one
        self.split = Launched(model, folder, *args)

    def stop(self) -> str:
        """Rank 0 stopped by SIGTERM, and rank 1 with it once told (each flushes its warm
        folder first): their log."""
        os.kill(self.split.rank_0_pid(), signal.SIGTERM)
        log = self.split.ended()
        assert "rank=1/2 agent_memory.engine.distributed.follower: rank 0 stopped: stopping" in log, log
        return log

    def start(self) -> Launched:
        """Both ranks launched again on their folders, once serving."""
        self.split = Launched(self.model, self.folder, *self.args)
        self.split.health()
        return self.split

    def serving(self) -> Launched:
        """The split, launched again if a test left it stopped."""
        return self.split if self.split.proc.poll() is None else self.start()

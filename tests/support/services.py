"""Real Redis and HAProxy processes for the scale-out tests: Debian's redis-server and haproxy,
each on a free loopback port (never Redis' default 6379), stopped by the fixture that started
them. Tests that need one skip, saying how to install it, where it is not installed."""

from __future__ import annotations

import importlib.util
import shutil
import subprocess
import time
from pathlib import Path

import pytest

from tests.support.server import REPO, free_port


def haproxy_config():
    """scripts/haproxy_config.py as a module (scripts/ is no package)."""
    spec = importlib.util.spec_from_file_location("haproxy_config", REPO / "scripts/haproxy_config.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def need(binary: str, package: str) -> str:
    path = shutil.which(binary) or (f"/usr/sbin/{binary}" if Path(f"/usr/sbin/{binary}").exists() else None)
    if path is None:
        pytest.skip(f"{binary} is not installed (Debian: apt-get install {package}; scripts/test installs it as root)")
    return path


def stop_process(proc: subprocess.Popen | None) -> bool:
    """SIGTERM, then SIGKILL after 10 s; whether there was a running process to stop."""
    if proc is None or proc.poll() is not None:
        return False
    proc.terminate()
    try:
        proc.wait(10)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait()
    return True


class RedisServer:
    """redis-server with no persistence, bounded like production (volatile-lru)."""

    def __init__(self, folder: Path, maxmemory: str = "256mb", *args: str) -> None:
        self.binary = need("redis-server", "redis-server")
        self.folder = folder
        self.port = free_port()
        self.args = ["--maxmemory", maxmemory, "--maxmemory-policy", "volatile-lru", *args]
        self.proc: subprocess.Popen | None = None

    @property
    def url(self) -> str:
        return f"redis://127.0.0.1:{self.port}/0"

    def start(self) -> RedisServer:
        self.folder.mkdir(parents=True, exist_ok=True)
        cmd = [self.binary, "--port", str(self.port), "--bind", "127.0.0.1", "--save", "", "--appendonly", "no"]
        cmd += ["--dir", str(self.folder), "--logfile", str(self.folder / "redis.log"), *self.args]
        self.proc = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.STDOUT)
        client = self.client()
        deadline = time.monotonic() + 20
        while True:
            try:
                client.ping()
                return self
            except Exception:
                if self.proc.poll() is not None or time.monotonic() > deadline:
                    raise RuntimeError(f"redis-server did not start: {(self.folder / 'redis.log').read_text()}")
                time.sleep(0.05)

    def client(self):
        import redis

        return redis.Redis.from_url(self.url)

    def stop(self) -> None:
        stop_process(self.proc)
        self.proc = None

    def __enter__(self) -> RedisServer:
        return self.start()

    def __exit__(self, *exc) -> None:
        self.stop()


class HAProxy:
    """haproxy on the repo's config (docs/scale-out/haproxy.cfg), rendered for these servers."""

    def __init__(self, folder: Path, servers: list[str]) -> None:
        self.binary = need("haproxy", "haproxy")
        self.folder = folder
        self.port = free_port()
        self.stats_port = free_port()
        self.servers = servers
        self.proc: subprocess.Popen | None = None

    @property
    def base_url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def start(self) -> HAProxy:
        render = haproxy_config().render
        self.folder.mkdir(parents=True, exist_ok=True)
        cfg = self.folder / "haproxy.cfg"
        cfg.write_text(
            render(
                self.servers,
                bind=f"127.0.0.1:{self.port}",
                stats=f"127.0.0.1:{self.stats_port}",
                admin_socket=str(self.folder / "admin.sock"),
                maxconn=256,  # HAProxy needs ~2 open files per connection; a test machine may allow few
            )
        )
        check = subprocess.run([self.binary, "-c", "-f", str(cfg)], capture_output=True, text=True)
        assert check.returncode == 0, check.stdout + check.stderr
        self.log = open(self.folder / "haproxy.log", "ab")
        self.proc = subprocess.Popen([self.binary, "-W", "-f", str(cfg)], stdout=self.log, stderr=subprocess.STDOUT)
        import httpx

        deadline = time.monotonic() + 20
        while time.monotonic() < deadline:
            try:
                if httpx.get(f"http://127.0.0.1:{self.stats_port}/stats", timeout=1).status_code == 200:
                    return self
            except httpx.HTTPError:
                time.sleep(0.05)
        raise RuntimeError("haproxy did not start")

    def stop(self) -> None:
        if stop_process(self.proc):
            self.log.close()
        self.proc = None

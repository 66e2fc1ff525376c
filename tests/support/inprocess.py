"""The real server in the test process: `serve`'s own app (cli/serve.py `build_app`: real
BatchEngines on the real model, the same flags parsed the same way) run by uvicorn on a thread
on a free loopback port. The same HTTP as a `Server` process, without a process's start (the
imports alone take seconds): what every test that is not about the process itself (signals,
restarts, flags refused at start, the CLI) is served by. Its log lines (the `agent_memory` and
uvicorn loggers while it runs) go to a file, as a process's output does."""

from __future__ import annotations

import logging
import threading
import time
from pathlib import Path

import httpx
import typer

from tests.support.server import Serving, free_port

LOG_FORMAT = "%(asctime)s %(levelname)s %(name)s: %(message)s"  # cli/serve.py's text format


class InProcessServer(Serving):
    """`agent-memory serve MODEL --cache-dir CACHE_DIR ARGS` on a thread of this process."""

    def __init__(self, model: Path | str, cache_dir: Path, *args: str, log: Path | None = None) -> None:
        self.model, self.cache_dir, self.args = str(model), cache_dir, list(args)
        self.port = free_port()
        self.log_path = log or cache_dir / f"server-{self.port}.log"  # elsewhere where the folder is a full disk
        self._uvicorn = None
        self._thread: threading.Thread | None = None
        self._handler: logging.Handler | None = None
        self.app = None  # once started: the served app (its `state.server`: the models and their engines)

    def _settings(self):
        from agent_memory.cli import app
        from agent_memory.config import load_settings

        args = ["--model", self.model, "--port", str(self.port), "--cache-dir", str(self.cache_dir), *self.args]
        if "--kv-bits" not in self.args:  # tests compare outputs across cache states: exact at 16
            args += ["--kv-bits", "16"]
        flags = typer.main.get_command(app).commands["serve"].make_context("serve", args).params
        settings = load_settings(**flags)
        settings.check_serve()
        return settings

    def start(self, timeout: float = 180) -> "InProcessServer":
        import uvicorn

        from agent_memory.cli.serve import build_app

        self.cache_dir.mkdir(parents=True, exist_ok=True)
        settings = self._settings()
        self._handler = logging.FileHandler(self.log_path, encoding="utf-8")
        self._handler.setFormatter(logging.Formatter(LOG_FORMAT))
        for name in ("agent_memory", "uvicorn"):
            logging.getLogger(name).addHandler(self._handler)
            logging.getLogger(name).setLevel(settings.log_level.upper())
        failed = threading.Event()

        def on_load_failure() -> None:
            failed.set()
            self._uvicorn.should_exit = True

        try:
            app = self.app = build_app(settings, on_load_failure)
        except Exception:
            self.stop()  # its log handler off: a refused start leaves nothing behind
            raise
        config = uvicorn.Config(
            app, host="127.0.0.1", port=self.port, log_config=None, access_log=False, timeout_graceful_shutdown=30
        )
        self._uvicorn = uvicorn.Server(config)
        self._thread = threading.Thread(target=self._uvicorn.run, name=f"uvicorn-{self.port}", daemon=True)
        self._thread.start()
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if failed.is_set() or not self._thread.is_alive():
                self.stop()
                raise RuntimeError(f"in-process server ended:\n{self.log()}")
            try:
                if httpx.get(self.base_url + "/health", timeout=2).status_code == 200:
                    return self
            except httpx.HTTPError:
                pass
            time.sleep(0.05)
        self.stop()
        raise RuntimeError(f"in-process server not ready after {timeout}s:\n{self.log()}")

    def log(self) -> str:
        return self.log_path.read_text(errors="replace") if self.log_path.exists() else ""

    def stop(self, timeout: float = 60) -> None:
        """uvicorn's graceful exit: the app's lifespan stops its engines (their writes flushed)."""
        if self._thread is not None:
            self._uvicorn.should_exit = True
            self._thread.join(timeout)
            assert not self._thread.is_alive(), f"the in-process server on {self.port} did not stop in {timeout}s"
            self._thread = None
        if self._handler is not None:
            for name in ("agent_memory", "uvicorn"):
                logging.getLogger(name).removeHandler(self._handler)
            self._handler.close()
            self._handler = None

    def __enter__(self) -> "InProcessServer":
        return self.start()

    def __exit__(self, *exc) -> None:
        self.stop()


def refused_start(model: Path | str, cache_dir: Path, *args: str) -> str:
    """Why `agent-memory serve MODEL ARGS` does not start, as the line it prints after "error: "
    says it: the same settings check, app build and first load as the process, in this one (a
    process's own exit status and output: tests/test_several_models.py). A start fails the test."""
    from agent_memory.api.sealing import SealKeyError
    from agent_memory.config import ConfigError

    server = InProcessServer(model, cache_dir, *args)
    try:
        server.start()
    except (ConfigError, SealKeyError, RuntimeError) as e:  # RuntimeError: ModelError, or a failed first load
        return str(e)
    server.stop()
    raise AssertionError(f"the server started with {args}")

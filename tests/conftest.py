"""Shared fixtures: the tiny model (built once per session) and real server processes."""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path
from typing import Literal

import httpx
import openai
import pytest

os.environ["HF_HUB_OFFLINE"] = "1"
os.environ["TOKENIZERS_PARALLELISM"] = "false"

REPO = Path(__file__).resolve().parent.parent


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class Server:
    """`agent-memory serve` as a child process on a free loopback port."""

    def __init__(
        self, model: Path | str, cache_dir: Path, *args: str, log: Path | None = None, env: dict | None = None
    ) -> None:
        self.model, self.cache_dir, self.args, self.env = str(model), cache_dir, list(args), env or {}
        self.port = free_port()
        self.log_path = log or cache_dir / f"server-{self.port}.log"
        self.proc: subprocess.Popen | None = None

    @property
    def base_url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

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
            time.sleep(0.2)
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

    def client(self, **kw) -> openai.OpenAI:
        return openai.OpenAI(base_url=self.base_url + "/v1", api_key=kw.pop("api_key", "unused"), max_retries=0, **kw)

    def async_client(self, **kw) -> openai.AsyncOpenAI:
        return openai.AsyncOpenAI(
            base_url=self.base_url + "/v1", api_key=kw.pop("api_key", "unused"), max_retries=0, **kw
        )

    def http(self) -> httpx.Client:
        return httpx.Client(base_url=self.base_url, timeout=120)

    def __enter__(self) -> "Server":
        return self.start()

    def __exit__(self, *exc) -> None:
        self.stop()


@pytest.fixture(scope="session")
def tiny_model(tmp_path_factory) -> Path:
    from agent_memory.models.tiny import build_tiny

    return build_tiny(tmp_path_factory.mktemp("models") / "tiny")


@pytest.fixture(scope="session")
def tiny_embedding(tmp_path_factory) -> Path:
    """A tiny Qwen3-Embedding-like model (models/tiny_embedding.py)."""
    from agent_memory.models.tiny_embedding import build_tiny_embedding

    return build_tiny_embedding(tmp_path_factory.mktemp("models") / "qwen3-embedding")


@pytest.fixture(scope="module")
def server(tiny_model, tmp_path_factory):
    with Server(tiny_model, tmp_path_factory.mktemp("cache")) as s:
        yield s


@pytest.fixture
def client(server) -> openai.OpenAI:
    return server.client()


def chat(client: openai.OpenAI, content: str, max_tokens: int = 24, **kw):
    kw.setdefault("temperature", 0)
    kw.setdefault("model", "tiny")
    return client.chat.completions.create(messages=[{"role": "user", "content": content}], max_tokens=max_tokens, **kw)


def ask(client, messages, agent, max_tokens=12):
    """One greedy chat turn of `agent` (None: anonymous)."""
    extra = {"prompt_cache_key": agent} if agent else {}
    return client.chat.completions.create(
        model="tiny", messages=messages, max_tokens=max_tokens, temperature=0, extra_body=extra
    )


def tiers(response) -> tuple[int, int]:
    """(hot_tokens, warm_tokens) of a response's usage."""
    d = response.usage.prompt_tokens_details
    return d.model_extra["hot_tokens"], d.model_extra["warm_tokens"]


def weather_agent(model, max_tokens: int, **agent_kw):
    """An OpenAI Agents SDK agent with one function tool and a required first call (the tests
    of both the chat-completions and the Responses model run it); returns it and the cities
    its tool was called with."""
    from agents import Agent, ModelSettings, function_tool, set_tracing_disabled

    set_tracing_disabled(True)
    seen: list[str] = []

    @function_tool
    def get_weather(city: Literal["Paris", "Oslo", "Lima"]) -> str:
        """The forecast for a city."""
        seen.append(city)
        return f"Sunny in {city}."

    agent = Agent(
        name="forecaster",
        instructions="Answer weather questions with the get_weather tool.",
        tools=[get_weather],
        model=model,
        model_settings=ModelSettings(tool_choice="required", max_tokens=max_tokens, temperature=0),
        **agent_kw,
    )
    return agent, seen

"""Shared fixtures: the tiny models (built once per session) and the module's server, served in
this process (tests/support/inprocess.py). Helpers live in tests/support/; test modules import
from there, never from each other."""

from __future__ import annotations

import os
from pathlib import Path

import openai
import pytest

from tests.support.inprocess import InProcessServer

os.environ["HF_HUB_OFFLINE"] = "1"
os.environ["TOKENIZERS_PARALLELISM"] = "false"
# Neither the developer's environment nor their config file reaches a server of the tests (a
# `Server` process strips them itself; an in-process one reads this process's environment).
for _name in [n for n in os.environ if n.startswith("AGENT_MEMORY_")]:
    del os.environ[_name]
os.environ["AGENT_MEMORY_CONFIG"] = str(Path(__file__).parent / "no-config.toml")


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
    """The tiny model served for one module (its agents and metrics its own), in this process."""
    with InProcessServer(tiny_model, tmp_path_factory.mktemp("cache")) as s:
        yield s


@pytest.fixture
def client(server) -> openai.OpenAI:
    return server.client()

"""The `cache` command line run in the test's process (typer's CliRunner): what a test of the
commands' logic needs, without a process start. Its commands reach a running server through the
folder's server.json, as from a shell."""

from __future__ import annotations

import json
from pathlib import Path

from click.testing import Result
from typer.testing import CliRunner

from agent_memory.cli.cache.commands import cache_app


def cache_cli(cache_dir: Path, *args: str, env: dict | None = None) -> Result:
    """`agent-memory cache ARGS --cache-dir CACHE_DIR` with no settings but `env` (conftest: no
    user config file, no AGENT_MEMORY_ variables): its `exit_code`, `stdout`, `stderr`."""
    env = {"AGENT_MEMORY_CONFIG": str(cache_dir / "no-config.toml"), **(env or {})}
    return CliRunner().invoke(cache_app, [*args, "--cache-dir", str(cache_dir)], env=env)


def cache_json(cache_dir: Path, *args: str) -> dict:
    """`agent-memory cache ARGS --format json`: its JSON (it must succeed)."""
    result = cache_cli(cache_dir, *args, "--format", "json")
    assert result.exit_code == 0, result.output
    return json.loads(result.stdout)

"""The `cache` command line run in the test's process (typer's CliRunner): what a test of the
commands' logic needs, without a process start. Its commands reach a running server through the
folder's server.json, as from a shell."""

from __future__ import annotations

import json
from pathlib import Path

from typer.testing import CliRunner

from agent_memory.cli.cache.commands import cache_app


def cache_json(cache_dir: Path, *args: str) -> dict:
    """`agent-memory cache ARGS --cache-dir CACHE_DIR --format json`: its JSON (it must succeed)."""
    result = CliRunner().invoke(
        cache_app,
        [*args, "--cache-dir", str(cache_dir), "--format", "json"],
        env={"AGENT_MEMORY_CONFIG": str(cache_dir / "no-config.toml")},
    )
    assert result.exit_code == 0, result.output
    return json.loads(result.stdout)

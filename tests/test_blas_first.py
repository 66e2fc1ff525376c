"""Every module that imports MLX (mlx or mlx_lm, which imports mlx.core) at its top imports
agent_memory.blas before it: the first MLX import in a process decides whether CPU matmuls run on
OpenBLAS or on the wheel's reference BLAS, tens of times slower (agent_memory/blas.py). A module
that forgot it once made the whole server slow without failing anything."""

from __future__ import annotations

import ast
import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = pytest.mark.process
PACKAGE = Path(__file__).resolve().parent.parent / "agent_memory"


def _imported(node: ast.stmt) -> list[str]:
    if isinstance(node, ast.Import):
        return [alias.name for alias in node.names]
    if isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
        return [node.module] + [f"{node.module}.{alias.name}" for alias in node.names]
    return []


def test_every_module_importing_mlx_loads_openblas_first():
    late = []
    for path in sorted(PACKAGE.rglob("*.py")):
        blas_seen = path.name == "blas.py"
        for node in ast.parse(path.read_text(encoding="utf-8")).body:
            names = _imported(node)
            if any(n == "agent_memory.blas" for n in names):
                blas_seen = True
            elif not blas_seen and any(n.split(".")[0] in ("mlx", "mlx_lm") for n in names):
                late.append(f"{path.relative_to(PACKAGE.parent)}:{node.lineno}")
    assert late == []


def test_the_server_command_loads_openblas():
    """What `agent-memory serve` imports before it starts, in a fresh interpreter."""
    code = (
        "import agent_memory.cli.serve, agent_memory.api.app, agent_memory.engine.engine\n"
        "from agent_memory import blas\n"
        "import ctypes.util\n"
        "print(blas.OPENBLAS_LOADED or blas.sys.platform != 'linux' or ctypes.util.find_library('openblas') is None)"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "True", out.stderr

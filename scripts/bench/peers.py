"""The servers bench_agents compares, by name: ours (this checkout, a --baseline worktree or a
--variant's flags: an OursCode), mlx-lm's server and vllm-mlx (its own venv, made here on first
use; its log read for the cached tokens its API does not report)."""

from __future__ import annotations

import re
import shlex
import shutil
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

from bench.server import REPO

SERVERS = ("ours", "mlx-lm", "vllm-mlx")
BASE = "base"  # --baseline: our server at an older commit


@dataclass(frozen=True)
class OursCode:
    """Our server as one of the compared ones: the checkout it runs from and its extra flags
    (this checkout and --ours-args for "ours"; a worktree of --baseline; a --variant's flags)."""

    folder: Path
    args: str
PEERS = ("mlx-lm", "vllm-mlx")
ALIASES = {"peer": "mlx-lm", "mlx_lm": "mlx-lm", "vllm": "vllm-mlx", "vllm_mlx": "vllm-mlx"}

VLLM_MLX = "vllm-mlx==0.6.0"
# Its server's own imports on Linux CPU; `--no-deps` keeps out torch, torchvision, gradio, opencv.
VLLM_MLX_DEPS = ["mlx[cpu]", "mlx-lm>=0.31.3,<0.32", "fastapi", "uvicorn", "python-multipart", "psutil",
                 "jsonschema", "requests", "tabulate", "pillow", "pytz", "transformers"]
VLLM_MLX_VENV = REPO / ".venv-peers" / "vllm-mlx"


def vllm_mlx_setup_line(venv: Path = VLLM_MLX_VENV) -> str:
    pip = f"{venv}/bin/pip install -q"
    return (f"python3.11 -m venv {venv} && {pip} --no-deps {VLLM_MLX} && "
            f"{pip} {' '.join(shlex.quote(d) for d in VLLM_MLX_DEPS)}")


def ensure_vllm_mlx(venv: Path, install: bool = True) -> Path:
    """The vllm-mlx executable in its own venv; the venv is made here on first use (the
    project's .venv is never touched)."""
    exe = venv / "bin" / "vllm-mlx"
    if exe.exists():
        return exe
    if not install:
        raise SystemExit(f"vllm-mlx is not installed at {venv}; create it with:\n  {vllm_mlx_setup_line(venv)}")
    print(f"vllm-mlx is not installed: creating its own venv at {venv} — pip install --no-deps {VLLM_MLX}, "
          f"then {', '.join(VLLM_MLX_DEPS)} (no torch; the project's .venv is not changed). "
          f"One time, a few minutes.", flush=True)
    base = getattr(sys, "_base_executable", None) or sys.executable
    pip = [str(venv / "bin" / "python"), "-m", "pip", "install", "-q", "--disable-pip-version-check"]
    try:
        subprocess.run([base, "-m", "venv", str(venv)], check=True)
        subprocess.run(pip + ["--no-deps", VLLM_MLX], check=True)
        subprocess.run(pip + VLLM_MLX_DEPS, check=True)
    except (OSError, subprocess.CalledProcessError) as e:
        shutil.rmtree(venv, ignore_errors=True)
        raise SystemExit(f"could not install vllm-mlx ({e}); by hand:\n  {vllm_mlx_setup_line(venv)}") from e
    print(f"vllm-mlx installed in {venv}", flush=True)
    return exe



def vllm_log_fetches(log: Path) -> list[tuple[int, int]]:
    """(prompt tokens, cached tokens) of each request, from vllm-mlx's own log: its
    `[cache_fetch]` lines (RAM prefix cache) and `[ssd_promote]` lines (its SSD tier). Its API
    reports no cached tokens."""
    try:
        text = log.read_text(errors="replace")
    except OSError:
        return []
    found: dict[str, list[int]] = {}
    for m in re.finditer(r"\[cache_fetch\] request=(\S+) (HIT|MISS) prompt_tokens=(\d+)(?: cached=(\d+))?", text):
        found[m.group(1)] = [int(m.group(3)), int(m.group(4) or 0) if m.group(2) == "HIT" else 0]
    for m in re.finditer(r"\[ssd_promote\] request=(\S+) .*?promote: (\d+)/(\d+) tokens from SSD", text):
        if m.group(1) in found:
            found[m.group(1)][1] = int(m.group(2))
    return [(p, c) for p, c in found.values()]


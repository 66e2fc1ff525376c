"""How each compared server is started (its command line and environment) on a ServerProcess:
ours from the checkout its OursCode names (this one; a clean git worktree of --baseline, run as
"base"), with --trace-file when traced; mlx-lm's server and vllm-mlx with Debian's OpenBLAS
preloaded; vllm-mlx with a HOME of its own per cache folder."""

from __future__ import annotations

import argparse
import shlex
import subprocess
import sys
from pathlib import Path

from bench.peers import BASE, OursCode, ensure_vllm_mlx
from bench.processes import find_openblas
from bench.server import REPO, ServerProcess, offline_env


class BenchServer:
    """One of the compared servers on its cache folder: `process` runs it, restartable; `traces`
    are the trace files of our server's starts (when traced)."""

    def __init__(self, kind: str, model: str, cache_dir: Path, log_dir: Path, args: argparse.Namespace,
                 trace: bool = False) -> None:
        self.kind, self.model, self.cache_dir, self.log_dir = kind, model, cache_dir, log_dir
        self.opts = args
        self.trace = trace
        self.traces: list[Path] = []
        self.code: OursCode | None = args.ours_like.get(kind)  # None: a peer
        self.process = ServerProcess(f"{kind}-{cache_dir.name}", self.command, self.env(), log_dir,
                                     cwd=self.code.folder if self.code else REPO)

    def command(self, port: int) -> list[str]:
        if self.code:
            serve = ["--model", self.model, "--port", str(port), "--cache-dir", str(self.cache_dir)]
            serve += shlex.split(self.code.args)
            if self.trace:  # the server's own trace of its engine (engine/observability/trace.py)
                path = self.log_dir / f"{self.cache_dir.name}-trace-start{self.process.starts}.jsonl"
                self.traces.append(path)
                serve += ["--trace-file", str(path)]
            return shlex.split(self.opts.ours_cmd) + serve
        if self.kind == "mlx-lm":
            cmd = shlex.split(self.opts.peer_cmd) + ["--model", self.model, "--port", str(port), "--temp", "0",
                                                     "--log-level", "WARNING"]
            return cmd + shlex.split(self.opts.peer_args)
        exe = ensure_vllm_mlx(self.opts.vllm_venv, install=not self.opts.no_install)
        # Prefix cache: on by default (memory-aware, 20 % of RAM); said anyway, for the reader.
        cmd = [str(exe), "serve", self.model, "--host", "127.0.0.1", "--port", str(port),
               "--served-model-name", Path(self.model).name, "--continuous-batching", "--enable-prefix-cache",
               "--ssd-cache-dir", str(self.cache_dir / "ssd")]
        return cmd + shlex.split(self.opts.vllm_args)

    def env(self) -> dict[str, str]:
        env = offline_env()
        if self.code:
            # The checkout whose code runs (default this one): a clean worktree of a commit keeps
            # a measurement still while others edit this one.
            env["PYTHONPATH"] = ":".join(filter(None, [str(self.code.folder), env.get("PYTHONPATH")]))
            env["BENCH_OURS_DIR"] = str(self.code.folder)
        else:
            lib = find_openblas()
            if lib:
                env["LD_PRELOAD"] = ":".join(filter(None, [lib, env.get("LD_PRELOAD")]))
            else:
                print(f"warning: libopenblas.so.0 not found; {self.kind} will use MLX's slow reference BLAS",
                      file=sys.stderr)
        if self.kind == "vllm-mlx":
            # It saves its RAM prefix cache under ~/.cache/vllm-mlx on SIGTERM and loads it at
            # start: a HOME of its own per cache folder, so runs never see each other's.
            home = self.cache_dir / "home"
            home.mkdir(parents=True, exist_ok=True)
            env["HOME"] = str(home)
            env.pop("XDG_CACHE_HOME", None)
        return env

    def start(self, timeout: float = 300) -> None:
        self.cache_dir.mkdir(parents=True, exist_ok=True)
        self.process.start(timeout)

    def stop(self, mode: str = "graceful") -> int | None:
        return self.process.stop(mode)


def add_baseline(args, work_dir: Path) -> Path | None:
    """A clean worktree of --baseline in the work dir (or the folder given), run as "base"."""
    if not args.baseline:
        return None
    folder = Path(args.baseline)
    made = None
    if not (folder / "agent_memory").is_dir():
        made = work_dir / f"baseline-{args.baseline}"
        subprocess.run(["git", "-C", str(REPO), "worktree", "add", "--detach", str(made), args.baseline],
                       check=True, capture_output=True)
        folder = made
    args.ours_like[BASE] = OursCode(folder, args.ours_args)
    return made


def drop_baseline(made: Path | None) -> None:
    if made is not None:
        subprocess.run(["git", "-C", str(REPO), "worktree", "remove", "--force", str(made)], capture_output=True)



def code_version(args) -> str | None:
    """Our server's commit, and whether its checkout has uncommitted changes under agent_memory/."""
    try:
        d = str(args.ours_dir)
        head = subprocess.run(["git", "-C", d, "rev-parse", "--short", "HEAD"], capture_output=True, text=True,
                              timeout=10).stdout.strip()
        dirty = subprocess.run(["git", "-C", d, "status", "--porcelain", "--", "agent_memory"], capture_output=True,
                               text=True, timeout=10).stdout.strip()
        return f"{head}{' + uncommitted changes' if dirty else ''}" if head else None
    except (OSError, subprocess.SubprocessError):
        return None

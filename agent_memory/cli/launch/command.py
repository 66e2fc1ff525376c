"""`agent-memory launch PROGRAM [-- ARGS]`: run a coding agent against this server, found
running or started for the run (server.py), with the settings its table entry gives
(node_programs.py, python_programs.py), or show them (`--print`) or write them into the
user's own config files (`--write-config`)."""

from __future__ import annotations

import os
import shlex
import shutil
import signal
import subprocess
from pathlib import Path

import typer

from agent_memory.cli.common import CacheDirOption, console, fail, settings
from agent_memory.cli.launch.config_files import ConfigFileError, write_user_file
from agent_memory.cli.launch.node_programs import ClaudeCode, Codex, OpenCode, QwenCode
from agent_memory.cli.launch.programs import Program
from agent_memory.cli.launch.python_programs import Aider, Llm
from agent_memory.cli.launch.server import ServerError, StartedServer, free_port, running_servers
from agent_memory.cli.launch.target import Target, TargetError, read_target
from agent_memory.config import Settings
from agent_memory.files import write_atomic

PROGRAMS: dict[str, Program] = {p.name: p for p in (ClaudeCode(), Codex(), OpenCode(), QwenCode(), Aider(), Llm())}


def launch(
    program: str = typer.Argument(..., help=f"The program: {', '.join(PROGRAMS)}."),
    args: list[str] = typer.Argument(None, help="The program's own arguments, after --."),
    base_url: str | None = typer.Option(
        None, "--base-url", help="A running server's URL (default: a running one, else one started for the run)."
    ),
    model: str | None = typer.Option(
        None, "--model", help="The model: as `serve --model` takes it for a server started, else a served model's id."
    ),
    api_key: str | None = typer.Option(None, "--api-key", help="The server's key (default: the settings' api_key)."),
    print_only: bool = typer.Option(False, "--print", help="Show the environment and config to copy; run nothing."),
    write_config: bool = typer.Option(
        False, "--write-config", help="Write the settings into the program's own config files (diff shown, .bak kept)."
    ),
    cache_dir: Path | None = CacheDirOption,
) -> None:
    """Run a coding agent (claude, codex, opencode, qwen, aider, llm) against this server."""
    chosen = PROGRAMS.get(program)
    if chosen is None:
        fail(f"unknown program {program!r}; one of: {', '.join(PROGRAMS)}", code=2)
    if print_only and write_config:
        fail("--print and --write-config: one or the other", code=2)
    config = settings(cache_dir)
    key = api_key or (config.api_key.get_secret_value() if config.api_key else None)
    binary = shutil.which(chosen.binary)
    if binary is None and not (print_only or write_config):
        fail(f"{chosen.binary} is not installed (not found on PATH); install it with: {chosen.install}")
    started = None
    try:
        target, started = _target(base_url, model, key, config, cache_dir)
        if print_only:
            _print(chosen, target)
        elif write_config:
            _write(chosen, target)
        else:
            raise typer.Exit(_run(chosen, target, binary, args or [], config.cache_dir / "launch" / chosen.name))
    finally:
        if started is not None:
            started.stop()


def _target(
    base_url: str | None, model: str | None, key: str | None, config: Settings, cache_dir: Path | None
) -> tuple[Target, StartedServer | None]:
    """The model to point the program at, on the given server, a running one, or one started."""
    ids = _ids(model)
    try:
        if base_url is not None:
            url = base_url.rstrip("/").removesuffix("/v1")
            return _read(url, key, ids), None
        for url in running_servers(config.cache_dir, config.host, config.port):
            try:
                return _read(url, key, ids), None
            except TargetError:
                continue  # another model's server
    except TargetError as e:
        fail(e)
    port = free_port(config.port)
    started = StartedServer([model] if model else [], cache_dir, port, config.cache_dir / "launch" / "server.log")
    console.print(f"starting agent-memory serve on port {port} (its log: {started.log_path}) ...")
    try:
        started.wait_ready()
        return read_target(started.url, key), started
    except (ServerError, TargetError) as e:
        started.stop()
        fail(e)


def _ids(model: str | None) -> list[str | None]:
    """The ids a served model named by `--model` may be listed under (NAME=…: NAME; a folder: its name)."""
    if model is None:
        return [None]
    name, sep, _ = model.partition("=")
    return [name] if sep else list(dict.fromkeys([model, Path(model).name]))


def _read(url: str, key: str | None, ids: list[str | None]) -> Target:
    for i in ids[:-1]:
        try:
            return read_target(url, key, i)
        except TargetError:
            continue
    return read_target(url, key, ids[-1])


def _print(program: Program, target: Target) -> None:
    """What a user copies to run the program by hand: stdout, plain text."""
    lines = [f"# {program.name} against {target.base_url}: model {target.model}, context {target.context} tokens, "
             f"output limit {target.output}"]
    env = program.user_env(target)
    if env:
        lines += ["", "# the environment"] + [f"export {k}={shlex.quote(v)}" for k, v in env.items()]
    for file in program.user_files(target):
        lines += ["", f"# {file.path}", file.fragment.rstrip("\n")]
    lines += ["", "# then run", program.by_hand(target)]
    typer.echo("\n".join(lines))


def _write(program: Program, target: Target) -> None:
    for file in program.user_files(target):
        try:
            written = write_user_file(file)
        except (ConfigFileError, OSError) as e:
            fail(e)
        if not written.diff:
            console.print(f"{written.path}: already set")
            continue
        typer.echo(written.diff, nl=False)
        kept = f" (the old one kept as {written.backup})" if written.backup else ""
        console.print(f"wrote {written.path}{kept}")
    exports = " ".join(f"{k}={shlex.quote(v)}" for k, v in program.user_env(target).items())
    console.print(f"run it by hand with: {exports + ' ' if exports else ''}{program.by_hand(target)}")


def _run(program: Program, target: Target, binary: str | None, args: list[str], folder: Path) -> int:
    problem = program.missing(target)
    if problem:
        fail(f"{problem}: run `agent-memory launch {program.name} --write-config` once to add it (a diff is "
             "shown, a backup kept), or `--print` to see it")
    folder.mkdir(parents=True, exist_ok=True, mode=0o700)
    launch = program.launch(target, folder)
    for path, text in launch.files.items():
        write_atomic(path, [text.encode()])
    console.print(f"{program.name} → {target.base_url}, model {target.model} ({target.context} tokens of context)")
    proc = subprocess.Popen([binary, *launch.args, *args], env={**os.environ, **launch.env})
    # The terminal's Ctrl-C reaches the program itself (launch waits for it to end); a
    # SIGTERM or a closed terminal is passed on to it.
    def pass_on(signum, _frame) -> None:
        if signum != signal.SIGINT:
            proc.send_signal(signum)

    previous = {s: signal.signal(s, pass_on) for s in (signal.SIGINT, signal.SIGTERM, signal.SIGHUP)}
    try:
        return proc.wait()
    finally:
        for s, handler in previous.items():
            signal.signal(s, handler)

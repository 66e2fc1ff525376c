"""What `--model` names: a model folder, `demo` (fetched on first use) or `tiny` (built).

Nothing here reaches a model hub: a name that is not one of ours must be an existing folder,
since mlx-lm would otherwise try to download it.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

from agent_memory.models.gguf import Progress


class ModelError(RuntimeError):
    """The model cannot be found, fetched or built; the message says what to do."""


@dataclass
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


def resolve_model(spec: str, models_dir: Path, progress: Progress | None = None) -> Path:
    if spec == "demo":
        from agent_memory.models.demo import fetch_demo

        return fetch_demo(models_dir, progress=progress)
    if spec == "tiny":
        from agent_memory.models.tiny import build_tiny

        return build_tiny(models_dir / "tiny", progress=progress)
    folder = Path(spec).expanduser()
    if not complete(folder):
        raise ModelError(
            f"{spec!r} is not a model folder (no config.json there); pass a local MLX model "
            "folder, 'demo' or 'tiny'"
        )
    return folder.resolve()


def list_models(models_dir: Path) -> list[ModelInfo]:
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

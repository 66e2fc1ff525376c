"""What `--model` names: a model folder, a hub id already on this machine (hub.py), `demo`
(fetched on first use) or `tiny` (built).

Nothing here reaches a model hub: a name that is not one of ours must be an existing folder
(or a folder in the models directory) or a hub id found locally, since mlx-lm would otherwise
try to download it.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

from agent_memory.models.folders import ModelNotFoundError, complete
from agent_memory.models.hub import find_local, hub_cache, is_hub_id, local_repos

if TYPE_CHECKING:  # gguf imports MLX, which `models ls` does not need
    from agent_memory.models.gguf import Progress


@dataclass(frozen=True)
class ModelInfo:
    name: str  # what `--model` takes: a folder name of the cache folder, or a hub id
    path: Path
    size_bytes: int
    model_type: str
    num_layers: int
    weights: str  # "float", or the quantization ("4-bit")


@dataclass(frozen=True)
class ModelSpec:
    """One `--model`: what names the model, and the extra name it is served as (`NAME=MODEL`)."""

    spec: str
    alias: str | None = None

    @classmethod
    def parse(cls, text: str) -> ModelSpec:
        """`small=./qwen3-0.6b` → alias `small`; a folder whose own name holds `=` is taken whole."""
        name, sep, spec = text.partition("=")
        if sep and ALIAS.match(name) and spec and not Path(text).expanduser().exists():
            return cls(spec, name)
        return cls(text)


ALIAS = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._:-]{0,63}$")


def resolve_model(spec: str, models_dir: Path, progress: Progress | None = None) -> Path:
    """The folder to load for `spec`; builds or fetches ours on first use."""
    if spec == "demo":
        from agent_memory.models.demo import fetch_demo

        return fetch_demo(models_dir, progress=progress)
    if spec == "tiny":
        from agent_memory.models.tiny import SERVING_CONTEXT, build_tiny

        config = {"max_position_embeddings": SERVING_CONTEXT}
        return build_tiny(models_dir / "tiny", config=config, progress=progress)
    for folder in (Path(spec).expanduser(), models_dir / spec):
        if complete(folder):
            return folder.resolve()
    if is_hub_id(spec):
        found = find_local(spec)
        if found is not None:
            return found
        raise ModelNotFoundError(
            f"{spec!r} is not on this machine: not in the Hugging Face cache ({hub_cache()}) nor in LM "
            f"Studio's models folder. Download it with `agent-memory models fetch {spec}` (or `hf download "
            f"{spec}`), then serve it again"
        )
    raise ModelNotFoundError(
        f"{spec!r} is not a model folder (no config.json there, nor in {models_dir}); pass a local "
        "MLX model folder, a hub id already downloaded (owner/name), 'demo' (SmolLM2-135M-Instruct, "
        "fetched from PyPI) or 'tiny' (a test model)"
    )


def served_name(spec: str, path: Path) -> str:
    """The id a model is served under: the hub id it was named by, else its folder's name."""
    return spec if is_hub_id(spec) and not complete(Path(spec).expanduser()) else path.name


def list_models(models_dir: Path) -> list[ModelInfo]:
    """The whole model folders on this machine: the cache folder's by name, then the hub
    cache's and LM Studio's by hub id."""
    folders = [(f.name, f) for f in sorted(models_dir.iterdir()) if complete(f)] if models_dir.is_dir() else []
    folders += [(repo.repo_id, repo.path) for repo in local_repos()]
    return [_info(name, folder) for name, folder in folders]


def _info(name: str, folder: Path) -> ModelInfo:
    config = json.loads((folder / "config.json").read_text())
    text = config.get("text_config") or config
    bits = (config.get("quantization") or {}).get("bits")
    return ModelInfo(
        name=name,
        path=folder,
        size_bytes=sum(f.stat().st_size for f in folder.iterdir() if f.is_file()),
        model_type=config.get("model_type", "?"),
        num_layers=text.get("num_hidden_layers", 0),
        weights=f"{bits}-bit" if bits else "float",
    )

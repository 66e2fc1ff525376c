"""Models by the names users know: a hub id (`mlx-community/Qwen3-8B-4bit`) found where mlx-lm,
`hf download` and LM Studio have already put it, with no network: the local Hugging Face cache
(`HF_HUB_CACHE`, else `HF_HOME/hub`, else `~/.cache/huggingface/hub`) or LM Studio's models
folder (`~/.lmstudio/models`, or the older `~/.cache/lm-studio/models`). Downloading is the
user's explicit step: `agent-memory models fetch REPO_ID` (through huggingface_hub, which
honours `HF_HUB_OFFLINE` and `HF_TOKEN`); `serve` never downloads.
"""

from __future__ import annotations

import os
import re
from dataclasses import dataclass
from pathlib import Path

HUB_ID = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.-]*/[A-Za-z0-9][A-Za-z0-9_.-]*$")
# What a model folder needs to load with mlx-lm; nothing else of a repository is fetched.
MODEL_FILES = ["*.json", "*.safetensors", "*.jinja", "tokenizer.model", "*.tiktoken", "*.txt"]


def is_hub_id(spec: str) -> bool:
    """`owner/name`, as the hub spells repositories (a path that exists is a path)."""
    return bool(HUB_ID.match(spec)) and not Path(spec).expanduser().exists()


def hub_cache() -> Path:
    """The Hugging Face cache as the environment names it when asked (huggingface_hub reads it
    once, at its import): HF_HUB_CACHE, else HF_HOME/hub, else ~/.cache/huggingface/hub."""
    if cache := os.environ.get("HF_HUB_CACHE") or os.environ.get("HUGGINGFACE_HUB_CACHE"):
        return Path(cache).expanduser()
    home = os.environ.get("HF_HOME") or os.path.join(os.environ.get("XDG_CACHE_HOME", "~/.cache"), "huggingface")
    return Path(home).expanduser() / "hub"


def lmstudio_roots() -> list[Path]:
    home = Path.home()
    return [home / ".lmstudio" / "models", home / ".cache" / "lm-studio" / "models"]


def _loadable(folder: Path) -> bool:
    return (folder / "config.json").is_file() and any(folder.glob("*.safetensors"))


def find_local(repo_id: str) -> Path | None:
    """The model's folder on this machine: the Hugging Face cache's snapshot of its current
    revision, else LM Studio's copy; None when neither has a whole one."""
    return _cached_snapshot(repo_id) or next(
        (root / repo_id for root in lmstudio_roots() if _loadable(root / repo_id)), None
    )


def _cached_snapshot(repo_id: str) -> Path | None:
    from huggingface_hub import snapshot_download
    from huggingface_hub.errors import LocalEntryNotFoundError

    try:
        snapshot = Path(snapshot_download(repo_id, local_files_only=True, cache_dir=hub_cache()))
    except (LocalEntryNotFoundError, ValueError, OSError):
        return None
    return snapshot if _loadable(snapshot) else None


def download(repo_id: str) -> Path:
    """Fetch the model's files into the Hugging Face cache (huggingface_hub shows progress)."""
    from huggingface_hub import snapshot_download

    return Path(snapshot_download(repo_id, allow_patterns=MODEL_FILES, cache_dir=hub_cache()))


@dataclass(frozen=True)
class LocalRepo:
    repo_id: str
    path: Path
    source: str  # "huggingface" or "lm-studio"


def local_repos() -> list[LocalRepo]:
    """Every loadable model repository already on this machine, hub cache then LM Studio."""
    from huggingface_hub import scan_cache_dir
    from huggingface_hub.errors import CacheNotFound

    found: list[LocalRepo] = []
    try:
        cache = scan_cache_dir(hub_cache())
    except (CacheNotFound, OSError):
        cache = None
    for repo in sorted(cache.repos, key=lambda r: r.repo_id) if cache is not None else []:
        if repo.repo_type != "model":
            continue
        path = _cached_snapshot(repo.repo_id)
        if path is not None:
            found.append(LocalRepo(repo.repo_id, path, "huggingface"))
    for root in lmstudio_roots():
        for folder in sorted(root.glob("*/*")) if root.is_dir() else []:
            if _loadable(folder):
                found.append(LocalRepo(f"{folder.parent.name}/{folder.name}", folder, "lm-studio"))
    return found

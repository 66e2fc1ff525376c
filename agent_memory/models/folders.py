"""What a finished model folder is, and the errors of getting one: shared by the ways a model
arrives (demo.py fetches, tiny.py builds, registry.py resolves), so none imports another."""

from __future__ import annotations

import shutil
import tempfile
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path


class ModelError(RuntimeError):
    """The model cannot be had; the message says what to do."""


class ModelNotFoundError(ModelError):
    """`--model` names no model folder."""


class ModelFetchError(ModelError):
    """The demo model could not be downloaded or converted."""


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


@contextmanager
def building(target: Path) -> Iterator[Path]:
    """An empty folder to build a model in, beside `target` (one file system), moved into place
    whole when the block ends without an error; the temporary folder is removed either way."""
    target.parent.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(dir=target.parent, prefix=f".{target.name}-") as tmp:
        work = Path(tmp) / "model"
        work.mkdir()
        yield work
        move_into_place(work, target)

"""A model folder's weights files as files: what they take once loaded, and whether they can be
loaded at all (a safetensors header read and checked, never the weights)."""

from __future__ import annotations

import functools
import json
import os
from pathlib import Path

MAX_HEADER_BYTES = 100 << 20  # the safetensors format's own limit on a header
MiB = 1 << 20


def weights_file_bytes(path: Path) -> int:
    """What the model's weights take once loaded: MLX maps its safetensors as they are."""
    return sum(f.stat().st_size for f in path.glob("*.safetensors"))


def weights_damage(path: Path) -> str | None:
    """Why the model folder's weights files cannot be loaded, in plain words, or None: each
    safetensors file's header read and its tensors' byte ranges checked against the file's size
    (a few KiB read per file, never the weights), which is what an interrupted download or copy,
    or a file overwritten, breaks."""
    files = sorted(path.glob("*.safetensors"))
    if not files:
        return "its folder holds no weights file (*.safetensors)"
    try:  # the headers are read again only when a file changed: /health asks on the event loop
        signature = tuple((str(f), f.stat().st_mtime_ns, f.stat().st_size) for f in files)
    except OSError as e:
        return f"its weights files cannot be read ({e.strerror or e})"
    return _damage_of(signature)


@functools.lru_cache(maxsize=64)
def _damage_of(signature: tuple[tuple[str, int, int], ...]) -> str | None:
    for name, _, _ in signature:
        file = Path(name)
        if why := _safetensors_damage(file):
            return f"its weights file {file.name} {why}"
    return None


def _safetensors_damage(file: Path) -> str | None:
    """What is wrong with one safetensors file (the words after its name), or None."""
    unreadable = "is damaged: its header is unreadable (overwritten, or not a safetensors file)"
    try:
        with open(file, "rb") as f:
            size = os.fstat(f.fileno()).st_size
            if size < 8:
                return _incomplete(size, 8)
            length = int.from_bytes(f.read(8), "little")
            if not 2 <= length <= MAX_HEADER_BYTES:
                return unreadable
            if 8 + length > size:
                return _incomplete(size, 8 + length)
            header = json.loads(f.read(length))
    except OSError as e:
        return f"cannot be read ({e.strerror or e})"
    except (ValueError, RecursionError):  # not JSON, not UTF-8, or nested past the parser's depth
        return unreadable
    if not isinstance(header, dict):
        return unreadable
    ranges = [t.get("data_offsets") if isinstance(t, dict) else None for k, t in header.items() if k != "__metadata__"]
    if any(not _is_range(r) for r in ranges):
        return unreadable
    needed = 8 + length + max((r[1] for r in ranges), default=0)
    return _incomplete(size, needed) if needed > size else None


def _incomplete(size: int, needed: int) -> str:
    def amount(n: int) -> str:
        return f"{n / MiB:.1f} MiB" if n >= MiB else f"{n} bytes"

    return f"is incomplete: {amount(size)} of the {amount(needed)} it should hold (an interrupted download or copy?)"


def _is_range(r: object) -> bool:
    return isinstance(r, list) and len(r) == 2 and all(isinstance(i, int) for i in r) and 0 <= r[0] <= r[1]

"""What a warm tier held at one moment: its block files, its manifests (good and bad), and
what else lies there. A model folder's scan (folder/paths.py) sorts each entry it lists here; a
shared Redis namespace's (redis/folder.py) fills its blocks and manifests. A server restores
from one; the `cache` commands read and tidy from one."""

from __future__ import annotations

import os
import stat
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

from agent_memory.files import TEMP_SUFFIX
from agent_memory.memory.warm.format.records import HASH_RE, Manifest


STRAY_KINDS = ((stat.S_ISREG, "file"), (stat.S_ISLNK, "link"), (stat.S_ISFIFO, "FIFO"), (stat.S_ISDIR, "folder"))


@dataclass(frozen=True)
class FileInfo:
    path: Path
    size: int
    mtime: float

    @classmethod
    def of(cls, entry: os.DirEntry, st: os.stat_result) -> FileInfo:
        return cls(Path(entry.path), st.st_size, st.st_mtime)


@dataclass
class FolderScan:
    """What one model folder held at one moment."""

    blocks: dict[str, FileInfo] = field(default_factory=dict)  # block hash -> its file
    manifests: list[Manifest] = field(default_factory=list)
    bad_manifests: list[tuple[Path, str]] = field(default_factory=list)
    temp_files: list[FileInfo] = field(default_factory=list)  # leftovers of interrupted writes
    stray_files: list[FileInfo] = field(default_factory=list)  # anything the server did not write
    quarantined: list[FileInfo] = field(default_factory=list)
    # Real folders and regular files (never links) that others may read: (path, the mode they
    # should have). The scan only reports them; the server's start makes them private.
    loose: list[tuple[Path, int]] = field(default_factory=list)

    def strays_counted(self) -> str:
        """The stray files counted by kind, for the start's log: `3 entries (2 links, 1 FIFO)`."""
        kinds = dict.fromkeys([*(kind for _, kind in STRAY_KINDS), "other"], 0)
        for info in self.stray_files:
            try:
                mode = os.lstat(info.path).st_mode
            except OSError:
                continue  # gone since the scan
            kinds[next((kind for test, kind in STRAY_KINDS if test(mode)), "other")] += 1
        counted = ", ".join(f"{n} {kind}{'s' if n > 1 else ''}" for kind, n in kinds.items() if n)
        total = sum(kinds.values())
        return f"{total} entr{'y' if total == 1 else 'ies'} ({counted})"

    def note_mode(self, path: Path, st: os.stat_result) -> None:
        want = 0o700 if stat.S_ISDIR(st.st_mode) else 0o600
        if (stat.S_ISDIR(st.st_mode) or stat.S_ISREG(st.st_mode)) and stat.S_IMODE(st.st_mode) != want:
            self.loose.append((path, want))

    def add_block_entry(self, sub: str, entry: os.DirEntry, st: os.stat_result) -> None:
        """An entry of blocks/<sub>/: a block file named by its hash, a temp file, or stray."""
        self.note_mode(Path(entry.path), st)
        name = entry.name
        if not stat.S_ISREG(st.st_mode):
            self.stray_files.append(FileInfo.of(entry, st))
        elif name.endswith(TEMP_SUFFIX):
            self.temp_files.append(FileInfo.of(entry, st))
        elif name.endswith(".safetensors") and HASH_RE.match(name[:-12]) and name[:2] == sub:
            self.blocks[name[:-12]] = FileInfo.of(entry, st)
        elif not name.startswith("."):
            self.stray_files.append(FileInfo.of(entry, st))

    def add_agent_entry(self, entry: os.DirEntry, st: os.stat_result, owns: Callable[[str], bool]) -> None:
        """An entry of agents/: a manifest, read and checked (one `owns` refuses is a bad one),
        a temp file, or stray."""
        path = Path(entry.path)
        self.note_mode(path, st)
        if not stat.S_ISREG(st.st_mode):
            self.stray_files.append(FileInfo.of(entry, st))
        elif entry.name.endswith(TEMP_SUFFIX):
            self.temp_files.append(FileInfo.of(entry, st))
        elif path.suffix == ".json":
            try:
                manifest = Manifest.read(path)
                if not owns(manifest.fingerprint):
                    raise ValueError("manifest of another model")
                self.manifests.append(manifest)
            except FileNotFoundError:
                return
            except (OSError, ValueError, RecursionError) as e:
                self.bad_manifests.append((path, str(e) or type(e).__name__))
        elif not entry.name.startswith("."):
            self.stray_files.append(FileInfo.of(entry, st))

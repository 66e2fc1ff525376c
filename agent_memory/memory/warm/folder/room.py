"""How much a model folder's disk can hold: the file system as statvfs sees it, and the
warm tier's reserve on it. The disk budget (10 GiB by default) is capped at start to what the
folder already holds plus the free space, less a reserve (5 % of the disk, at most 1 GiB, at
least two block files), counting files as the file system allocates them. The tier therefore
never fills a disk by itself; on a disk that is already full it gives the reserve back from its
own least valuable blocks (they become COLD and are recomputed when needed; no agent is lost).
"""

from __future__ import annotations

import math
import os
from dataclasses import dataclass
from pathlib import Path

RESERVE_FRACTION = 0.05  # of the disk, kept free by the warm tier
RESERVE_MAX_BYTES = 1 << 30


@dataclass(frozen=True)
class DiskRoom:
    """The file system holding a folder, as statvfs sees it."""

    total: int
    free: int  # what an unprivileged process may still write
    unit: int  # allocation unit: a file takes whole ones
    read_only: bool

    def allocated(self, file_bytes: int) -> int:
        """What a file of this size takes: whole allocation units."""
        return max(1, math.ceil(file_bytes / self.unit)) * self.unit

    def reserve(self, file_bytes: int) -> int:
        """Kept free: 5 % of the disk, at most 1 GiB, but at least two block files (a write
        lands before the eviction it causes, and manifests are not counted in the budget)."""
        return max(min(int(self.total * RESERVE_FRACTION), RESERVE_MAX_BYTES), 2 * self.allocated(file_bytes))

    def cap(self, held: int, file_bytes: int) -> int:
        """Bytes of block files a folder holding `held` may hold here, keeping the reserve free."""
        spare = self.free - self.reserve(file_bytes)
        return max(0, held + int(spare * file_bytes / self.allocated(file_bytes)))


def disk_room(path: Path) -> DiskRoom | None:
    """statvfs of the nearest existing folder on the way to `path`; None if it cannot be asked."""
    for p in (path, *path.parents):
        try:
            st = os.statvfs(p)
        except (FileNotFoundError, NotADirectoryError):
            continue
        except OSError:
            return None
        unit = st.f_frsize or st.f_bsize or 4096
        read_only = bool(st.f_flag & getattr(os, "ST_RDONLY", 1))
        return DiskRoom(st.f_blocks * unit, st.f_bavail * unit, unit, read_only)
    return None


def mib(n: int) -> str:
    return f"{n / (1 << 20):.1f} MiB"


def room_text(room: DiskRoom | None) -> str:
    return "free space unknown" if room is None else f"{mib(room.free)} free of {mib(room.total)}"

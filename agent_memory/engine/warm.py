"""Open the warm tier for the loaded model: its folder under the cache dir, named by model,
fingerprint and disk precision, or that name's namespace in a Redis several servers share
(`--warm-store redis://...`, memory/redis_store.py). A disk that cannot hold it (read-only,
full, not a folder) means serving without it, said in the log and on /health, never a failed
start; a Redis that does not answer yet means misses until it does.

The disk budget (10 GiB by default) is capped at start to what the disk can hold: what the
folder already holds plus the free space, less a reserve (5 % of the disk, at most 1 GiB, at
least two block files), counting files as the file system allocates them. The tier therefore never fills a disk by
itself; on a disk that is already full it gives the reserve back from its own least valuable
blocks (they become COLD and are recomputed when needed; no agent is lost).
"""

from __future__ import annotations

import errno
import logging
import math
import os
import time
from dataclasses import dataclass
from pathlib import Path

from agent_memory.engine import kv
from agent_memory.engine.loader import LoadedModel
from agent_memory.memory.disk import DiskTier
from agent_memory.memory.folder import Folder, FolderScan, entries, folder_name
from agent_memory.memory.records import BLOCK_TOKENS
from agent_memory.memory.redis_store import RedisStore
from agent_memory.precision import KVPrecision, Precisions

log = logging.getLogger(__name__)

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


def open_warm_tier(
    cache_dir: Path | None,
    budget_bytes: int,
    loaded: LoadedModel,
    shape: kv.KVShape,
    precisions: Precisions,
    warm_store: str | None = None,
) -> tuple[DiskTier | None, FolderScan | None, str | None]:
    """(the tier, what its folder held, why there is none). The tier's `budget_bytes` is the
    effective disk budget: the configured one, or less where the disk cannot hold it. With a
    Redis `warm_store`, Redis' maxmemory bounds the tier instead, for every server at once."""
    if (cache_dir is None and warm_store is None) or budget_bytes <= 0:
        return None, None, None
    precision = precisions.disk
    name = folder_name(loaded.name, loaded.fingerprint, precision.tag)
    if warm_store is not None:
        disk = _tier(RedisStore(warm_store, name), loaded, shape, precision)
        scan = disk.open()
        log.info("warm tier: namespace %s in the shared store %s (agents are read when they return)", name, disk.location)
        return disk, scan, None
    kv_dir = cache_dir / "kv"
    same_model = name.rsplit("-", 1)[0] + "-"
    others = sorted(e.name for e, _ in entries(kv_dir) if e.name.startswith(same_model) and e.name != name)
    if others:
        log.warning(
            "this model's KV is also cached at other precisions (%s); they are not used at %s: "
            "serve with their --disk-kv-bits to use them, or remove them with `agent-memory cache`",
            ", ".join(others),
            precision.tag,
        )
    room = disk_room(kv_dir / name)
    if room is not None and room.read_only:
        # Not even reads: an agent ended here could not be deleted there, and would come back.
        return _without(f"the cache folder {kv_dir} is on a read-only file system")
    disk = _tier(Folder(kv_dir / name), loaded, shape, precision)
    file_bytes = disk.block_bytes(BLOCK_TOKENS)
    try:
        scan = disk.open()
    except OSError as e:
        if e.errno == errno.ENOSPC:
            return _without(f"the disk holding {kv_dir} is full ({_room_text(room)})")
        if e.errno in (errno.EROFS,):
            return _without(f"the cache folder {kv_dir} is on a read-only file system")
        where = f"{e.filename}: " if e.filename else ""
        return _without(f"the cache folder {kv_dir} cannot be used ({where}{e.strerror or e})")
    disk.budget_bytes = budget_bytes
    room = disk_room(disk.folder.root) or room  # again: open() may have written model.json
    if room is not None:
        held = sum(info.size for info in scan.blocks.values())
        cap = room.cap(held, file_bytes)
        if cap < file_bytes:
            disk.close()
            return _without(
                f"the disk holding {kv_dir} is full ({_room_text(room)}; the warm tier keeps "
                f"{mib(room.reserve(file_bytes))} free and its folder holds {mib(held)})"
            )
        if cap < budget_bytes:
            disk.budget_bytes = cap
            disk.budget_note = (
                f"the disk holding {disk.folder.root} has {_room_text(room)}: the disk budget is capped at "
                f"{mib(cap)} (of {mib(budget_bytes)} asked) to keep {mib(room.reserve(file_bytes))} free"
            )
            if cap < held:
                disk.budget_note += f"; {mib(held - cap)} of cached blocks are given back"
            log.warning("warm tier: %s", disk.budget_note)
    return disk, scan, None


def _tier(store, loaded: LoadedModel, shape: kv.KVShape, precision: KVPrecision) -> DiskTier:
    return DiskTier(
        store,
        fingerprint=loaded.fingerprint,
        meta=precision.file_meta(),
        name=loaded.name,
        block_tokens=BLOCK_TOKENS,
        block_layout=lambda n: kv.block_layout(n, shape, precision),
    )


def _room_text(room: DiskRoom | None) -> str:
    return "free space unknown" if room is None else f"{mib(room.free)} free of {mib(room.total)}"


def _without(reason: str) -> tuple[None, None, str]:
    log.warning("serving without the warm tier: %s", reason)
    return None, None, reason


def warm_health(disk: DiskTier | None, why_off: str | None, budget_bytes: int) -> dict:
    """/health's `warm_tier`: on, degraded (capped by its disk, or writes failing: why), or off (why)."""
    if disk is None:
        return {"status": "off", "reason": why_off or "no disk budget or cache folder"}
    if disk.shared:
        return _shared_health(disk)
    health = {
        "status": "on",
        "folder": str(disk.folder.root),
        "budget_bytes": budget_bytes,
        "failed_writes": disk.failed_jobs,
    }
    if disk.write_error is not None:
        since = time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(disk.write_error_since or time.time()))
        health.update(status="degraded", reason=f"{disk.write_error} (since {since}); requests are served from memory")
    elif disk.budget_note is not None:
        health.update(status="degraded", reason=disk.budget_note)
    return health


def _shared_health(disk: DiskTier) -> dict:
    """A shared store's figures as the writer last read them (never read here: /health runs on
    the event loop): Redis' memory against its maxmemory, and its eviction policy."""
    usage = disk.usage
    health = {
        "status": "on",
        "store": disk.location,
        "shared": True,
        "budget_bytes": usage.limit_bytes or 0,
        "used_bytes": usage.used_bytes,
        "policy": usage.policy,
        "failed_writes": disk.failed_jobs,
    }
    if disk.write_error is not None:
        since = time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(disk.write_error_since or time.time()))
        health.update(status="degraded", reason=f"{disk.write_error} (since {since}); requests are served from memory")
    elif usage.used_bytes is None and usage.note:
        health.update(status="degraded", reason=usage.note)
    elif usage.note:
        health["note"] = usage.note
    return health

"""Where the warm tier lives, opened at start: a model folder under the cache dir, named by
model, fingerprint and disk precision, or that name's namespace in a Redis several servers
share (`--warm-store redis://...`, redis/backend.py). A disk that cannot hold it (read-only,
full, not a folder) means serving without it, said in the log and on /health, never a failed
start; a Redis that does not answer yet means misses until it does. A folder's disk budget is
capped to what its disk can hold (folder/room.py).
"""

from __future__ import annotations

import errno
import logging
from collections.abc import Callable
from pathlib import Path

from agent_memory.files import entries
from agent_memory.memory.warm.backend import WarmBackend
from agent_memory.memory.warm.folder.paths import FOLDER_RE, Folder
from agent_memory.memory.warm.format.records import BLOCK_TOKENS
from agent_memory.memory.warm.redis.backend import RedisBackend
from agent_memory.memory.warm.folder.room import DiskRoom, disk_room, mib, room_text
from agent_memory.memory.warm.scan import FolderScan
from agent_memory.memory.warm.shards import describe
from agent_memory.memory.warm.tier import WarmTier

log = logging.getLogger(__name__)

Opened = tuple[WarmTier | None, FolderScan | None, str | None]  # the tier, what it held, why there is none


def open_tier(
    make_tier: Callable[[WarmBackend | Folder], WarmTier],
    name: str,
    cache_dir: Path | None,
    budget_bytes: int,
    warm_store: str | None = None,
) -> Opened:
    """(the tier, what its folder held, why there is none), for the folder or namespace `name`;
    `make_tier(backend)` makes the model's tier over a backend. The tier's `budget_bytes` is
    the effective disk budget: the configured one, or less where the disk cannot hold it. With
    a Redis `warm_store`, Redis' maxmemory bounds the tier instead, for every server at once."""
    if (cache_dir is None and warm_store is None) or budget_bytes <= 0:
        return None, None, None
    if warm_store is not None:
        tier = make_tier(RedisBackend(warm_store, name))
        scan = tier.open()
        where = tier.location
        log.info("warm tier: namespace %s in the shared store %s (agents are read when they return)", name, where)
        return tier, scan, None
    kv_dir = cache_dir / "kv"
    _say_other_folders(kv_dir, name)
    room = disk_room(kv_dir / name)
    if room is not None and room.read_only:
        # Not even reads: an agent ended here could not be deleted there, and would come back.
        return _without("the cache folder is on a read-only file system", kv_dir)
    tier = make_tier(Folder(kv_dir / name))
    file_bytes = tier.file_bytes(tier.block_layout(BLOCK_TOKENS))
    try:
        scan = tier.open()
    except OSError as e:
        if e.errno == errno.ENOSPC:
            return _without(f"the cache folder's disk is full ({room_text(room)})", kv_dir)
        if e.errno in (errno.EROFS,):
            return _without("the cache folder is on a read-only file system", kv_dir)
        return _without(f"the cache folder cannot be used ({e.strerror or e})", e.filename or kv_dir)
    tier.budget_bytes = budget_bytes
    room = disk_room(tier.folder.root) or room  # again: open() may have written model.json
    if room is not None:
        held = sum(info.size for info in scan.blocks.values())
        if (full := _cap(tier, room, held, file_bytes)) is not None:
            tier.close()
            return _without(f"the cache folder's disk is full ({full})", kv_dir)
    return tier, scan, None


def _cap(tier: WarmTier, room: DiskRoom, held: int, file_bytes: int) -> str | None:
    """Cap the tier's budget to what its disk can hold besides the reserve; why not one block
    fits, if so (a full disk)."""
    cap = room.cap(held, file_bytes)
    if cap < file_bytes:
        reserve = mib(room.reserve(file_bytes))
        return f"{room_text(room)}; the warm tier keeps {reserve} free and its folder holds {mib(held)}"
    if cap < tier.budget_bytes:
        asked, tier.budget_bytes = tier.budget_bytes, cap
        tier.budget_note = (
            f"the cache folder's disk has {room_text(room)}: the disk budget is capped at "
            f"{mib(cap)} (of {mib(asked)} asked) to keep {mib(room.reserve(file_bytes))} free"
        )
        if cap < held:
            tier.budget_note += f"; {mib(held - cap)} of cached blocks are given back"
        log.warning("warm tier %s: %s", tier.folder.root, tier.budget_note)
    return None


def _say_other_folders(kv_dir: Path, name: str) -> None:
    """Warn of this model's folders at other disk precisions: they are not used at this one;
    nor are those of another split over processes (shards.py), said once by rank 0."""
    if (mine := FOLDER_RE.match(name)) is None:
        return
    folders = [(e.name, FOLDER_RE.match(e.name)) for e, _ in entries(kv_dir)]
    same = [(n, m) for n, m in folders if m and (m["model"], m["fp"]) == (mine["model"], mine["fp"])]
    split, rank = _split_of(mine["shard"])
    layouts = sorted(n for n, m in same if m["tag"] == mine["tag"] and _split_of(m["shard"])[0] != split)
    if layouts and rank == 0:
        log.warning(
            "kv/%s: memory of %s; this server is %s: not reused (it starts cold there)",
            ", ".join(layouts), describe(FOLDER_RE.match(layouts[0])["shard"]), describe(mine["shard"]),
        )
    others = sorted({n.rsplit("-", 1)[0] if m["shard"] else n for n, m in same if m["tag"] != mine["tag"]})
    if others:
        log.warning(
            "this model's KV is also cached at other precisions (%s); they are not used at %s: "
            "serve with their --disk-kv-bits to use them, or remove them with `agent-memory cache`",
            ", ".join(others),
            mine["tag"],
        )


def _split_of(shard: str | None) -> tuple[str, int]:
    """A folder's split without its rank, and the rank: ("tp2", 1); ("", 0) for one process."""
    if not shard:
        return "", 0
    split, rank = shard.split("r")
    return split, int(rank)


def _without(reason: str, where: Path | str) -> Opened:
    """No tier, and why: the reason for /health, which names no path; the log says where."""
    log.warning("serving without the warm tier: %s (%s)", reason, where)
    return None, None, reason

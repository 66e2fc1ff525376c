"""Manifests moved, at start, from the names older versions gave them to agent_file_stem's.

Before, a shared-namespace agent's manifest was named by a hash of its bare id, and any other
by a hash of `tenant NUL id NUL kind`: the shared id "alice\\0victim\\0agent" named tenant alice's
agent "victim" (agent_key.py). Every key now has the three-field name. A manifest still under
its key's legacy name (Manifest.parse accepts it) is moved to its name once, at the start of
the server that owns the folder (or of the first server on a shared namespace), said in one log
line; format/records.py's parse and the `cache` commands read either name meanwhile.
"""

from __future__ import annotations

import logging

from agent_memory.agent_key import agent_file_stem, legacy_file_stem
from agent_memory.memory.warm.folder.paths import Folder
from agent_memory.memory.warm.format.records import Manifest
from agent_memory.memory.warm.redis.keys import MOVE_MANIFEST, SCAN_COUNT, RedisNamespace
from agent_memory.memory.warm.scan import FolderScan

log = logging.getLogger(__name__)

STEMS_VERSION = b"2"  # a shared namespace's manifests all have agent_file_stem's names


def is_legacy(manifest: Manifest, stem: str) -> bool:
    """Whether the manifest is stored under the name an older version gave its key."""
    return stem == legacy_file_stem(manifest.key) != agent_file_stem(manifest.key)


def move_folder_manifests(folder: Folder, scan: FolderScan) -> int:
    """Rename each legacy-named manifest of the scan to its name (the scan follows), and return
    how many moved. Where its name holds the same agent's manifest already (a newer version ran
    on the folder, then an older one), the one used last stays. Longer ids first: a legacy name
    that is another key's name is a longer id's (`\\0` id `\\0agent`), so it is out of the way first."""
    movers = sorted((m for m in scan.manifests if m.path and is_legacy(m, m.path.stem)), key=lambda m: -len(m.key.id))
    by_path = {m.path: m for m in scan.manifests}
    moved = 0
    for manifest in movers:
        target = folder.agent_path(manifest.key)
        there = by_path.get(target)
        if there is not None and there.key != manifest.key:  # a longer id's that could not move
            continue
        try:
            if there is not None and there.last_used >= manifest.last_used:
                folder.unlink(manifest.path)
                scan.manifests.remove(manifest)
                continue
            folder.rename(manifest.path, target)
        except (OSError, ValueError) as e:  # read as it is: it moves at a later start
            log.warning("could not move the manifest %s to %s (%s)", manifest.path.name, target.name, e)
            continue
        if there is not None:
            scan.manifests.remove(there)
        del by_path[manifest.path]
        manifest.path, by_path[target] = target, manifest
        moved += 1
    if moved:
        log.info("migrated %d agent records to their new names in %s (shared-namespace agents)", moved, folder.agents)
    return moved


def move_redis_manifests(ns: RedisNamespace) -> int:
    """The same for a shared namespace, once (its `stems` key then says so): each legacy-named
    manifest renamed under MOVE_MANIFEST's compare-and-set, or, where its name is taken
    already, dropped. Servers of an older version still writing to the namespace write legacy
    names this no longer reads: upgrade the servers of one namespace together."""
    client = ns.client
    if client.get(ns.stems_key) == STEMS_VERSION:
        return 0
    move = ns.script(MOVE_MANIFEST)
    moved = 0
    for name in client.scan_iter(match=ns.manifest_pattern, count=SCAN_COUNT):
        name = name.decode()
        etag, data = client.hmget(name, ["etag", "data"])
        try:
            manifest = ns.parse_manifest(name, data) if etag is not None and data is not None else None
        except (ValueError, RecursionError):
            continue  # unreadable: left as it is, like any unreadable manifest
        if manifest is not None and is_legacy(manifest, name.rsplit(":", 1)[1]):
            moved += int(move(keys=[name, ns.manifest_key(manifest.key), ns.refs_key], args=[etag]) == 1)
    client.set(ns.stems_key, STEMS_VERSION)
    if moved:
        log.info("migrated %d agent records to their new names in %s (shared-namespace agents)", moved, ns.location)
    return moved

"""Which model folders (or shared Redis namespaces) the `cache` commands look at, and how they
find one agent in them and describe it. What a folder holds and means is the warm tier's own
view (memory/warm/admin/model_folder.py)."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

from agent_memory.agent_key import AGENT, UNNAMED, AgentKey, key_label, shown_id
from agent_memory.cli.cache.rows import AgentRow
from agent_memory.cli.cache.server import LiveServer
from agent_memory.cli.common import fail, settings
from agent_memory.config import Settings
from agent_memory.memory.hashing import covering
from agent_memory.memory.warm.folder.paths import Folder, model_folders, model_names
from agent_memory.memory.warm.admin.model_folder import ModelFolder
from agent_memory.memory.warm.format.records import Manifest, stems_of
from agent_memory.memory.warm.redis.folder import RedisFolder, namespaces
from agent_memory.memory.warm.redis.url import check_url, redact, store_root


def scan_cache(cache_dir: Path, model: str | None, warm_store: str | None = None) -> list[ModelFolder]:
    """Every model folder under <cache-dir>/kv/ (or namespace of a shared `warm_store`), or
    those `--model` names (none: exit 1)."""
    if warm_store is not None:
        try:
            layouts, where = namespaces(warm_store), redact(warm_store)
        except Exception as e:  # noqa: BLE001 - redis' connection errors
            fail(f"the warm store {redact(warm_store)} does not answer ({type(e).__name__}: {e})")
    else:
        layouts, where = model_folders(cache_dir / "kv"), cache_dir / "kv"
    if model is not None:
        chosen = [f for f in layouts if _matches(f, model)]
        if not chosen:
            known = ", ".join(f.name for f in layouts) or "none"
            fail(f"no model folder matches {model!r} in {where} (there: {known})")
        layouts = chosen
    return [ModelFolder.scan(f) for f in layouts]


def open_cache(cache_dir: Path | None, warm_store: str | None, model: str | None) -> tuple[Settings, Path, list[ModelFolder]]:
    """The settings, where the cache is (shown in output) and its model folders: the cache
    folder's, or a shared warm store's (--warm-store, else the setting of that name)."""
    config = settings(cache_dir)
    url = warm_store or config.warm_store
    if url is None:
        return config, config.cache_dir, scan_cache(config.cache_dir, model)
    try:
        check_url(url)
    except ValueError as e:
        fail(f"--warm-store {e}", code=2)
    return config, store_root(url), scan_cache(config.cache_dir, model, url)


def _matches(layout: Folder | RedisFolder, model: str) -> bool:
    return model in model_names(layout.name, layout.read_model_json()[0].get("name"))


def find_agent(folders: list[ModelFolder], agent: str, tenant: str | None = None) -> tuple[ModelFolder, Manifest]:
    """The one manifest of the agent (of `tenant`, if given); exit 1 if none or several."""
    found = locate_agent(folders, agent, tenant)
    if isinstance(found, str):
        fail(found)
    return found


def locate_agent(
    folders: list[ModelFolder], agent: str, tenant: str | None = None
) -> tuple[ModelFolder, Manifest] | str:
    """The one manifest of the agent (of `tenant`, if given), or why there is none; an unnamed
    conversation's by its id with or without its `~`."""
    found = [
        (f, m)
        for f in folders
        for m in f.files.manifests
        if agent in (m.key.id, key_label(m.key)) and tenant in (None, m.key.tenant)
    ]
    if len(found) == 1:
        return found[0]
    if found and len({m.key.tenant for _, m in found}) > 1:
        tenants = ", ".join(sorted(repr(m.key.tenant) for _, m in found))
        return f"agent {shown_id(agent)} exists for several tenants ({tenants}): pass --tenant"
    if found:
        where = ", ".join(f.folder for f, _ in found)
        return f"agent {shown_id(agent)} is cached for several models ({where}): pass --model"
    stems = stems_of(AgentKey(agent, tenant or ""))  # its name, or an older version's (warm/stems.py)
    damaged = [(f, why) for f in folders for p, why in f.files.bad_manifests if p.stem in stems]
    if damaged:
        return f"agent {shown_id(agent)}: its manifest in {damaged[0][0].folder} is unusable ({damaged[0][1]})"
    return (
        f"no agent {shown_id(agent)} on disk here; one a running server holds only in memory so far is in "
        f"`agent-memory cache ls` (where: server) and at the server's GET /v1/agents/{shown_id(agent)}"
    )


def describe_agent(folder: ModelFolder, manifest: Manifest) -> dict:
    """One agent as `show` tells it: each block, on disk or cold, whom it is shared with and the
    images whose tokens it covers (their digests: the manifest's extra keys, never pixels); its
    snapshots (models with window or recurrent layers) by position."""
    blocks = [
        {
            "hash": h,
            "start": start,
            "tokens": count,
            "on_disk": h in folder.files.blocks,
            "bytes": folder.bytes_of([h]),
            "shared_with": folder.users[h] - 1,
            "images": [s.key.hex() for s in covering(manifest.extras, start, start + count)],
        }
        for h, start, count in folder.spans(manifest)
    ]
    images = [{"digest": s.key.hex(), "start": s.start, "end": s.end} for s in manifest.extras]
    on_disk = [b for b in blocks if b["on_disk"]]
    snapshots = [
        {"hash": h, "position": position, "bytes": folder.bytes_of([h])}
        for position, h in manifest.snapshots
        if h in folder.files.blocks
    ]
    totals = {
        "blocks": len(blocks),
        "on_disk": len(on_disk),
        "cold": len(blocks) - len(on_disk),
        "bytes": sum(b["bytes"] for b in on_disk) + sum(s["bytes"] for s in snapshots),
        "private_bytes": folder.bytes_of(folder.private_blocks(manifest)),
    }
    return {
        "id": manifest.key.id,
        "model": folder.name,
        "folder": folder.folder,
        "manifest": str(manifest.path),
        "fingerprint": manifest.fingerprint,
        "tokens": len(manifest.tokens),
        "block_tokens": folder.block_tokens(manifest),
        "last_used": manifest.last_used,
        "blocks": blocks,
        "snapshots": snapshots,
        "images": images,
        "totals": totals,
    }


def agent_rows(folder: ModelFolder, key_of: Callable[[str], str | None]) -> list[AgentRow]:
    """The folder's agents as `ls` lists them: each manifest on disk (stored responses are not
    agents), and, while a server runs on the folder, the agents it holds in memory only so far,
    so that `ls` counts what /v1/agents, /metrics and the dashboard count."""
    rows = [AgentRow.of(folder, m) for m in folder.files.manifests if m.key.kind in (AGENT, UNNAMED)]
    record = folder.layout.read_server_json()
    if record is None:
        return rows
    held = {(a["id"], a.get("kind", AGENT)): a for a in LiveServer(record, key_of, folder.name).agent_list()}
    for row in rows:
        if row.tenant == "" and (row.id, row.kind) in held:
            row.where = "disk+server"
    on_disk = {(row.id, row.kind) for row in rows if row.tenant == ""}
    return rows + [AgentRow.in_server(folder, a) for i, a in held.items() if i not in on_disk]

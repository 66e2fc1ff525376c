"""The `cache` commands' view of the model folders: `Folder.scan()` and model.json, plus what
the commands ask of them (which blocks an agent shares, the block size, per-agent and
per-folder numbers). The listing itself is folder.py's: it follows no link inside a model
folder and opens only regular files."""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterable
from dataclasses import dataclass, field
from functools import cached_property
from pathlib import Path

from agent_memory.agent_key import AgentKey, agent_file_stem
from agent_memory.cli.cache.render import printable
from agent_memory.cli.common import fail, settings
from agent_memory.config import Settings
from agent_memory.memory.warm.folder import FOLDER_RE, Folder, model_folders
from agent_memory.memory.warm.records import BLOCK_TOKENS, BlockRecord, Manifest
from agent_memory.memory.warm.scan import FolderScan


@dataclass
class ModelFolder:
    """One `<model>-<fingerprint>-<precision>` folder as found at one moment: the commands'
    common view of it, so each decides from the same facts."""

    layout: Folder
    meta: dict  # model.json
    meta_error: str | None
    files: FolderScan = field(default_factory=FolderScan)
    token_counts: dict[str, int | None] = field(default_factory=dict)  # block hash -> tokens in its file

    @classmethod
    def scan(cls, layout: Folder) -> ModelFolder:
        found = cls(layout, *layout.read_model_json())
        found.files = layout.scan(found.owns)
        return found

    def rescan(self) -> ModelFolder:
        return ModelFolder.scan(self.layout)

    @property
    def folder(self) -> str:
        return self.layout.name

    @property
    def name(self) -> str:
        name = self.meta.get("name")
        return name if isinstance(name, str) and name else self.folder

    @property
    def fingerprint(self) -> str | None:
        fingerprint = self.meta.get("fingerprint")
        return fingerprint if isinstance(fingerprint, str) and fingerprint else None

    def owns(self, fingerprint: object) -> bool:
        """Whether a manifest or block with this fingerprint belongs in this folder: model.json
        says which model it is; without it the folder name carries the fingerprint's start."""
        if not isinstance(fingerprint, str):
            return False
        if self.fingerprint is not None:
            return fingerprint == self.fingerprint
        parsed = FOLDER_RE.match(self.folder)
        return parsed is None or fingerprint[:12] == parsed["fp"]

    @cached_property
    def users(self) -> Counter[str]:
        """Block hash -> how many manifests name it."""
        return Counter(h for m in self.files.manifests for h in set(m.blocks))

    def bytes_of(self, hashes: Iterable[str]) -> int:
        return sum(self.files.blocks[h].size for h in set(hashes) if h in self.files.blocks)

    def private_blocks(self, manifest: Manifest) -> list[str]:
        """The agent's block files that no other agent names: what removing it frees."""
        return self.blocks_only_of([manifest])

    def blocks_only_of(self, manifests: list[Manifest]) -> list[str]:
        """The block files that these agents name and no other agent does: what removing
        them all frees."""
        named = Counter(h for m in manifests for h in dict.fromkeys(m.blocks))
        return [h for h in named if h in self.files.blocks and self.users[h] <= named[h]]

    def token_count(self, block_hash: str) -> int | None:
        """Tokens in a block file, from its header (None when there is no readable file)."""
        if block_hash not in self.token_counts:
            count = None
            info = self.files.blocks.get(block_hash)
            if info is not None:
                try:
                    count = len(BlockRecord.from_meta(self.layout.block_meta_at(info)).tokens)
                except (OSError, ValueError):
                    count = None
            self.token_counts[block_hash] = count
        return self.token_counts[block_hash]

    def block_tokens(self, manifest: Manifest) -> int:
        """The block size the manifest was written with: model.json says (the server writes
        it there); else every block but the last is full, so one block file of the manifest
        tells; the server's BLOCK_TOKENS when none can."""
        size = self.meta.get("block_tokens")
        if type(size) is int and size > 0:
            return size
        n, total = len(manifest.blocks), len(manifest.tokens)
        if n <= 1:
            return max(total, 1)
        for i, h in enumerate(manifest.blocks):
            count = self.token_count(h)
            if count is None:
                continue
            if i < n - 1:
                return count
            rest = total - count  # only the (maybe partial) last block has a file
            if rest > 0 and rest % (n - 1) == 0:
                return rest // (n - 1)
        return BLOCK_TOKENS

    def spans(self, manifest: Manifest) -> list[tuple[str, int, int]]:
        """(hash, start, tokens) of each of the manifest's blocks."""
        size, total = self.block_tokens(manifest), len(manifest.tokens)
        return [(h, i * size, max(0, min(size, total - i * size))) for i, h in enumerate(manifest.blocks)]


def scan_cache(cache_dir: Path, model: str | None, warm_store: str | None = None) -> list[ModelFolder]:
    """Every model folder under <cache-dir>/kv/ (or namespace of a shared `warm_store`), or
    those `--model` names (none: exit 1)."""
    if warm_store is not None:
        from agent_memory.memory.warm.redis_folder import namespaces
        from agent_memory.memory.warm.redis_url import redact

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
    from agent_memory.memory.warm.redis_url import check_url, store_root

    try:
        check_url(url)
    except ValueError as e:
        fail(f"--warm-store {e}", code=2)
    return config, store_root(url), scan_cache(config.cache_dir, model, url)


def model_names(folder: str, name: str | None) -> list[str]:
    """What `--model` and `--filter model=` match: the model's name (model.json), its
    folder's name, and the model name that folder name starts with."""
    parsed = FOLDER_RE.match(folder)
    return [n for n in (name, folder, parsed["model"] if parsed else None) if n]


def _matches(layout: Folder, model: str) -> bool:
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
    """The one manifest of the agent (of `tenant`, if given), or why there is none."""
    found = [
        (f, m) for f in folders for m in f.files.manifests if m.key.id == agent and tenant in (None, m.key.tenant)
    ]
    if len(found) == 1:
        return found[0]
    if found and len({m.key.tenant for _, m in found}) > 1:
        tenants = ", ".join(sorted(repr(m.key.tenant) for _, m in found))
        return f"agent {printable(agent)} exists for several tenants ({tenants}): pass --tenant"
    if found:
        where = ", ".join(f.folder for f, _ in found)
        return f"agent {printable(agent)} is cached for several models ({where}): pass --model"
    stem = agent_file_stem(AgentKey(agent, tenant or ""))
    damaged = [(f, why) for f in folders for p, why in f.files.bad_manifests if p.stem == stem]
    if damaged:
        return f"agent {printable(agent)}: its manifest in {damaged[0][0].folder} is unusable ({damaged[0][1]})"
    return f"no agent {printable(agent)} in the disk cache"


def describe_agent(folder: ModelFolder, manifest: Manifest) -> dict:
    """One agent as `show` tells it: each block, on disk or cold, and whom it is shared with."""
    blocks = [
        {
            "hash": h,
            "start": start,
            "tokens": count,
            "on_disk": h in folder.files.blocks,
            "bytes": folder.bytes_of([h]),
            "shared_with": folder.users[h] - 1,
        }
        for h, start, count in folder.spans(manifest)
    ]
    on_disk = [b for b in blocks if b["on_disk"]]
    totals = {
        "blocks": len(blocks),
        "on_disk": len(on_disk),
        "cold": len(blocks) - len(on_disk),
        "bytes": sum(b["bytes"] for b in on_disk),
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
        "totals": totals,
    }


@dataclass
class AgentRow:
    """One agent as `ls` shows it."""

    id: str
    model: str
    folder: str
    tokens: int
    blocks: int
    on_disk: int
    cold: int
    bytes: int
    last_used: float
    manifest: str
    tenant: str = ""

    @classmethod
    def of(cls, folder: ModelFolder, manifest: Manifest) -> AgentRow:
        on_disk = [h for h in manifest.blocks if h in folder.files.blocks]
        return cls(
            id=manifest.key.id,
            model=folder.name,
            folder=folder.folder,
            tokens=len(manifest.tokens),
            blocks=len(manifest.blocks),
            on_disk=len(on_disk),
            cold=len(manifest.blocks) - len(on_disk),
            bytes=folder.bytes_of(on_disk),
            last_used=manifest.last_used,
            manifest=str(manifest.path),
            tenant=manifest.key.tenant,
        )


@dataclass
class FolderStats:
    """One model folder as `stats` shows it."""

    model: str
    folder: str
    agents: int
    block_files: int
    bytes: int
    cold_blocks: int
    orphan_blocks: int
    quarantined_files: int
    quarantined_bytes: int
    temp_files: int

    @classmethod
    def of(cls, f: ModelFolder) -> FolderStats:
        files = f.files
        return cls(
            model=f.name,
            folder=f.folder,
            agents=len(files.manifests),
            block_files=len(files.blocks),
            bytes=sum(i.size for i in files.blocks.values()),
            cold_blocks=sum(1 for h in f.users if h not in files.blocks),
            orphan_blocks=sum(1 for h in files.blocks if h not in f.users),
            quarantined_files=len(files.quarantined),
            quarantined_bytes=sum(i.size for i in files.quarantined),
            temp_files=len(files.temp_files),
        )

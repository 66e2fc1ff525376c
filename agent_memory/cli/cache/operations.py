"""What the `cache` commands check and change: verify's checks, rm's plan and deletions, prune's.

The server may be running: nothing here takes a lock, a file that vanishes mid-scan is
skipped, and every deletion is one `Folder.unlink` (never a link's target, never through a
link planted as a folder, never anything but a regular file) made in the one safe order: a
manifest first, then only block files that no manifest still on disk names. The server
writes a block before the manifest naming it, so a block no manifest names (an orphan) or a
temp file younger than GRACE_S may be a write still under way; those are left alone until
they are older. Agents of a folder with a live server (server.json) are ended through the
server (server.py), never by deleting its files.
"""

from __future__ import annotations

import os
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from pathlib import Path

from agent_memory.agent_key import AgentKey
from agent_memory.cli.cache.scan import ModelFolder
from agent_memory.cli.cache.server import LiveServer
from agent_memory.memory.hashing import BlockNames
from agent_memory.memory.warm.folder import BLOCK_META_KEYS, FOLDER_RE
from agent_memory.memory.warm.records import BlockRecord, Manifest
from agent_memory.memory.warm.scan import FileInfo

GRACE_S = 600.0  # younger orphans and temp files may belong to a write the server is making
SERVER_WAIT_S = 30.0  # how long to wait for the server's writer to delete an ended agent's files


# -- verify --------------------------------------------------------------------------------


@dataclass
class Problem:
    path: Path
    kind: str  # block, manifest, model.json, temp, stray
    reason: str


def check_block(folder: ModelFolder, block_hash: str, path: Path) -> str | None:
    """Why the server would refuse this block file or why its name lies; None when sound.
    Records the file's token count for the manifest checks. FileNotFoundError passes through."""
    folder.token_counts[block_hash] = None
    expect = {k: v for k in BLOCK_META_KEYS if isinstance(v := folder.meta.get(k), str)}
    try:
        meta, _ = folder.layout.read_block_at(path, {**expect, "hash": block_hash}, None)
        block = BlockRecord.from_meta(meta)
    except FileNotFoundError:
        raise
    except ValueError as e:  # BlockFileError included
        return str(e)
    except Exception as e:  # noqa: BLE001 - a hand-made header can break the reader in many ways
        return f"malformed file ({type(e).__name__}: {e})"
    fingerprint = meta.get("fingerprint")
    if not folder.owns(fingerprint):
        return f"fingerprint {str(fingerprint)[:12]!r} is another model's"
    actual = BlockNames(fingerprint, len(block.tokens)).block_hash(block.parent, block.tokens)
    if actual != block_hash:
        return f"its parent and tokens hash to {actual[:16]}…, not to its name"
    folder.token_counts[block_hash] = len(block.tokens)
    return None


def check_manifest(folder: ModelFolder, manifest: Manifest) -> str | None:
    """Whether the manifest's block hashes are the hash chain of its tokens (what the server
    checks at start before trusting a single block of it)."""
    size = folder.block_tokens(manifest)
    try:
        chain = [h for h, *_ in BlockNames(manifest.fingerprint, size).chain(manifest.tokens, manifest.root)]
    except (ValueError, OverflowError) as e:
        return f"token ids out of range: {e}"
    if chain != manifest.blocks:
        return f"its block hashes do not match its tokens (in {size}-token blocks)"
    return None


def verify_folder(folder: ModelFolder, advance: Callable[[], None], now: float) -> list[Problem]:
    files, model_json = folder.files, folder.layout.root / "model.json"
    problems = []
    if folder.meta_error:
        problems.append(Problem(model_json, "model.json", folder.meta_error))
    parsed = FOLDER_RE.match(folder.folder)
    if folder.fingerprint and parsed and folder.fingerprint[:12] != parsed["fp"]:
        problems.append(Problem(model_json, "model.json", "its fingerprint is not the folder's"))
    for block_hash, info in sorted(files.blocks.items()):
        try:
            reason = check_block(folder, block_hash, info.path)
        except FileNotFoundError:
            reason = None  # deleted by the server meanwhile
        if reason:
            problems.append(Problem(info.path, "block", reason))
        advance()
    for path, reason in files.bad_manifests:
        problems.append(Problem(path, "manifest", reason))
        advance()
    for manifest in files.manifests:
        if reason := check_manifest(folder, manifest):
            problems.append(Problem(manifest.path, "manifest", reason))
        advance()
    for info in files.temp_files:
        if now - info.mtime > GRACE_S:
            problems.append(Problem(info.path, "temp", "leftover temp file of an interrupted write"))
    for info in files.stray_files:
        problems.append(Problem(info.path, "stray", "not a file the server writes here (it is ignored)"))
    return problems


# -- deleting ------------------------------------------------------------------------------


def file_size(path: Path) -> int:
    try:
        return os.lstat(path).st_size
    except FileNotFoundError:
        return 0


def delete_in_order(folder: ModelFolder, manifests: Iterable[Manifest], blocks: Iterable[str]) -> tuple[list[str], int]:
    """Unlink the manifests, then each of `blocks` that no manifest still on disk names
    (read again now: the running server may have named one meanwhile). Returns the block
    hashes removed and the bytes freed, manifests included."""
    freed = 0
    for manifest in manifests:
        size = folder.layout.size_at(manifest.path)
        if folder.layout.unlink(manifest.path):
            freed += size
    named = folder.rescan().users
    removed = []
    for h in dict.fromkeys(blocks):
        info = folder.files.blocks.get(h)
        if h not in named and info is not None and folder.layout.unlink(info.path):
            removed.append(h)
            freed += info.size
    return removed, freed


def ended_by_server(folder: ModelFolder, manifests: list[Manifest], blocks: Iterable[str]) -> tuple[list[str], int]:
    """What the server deleted of ended agents' manifests and of `blocks`, once their
    manifests are gone (its writer deletes an agent's blocks before its manifest)."""
    sizes = {m.path: file_size(m.path) for m in manifests}
    deadline = time.monotonic() + SERVER_WAIT_S
    while any(os.path.lexists(p) for p in sizes) and time.monotonic() < deadline:
        time.sleep(0.05)
    freed = sum(size for path, size in sizes.items() if not os.path.lexists(path))
    removed = [h for h in dict.fromkeys(blocks) if not os.path.lexists(folder.files.blocks[h].path)]
    return removed, freed + folder.bytes_of(removed)


def remove_agent(
    folder: ModelFolder, manifest: Manifest, key_of: Callable[[str], str | None]
) -> tuple[list[str], int, str | None]:
    """Remove one agent and the block files only it used: through the folder's live server
    if there is one, else on disk. Returns the blocks removed, bytes freed and the server's URL."""
    private = folder.private_blocks(manifest)
    record = folder.layout.read_server_json()
    if record is not None:
        server = LiveServer(record, key_of)
        if server.end_agent(manifest.key):
            return *ended_by_server(folder, [manifest], private), server.url
    return *delete_in_order(folder, [manifest], private), None


@dataclass
class Removal:
    """`rm`'s plan: the agents, by model folder, and what removing them frees. They go one at
    a time, so blocks that only they name go with the last of them that names each."""

    targets: dict[str, tuple[ModelFolder, list[Manifest]]] = field(default_factory=dict)

    @classmethod
    def of(cls, found: Iterable[tuple[ModelFolder, Manifest]]) -> Removal:
        plan = cls()
        for folder, manifest in found:
            plan.targets.setdefault(folder.folder, (folder, []))[1].append(manifest)
        return plan

    def preview(self) -> list[dict]:
        """Each agent as removing them in order would remove it (nothing is removed)."""
        agents = []
        for folder, manifests in self.targets.values():
            for i, manifest in enumerate(manifests):
                before = set(folder.blocks_only_of(manifests[:i]))
                own = [h for h in folder.blocks_only_of(manifests[: i + 1]) if h not in before]
                size = folder.layout.size_at(manifest.path)
                agents.append(_removed(folder, manifest, own, size + folder.bytes_of(own), None))
        return agents

    def kept_blocks(self) -> int:
        """Block files of these agents that other agents still use."""
        kept = 0
        for folder, manifests in self.targets.values():
            on_disk = {h for m in manifests for h in m.blocks if h in folder.files.blocks}
            kept += len(on_disk - set(folder.blocks_only_of(manifests)))
        return kept

    def execute(self, key_of: Callable[[str], str | None]) -> list[dict]:
        """Remove the agents (`remove_agent` each, on a fresh scan of its folder)."""
        agents = []
        for folder, manifests in self.targets.values():
            for manifest in manifests:
                folder = folder.rescan()
                current = next((m for m in folder.files.manifests if m.key == manifest.key), None)
                if current is not None:  # else gone meanwhile (its server ended it)
                    removed, freed, server = remove_agent(folder, current, key_of)
                    agents.append(_removed(folder, current, removed, freed, server))
        return agents

    def report(self, agents: list[dict], dry_run: bool) -> dict:
        """The document `rm --format json` prints; `server`: the first server that ended one."""
        return {
            "dry_run": dry_run,
            "agents": agents,
            "removed_blocks": [h for a in agents for h in a["removed_blocks"]],
            "kept_shared_blocks": self.kept_blocks(),
            "freed_bytes": sum(a["freed_bytes"] for a in agents),
            "server": next((a["server"] for a in agents if a["server"]), None),
        }


def _removed(folder: ModelFolder, manifest: Manifest, blocks: list[str], freed: int, server: str | None) -> dict:
    return {
        "id": manifest.key.id,
        "tenant": manifest.key.tenant,
        "folder": folder.folder,
        "manifest": str(manifest.path),
        "removed_blocks": blocks,
        "freed_bytes": freed,
        "server": server,
    }


# -- prune ---------------------------------------------------------------------------------


@dataclass
class PrunePlan:
    folder: ModelFolder
    agents: list[Manifest]
    blocks: list[str]
    temp_files: list[FileInfo]
    quarantined: list[FileInfo]
    server: LiveServer | None = None
    held: dict[AgentKey, float] = field(default_factory=dict)  # agents the server holds -> last use

    def items(self) -> list[tuple[str, str, int]]:
        """(kind, what, bytes) of everything the plan removes."""
        return [
            *(("agent", m.key.id, self.folder.layout.size_at(m.path)) for m in self.agents),
            *(("block", h, self.folder.files.blocks[h].size) for h in self.blocks),
            *(("temp", str(t.path), t.size) for t in self.temp_files),
            *(("quarantine", str(q.path), q.size) for q in self.quarantined),
        ]

    def connect(self, key_of: Callable[[str], str | None]) -> None:
        """Ask the folder's live server, if any, which agents it holds: before anything is
        deleted anywhere, so that a server that does not answer stops the whole prune."""
        record = self.folder.layout.read_server_json() if self.agents else None
        if record is not None:
            self.server = LiveServer(record, key_of)
            for tenant in sorted({m.key.tenant for m in self.agents}):
                self.held.update({AgentKey(a, tenant): t for a, t in self.server.agents(tenant).items()})


def plan_prune(folder: ModelFolder, max_age: float | None, quarantine: bool, now: float) -> PrunePlan:
    """Agents unused for longer than max_age, the blocks only they or nobody name (orphans only
    once older than GRACE_S), old temp files and, if asked, the quarantine."""
    files = folder.files
    old = [m for m in files.manifests if max_age is not None and now - m.last_used > max_age]
    kept = {h for m in files.manifests if m not in old for h in m.blocks}
    blocks = [
        h for h, info in files.blocks.items() if h not in kept and (h in folder.users or now - info.mtime > GRACE_S)
    ]
    temps = [t for t in files.temp_files if now - t.mtime > GRACE_S]
    return PrunePlan(folder, old, blocks, temps, files.quarantined if quarantine else [])


def _still_unused(plan: PrunePlan, manifest: Manifest, max_age: float, now: float) -> bool:
    """Asked again before deleting: the running server may have just used the agent."""
    if manifest.key in plan.held:
        return now - plan.held[manifest.key] > max_age
    try:
        return now - plan.folder.layout.manifest_at(manifest.path).last_used > max_age
    except FileNotFoundError:
        return False
    except (OSError, ValueError, RecursionError):
        return True


def execute_prune(plan: PrunePlan, max_age: float | None, now: float) -> int:
    """Carry the plan out (after `connect`); the bytes freed."""
    old = [m for m in plan.agents if _still_unused(plan, m, max_age, now)] if max_age is not None else []
    ended = [m for m in old if plan.server and m.key in plan.held and plan.server.end_agent(m.key)]
    theirs = {h for m in ended for h in m.blocks}
    freed = ended_by_server(plan.folder, ended, [h for h in plan.blocks if h in theirs])[1] if ended else 0
    mine = [m for m in old if m not in ended]
    freed += delete_in_order(plan.folder, mine, [h for h in plan.blocks if h not in theirs])[1]
    for info in [*plan.temp_files, *plan.quarantined]:
        if plan.folder.layout.unlink(info.path):
            freed += info.size
    return freed

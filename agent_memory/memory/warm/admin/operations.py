"""The warm tier's admin operations, for the `cache` commands: verify, delete agents, prune.

The server may be running: nothing here takes a lock, a file that vanishes mid-scan is
skipped, and every deletion is one `layout.unlink` (a folder's: never a link's target, never
through a link planted as a folder, never anything but a regular file; a Redis namespace's:
one script that keeps reference counts exact) made in the one safe order: a manifest first,
then only blocks that no manifest still there names. The server writes a block before the
manifest naming it, so a block no manifest names (an orphan) or a temp file younger than
GRACE_S may be a write still under way; those are left alone until they are older. Agents a
live server holds are ended through it (the caller's part); what its writer then deletes is
waited for here, a bounded time. No MLX here.
"""

from __future__ import annotations

import os
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from pathlib import Path

from agent_memory.memory.hashing import BlockNames
from agent_memory.memory.warm.folder.paths import BLOCK_META_KEYS, FOLDER_RE
from agent_memory.memory.warm.admin.model_folder import ModelFolder
from agent_memory.memory.warm.format.records import BlockRecord, Manifest
from agent_memory.memory.warm.scan import FileInfo

GRACE_S = 600.0  # younger orphans and temp files may belong to a write the server is making
REMOVAL_WAIT_S = 30.0  # how long a server's writer may take to delete an ended agent's files


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
    names = BlockNames(fingerprint, len(block.tokens))
    actual = names.snapshot_name(block.parent) if block.snapshot else names.block_hash(block.parent, block.tokens, block.extras)
    if actual != block_hash:
        return f"its parent and tokens hash to {actual[:16]}…, not to its name"
    folder.token_counts[block_hash] = len(block.tokens)
    return None


def check_manifest(folder: ModelFolder, manifest: Manifest) -> str | None:
    """Whether the manifest's block hashes are the hash chain of its tokens (what the server
    checks at start before trusting a single block of it)."""
    size = folder.block_tokens(manifest)
    names = BlockNames(manifest.fingerprint, size)
    try:
        chain = names.chain(manifest.tokens, manifest.root, manifest.extras)
    except (ValueError, OverflowError) as e:
        return f"token ids out of range: {e}"
    if [h for h, *_ in chain] != manifest.blocks:
        return f"its block hashes do not match its tokens (in {size}-token blocks)"
    if any(h != names.snapshot_name(names.prefix_name(chain, manifest.tokens, p, manifest.extras)) for p, h in manifest.snapshots):
        return "a snapshot's name does not match the prefix it follows"
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


# -- delete --------------------------------------------------------------------------------


def delete_agents(folder: ModelFolder, manifests: Iterable[Manifest], blocks: Iterable[str]) -> tuple[list[str], int]:
    """Delete the manifests, then each of `blocks` that no manifest still there names (read
    again now: the running server may have named one meanwhile). Returns the block hashes
    removed and the bytes freed, manifests included."""
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


def removed_by_server(folder: ModelFolder, manifests: list[Manifest], blocks: Iterable[str]) -> tuple[list[str], int]:
    """What a live server deleted of the agents it ended and of `blocks`: its writer deletes an
    agent's blocks, then its manifest, so the manifests' going is waited for (REMOVAL_WAIT_S at
    most). Only a folder has a live server: its files are looked at directly."""
    sizes = {m.path: folder.layout.size_at(m.path) for m in manifests}
    wait_until(lambda: not any(os.path.lexists(p) for p in sizes), REMOVAL_WAIT_S)
    freed = sum(size for path, size in sizes.items() if not os.path.lexists(path))
    removed = [h for h in dict.fromkeys(blocks) if not os.path.lexists(folder.files.blocks[h].path)]
    return removed, freed + folder.bytes_of(removed)


def wait_until(done: Callable[[], bool], timeout: float) -> bool:
    """Whether `done()` came true within `timeout` seconds; asked at growing intervals."""
    deadline, pause = time.monotonic() + timeout, 0.01
    while not done():
        left = deadline - time.monotonic()
        if left <= 0:
            return False
        time.sleep(min(pause, left))
        pause = min(2 * pause, 0.25)
    return True


# -- prune ---------------------------------------------------------------------------------


@dataclass
class Prune:
    """What pruning a folder removes: old agents, the blocks only they or nobody name, old
    temp files and, if asked, the quarantine."""

    folder: ModelFolder
    agents: list[Manifest]
    blocks: list[str]
    temp_files: list[FileInfo]
    quarantined: list[FileInfo]

    def items(self) -> list[tuple[str, str, int]]:
        """(kind, what, bytes) of everything the plan removes."""
        return [
            *(("agent", m.key.id, self.folder.layout.size_at(m.path)) for m in self.agents),
            *(("block", h, self.folder.files.blocks[h].size) for h in self.blocks),
            *(("temp", str(t.path), t.size) for t in self.temp_files),
            *(("quarantine", str(q.path), q.size) for q in self.quarantined),
        ]


def plan_prune(folder: ModelFolder, max_age: float | None, quarantine: bool, now: float) -> Prune:
    """Agents unused for longer than max_age, the blocks only they or nobody name (orphans only
    once older than GRACE_S), old temp files and, if asked, the quarantine."""
    files = folder.files
    old = [m for m in files.manifests if max_age is not None and now - m.last_used > max_age]
    kept = {h for m in files.manifests if m not in old for h in m.names}
    kept |= set(folder.users) if folder.follower else set()  # rank 0's agents: pruned from its folder
    blocks = [
        h for h, info in files.blocks.items() if h not in kept and (h in folder.users or now - info.mtime > GRACE_S)
    ]
    temps = [t for t in files.temp_files if now - t.mtime > GRACE_S]
    return Prune(folder, old, blocks, temps, files.quarantined if quarantine else [])


def still_unused(folder: ModelFolder, manifest: Manifest, max_age: float, now: float) -> bool:
    """Asked again before deleting, from the manifest there now: a server may have just used it."""
    try:
        return now - folder.layout.manifest_at(manifest.path).last_used > max_age
    except FileNotFoundError:
        return False
    except (OSError, ValueError, RecursionError):
        return True


def finish_prune(plan: Prune, old: list[Manifest], ended: list[Manifest]) -> int:
    """Remove the plan's `old` agents (those a live server `ended` are waited for, the rest
    deleted here), its blocks, temp files and quarantine; the bytes freed."""
    theirs = {h for m in ended for h in m.names}
    freed = removed_by_server(plan.folder, ended, [h for h in plan.blocks if h in theirs])[1] if ended else 0
    mine = [m for m in old if m not in ended]
    freed += delete_agents(plan.folder, mine, [h for h in plan.blocks if h not in theirs])[1]
    for info in [*plan.temp_files, *plan.quarantined]:
        if plan.folder.layout.unlink(info.path):
            freed += info.size
    return freed

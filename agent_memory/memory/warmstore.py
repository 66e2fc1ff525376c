"""Where the warm tier keeps its bytes: one interface, two places.

- `FolderStore`: the cache folder on this machine (folder.py); the embedded default. One server
  owns it (server.json), so it restores every agent at start and evicts against its own budget.
- `RedisStore` (redis_store.py): a Redis shared by several servers of one model. Agents are
  read when they come back, manifests are compare-and-set, and Redis' maxmemory evicts.

What a store holds is keyed by a namespace, the folder name `<model>-<fingerprint>-<precision>`,
so servers of other models or precisions never see each other's blocks.

- **Blocks** are content-addressed and immutable. A put stores the bytes only if the name is
  free (two servers computing the same block write the same bytes once). A get checks the bytes
  exactly as a block file is checked (blockfile.py: identity in the header, shapes, CRC32).
  Anything wrong is a miss: the damaged copy is set aside (quarantined, or deleted from Redis if
  it still holds those very bytes) so that the recomputed block can take its name.
- **Manifests** are small and mutable: an agent's tokens and block names. A write names the
  version it replaces (an etag): it fails, changing nothing, if the store holds another one.
  DiskTier decides what a failed write means (disk.py, `write_manifest`).
- **Budget**: `usage()` says what the store holds and may hold (a shared store evicts on its
  own: no server evicts from it).

Every call here does I/O: DiskTier's writer and reader threads make them, never the event loop;
the engine thread only at start (open, usage, a bad manifest's quarantine). No MLX here: the
`cache` commands use the stores too.
"""

from __future__ import annotations

import logging
from abc import ABC, abstractmethod
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field

import numpy as np

from agent_memory.agent_key import AgentKey
from agent_memory.memory import blockfile
from agent_memory.memory.blockfile import BlockFileError, Layout
from agent_memory.memory.folder import Folder, FolderScan
from agent_memory.memory.records import Manifest

log = logging.getLogger(__name__)


class BlockMissing(LookupError):
    """The store does not hold the block (evicted, deleted, never written): a miss."""


@dataclass(frozen=True)
class ManifestWrite:
    """What a compare-and-set write of a manifest did."""

    ok: bool
    current: str | None = None  # on failure: the etag the store holds (None: no manifest)
    freed: list[str] = field(default_factory=list)  # blocks no manifest names any more (shared stores)


@dataclass(frozen=True)
class Probe:
    """What a shared store said about a returning agent and a request's blocks (one round trip)."""

    known: str | None  # the etag the asker knew when it asked
    manifest: tuple[Manifest, str] | None | bool  # (manifest, etag); None: there is none; True: unchanged
    sizes: dict[str, int]  # block hash -> bytes, for the blocks asked about that the store holds


@dataclass
class StoreUsage:
    """What a store holds and may hold, for /health and the logs."""

    used_bytes: int | None = None
    limit_bytes: int | None = None  # None: unknown or unbounded
    policy: str | None = None  # Redis' maxmemory-policy
    note: str | None = None  # something an operator should know (a policy that loses agents, ...)


class WarmStore(ABC):
    shared = False  # several servers use it: see the module's doc
    folder: Folder | None = None

    @property
    @abstractmethod
    def location(self) -> str:
        """Where it is, for logs and /health (never a password)."""

    @abstractmethod
    def open(self, model_info: dict, owns: Callable[[str], bool]) -> FolderScan:
        """Make it ready for this model; what a server restores at start."""

    # -- blocks ----------------------------------------------------------------------------

    @abstractmethod
    def put_block(self, block_hash: str, chunks: list) -> int:
        """Store a block's bytes unless the name already holds some; the bytes it takes."""

    @abstractmethod
    def read_block(self, block_hash: str, expect: dict[str, str], layout: Layout) -> dict[str, np.ndarray]:
        """A block's tensors, checked. BlockMissing if absent; BlockFileError if damaged (the
        damaged copy is set aside first, so a good one can replace it)."""

    @abstractmethod
    def delete_block(self, block_hash: str) -> None: ...

    # -- manifests -------------------------------------------------------------------------

    @abstractmethod
    def read_manifest(self, key: AgentKey) -> tuple[Manifest, str] | None:
        """(manifest, etag), or None if there is none; ValueError if it is unreadable."""

    @abstractmethod
    def write_manifest(self, manifest: Manifest, base: str | None, etag: str) -> ManifestWrite:
        """Write `manifest` as version `etag` if the store holds version `base` (None: none)."""

    @abstractmethod
    def delete_manifest(self, key: AgentKey) -> ManifestWrite:
        """Delete an agent's manifest; ok says whether there was one."""

    def quarantine_manifest(self, manifest: Manifest, reason: str) -> None:
        """Set aside a manifest that failed a check."""

    def probe(self, key: AgentKey | None, known: str | None, hashes: Iterable[str]) -> Probe:
        """A shared store's answer for a request (see Probe); local stores are never asked."""
        raise NotImplementedError

    def usage(self) -> StoreUsage:
        return StoreUsage()

    def close(self) -> None:
        """Release connections (after the writer has stopped)."""


class FolderStore(WarmStore):
    """The cache folder: block files and manifest files (folder.py, blockfile.py), owned by
    one server at a time. Manifests carry no version: the owner is their only writer."""

    def __init__(self, folder: Folder) -> None:
        self.folder = folder

    @property
    def location(self) -> str:
        return str(self.folder.root)

    def open(self, model_info: dict, owns: Callable[[str], bool]) -> FolderScan:
        """Create the folders, drop temp files, index blocks and manifests. Manifests that
        fail their checks are quarantined."""
        folder = self.folder
        folder.make()
        # Atomic like every other write: a crash never leaves a torn model.json for the CLI.
        # Written only when it changes, so that a full disk does not stop a start.
        if folder.read_model_json()[0] != model_info:
            folder.write_model_json(model_info)
        scan = folder.scan(owns)
        # Files of an older version, or copied in, may be readable by others: they hold
        # conversations. The scan has stat()ed every file already; only those need a chmod.
        folder.make_private(scan.loose)
        for tmp in scan.temp_files:
            folder.unlink(tmp.path)
        for path, reason in scan.bad_manifests:
            folder.quarantine(path, f"bad manifest: {reason}")
        return scan

    def put_block(self, block_hash: str, chunks: list) -> int:
        path = self.folder.block_path(block_hash)
        self.folder.make_subfolder(path.parent)  # a real folder: a planted link is refused
        return self.folder.write(path, chunks)

    def read_block(self, block_hash: str, expect: dict[str, str], layout: Layout) -> dict[str, np.ndarray]:
        path = self.folder.block_path(block_hash)
        try:
            return blockfile.read(path, expect, layout)[1]
        except FileNotFoundError as e:
            raise BlockMissing(block_hash) from e
        except BlockFileError as e:
            self.folder.quarantine(path, str(e))
            raise

    def delete_block(self, block_hash: str) -> None:
        self.folder.unlink(self.folder.block_path(block_hash))

    def read_manifest(self, key: AgentKey) -> tuple[Manifest, str] | None:
        try:
            return Manifest.read(self.folder.agent_path(key)), ""
        except FileNotFoundError:
            return None

    def write_manifest(self, manifest: Manifest, base: str | None, etag: str) -> ManifestWrite:
        self.folder.write(self.folder.agent_path(manifest.key), [manifest.to_bytes()])
        return ManifestWrite(True)

    def delete_manifest(self, key: AgentKey) -> ManifestWrite:
        return ManifestWrite(self.folder.unlink(self.folder.agent_path(key)))

    def quarantine_manifest(self, manifest: Manifest, reason: str) -> None:
        if manifest.path is not None:
            self.folder.quarantine(manifest.path, reason)


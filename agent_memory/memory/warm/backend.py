"""Where the warm tier keeps its bytes: one interface (`WarmBackend`), two places.

- `FolderBackend` (folder/backend.py): the cache folder on this machine (folder/paths.py); the
  embedded default. One server owns it (server.json), so it restores every agent at start and
  evicts against its own budget.
- `RedisBackend` (redis/backend.py): a Redis shared by several servers of one model. Agents are
  read when they come back, manifests are compare-and-set, and Redis' maxmemory evicts.

What a backend holds is keyed by a namespace, the folder name `<model>-<fingerprint>-<precision>`,
so servers of other models or precisions never see each other's blocks.

- **Blocks** are content-addressed and immutable. A put stores the bytes only if the name is
  free (two servers computing the same block write the same bytes once). A get checks the bytes
  exactly as a block file is checked (format/blockfile.py: identity in the header, shapes, CRC32).
  Anything wrong is a miss: the damaged copy is set aside (quarantined, or deleted from Redis if
  it still holds those very bytes) so that the recomputed block can take its name.
- **Manifests** are small and mutable: an agent's tokens and block names. A write names the
  version it replaces (an etag): it fails, changing nothing, if the backend holds another one.
  WarmTier decides what a failed write means (tier.py, `_write_manifest`).
- **Budget**: `usage()` says what the backend holds and may hold (a shared one evicts on its
  own: no server evicts from it).

Every call here does I/O: WarmTier's writer and reader threads make them, never the event loop;
the engine thread only at start (open, usage, a bad manifest's quarantine). No MLX here: the
`cache` commands use the backends too.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field

import numpy as np

from agent_memory.agent_key import AgentKey
from agent_memory.memory.warm.format.blockfile import Layout
from agent_memory.memory.warm.folder.paths import Folder
from agent_memory.memory.warm.format.records import Manifest
from agent_memory.memory.warm.scan import FolderScan


class BlockMissing(LookupError):
    """The backend does not hold the block (evicted, deleted, never written): a miss."""


@dataclass(frozen=True)
class ManifestWrite:
    """What a compare-and-set write of a manifest did."""

    ok: bool
    current: str | None = None  # on failure: the etag the backend holds (None: no manifest)
    freed: list[str] = field(default_factory=list)  # blocks no manifest names any more (shared backends)


@dataclass(frozen=True)
class Probe:
    """What a shared backend said about a returning agent and a request's blocks (one round trip)."""

    known: str | None  # the etag the asker knew when it asked
    manifest: tuple[Manifest, str] | None | bool  # (manifest, etag); None: there is none; True: unchanged
    sizes: dict[str, int]  # block hash -> bytes, for the blocks asked about that the backend holds


@dataclass
class BackendUsage:
    """What a backend holds and may hold, for /health and the logs."""

    used_bytes: int | None = None
    limit_bytes: int | None = None  # None: unknown or unbounded
    policy: str | None = None  # Redis' maxmemory-policy
    note: str | None = None  # something an operator should know (a policy that loses agents, ...)


class WarmBackend(ABC):
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
        """Write `manifest` as version `etag` if the backend holds version `base` (None: none)."""

    @abstractmethod
    def delete_manifest(self, key: AgentKey) -> ManifestWrite:
        """Delete an agent's manifest; ok says whether there was one."""

    def quarantine_manifest(self, manifest: Manifest, reason: str) -> None:
        """Set aside a manifest that failed a check."""

    def probe(self, key: AgentKey | None, known: str | None, hashes: Iterable[str]) -> Probe:
        """A shared backend's answer for a request (see Probe); local ones are never asked."""
        raise NotImplementedError

    def usage(self) -> BackendUsage:
        return BackendUsage()

    def check(self) -> tuple[BackendUsage, bool]:
        """A shared backend's periodic check (watch.py): its usage, and whether it lost what it
        held since the last check."""
        return self.usage(), False

    def unreachable(self, e: BaseException) -> bool:
        """Whether a call's failure means the backend did not answer (rather than refused)."""
        return False

    def close(self) -> None:
        """Release connections (after the writer has stopped)."""

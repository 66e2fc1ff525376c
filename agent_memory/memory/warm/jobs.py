"""The warm tier's writes, one typed job per kind, queued for its writer thread (tier.py): each
holds what its write needs and nothing else, and says its `kind` (for the log, /health's
last failure and --trace-file). A failed job is said once per kind of failure (`say_failed`)."""

from __future__ import annotations

import logging
from concurrent.futures import Future
from dataclasses import dataclass
from typing import ClassVar

from agent_memory.agent_key import AgentKey
from agent_memory.memory.warm.format.blockfile import Tensors
from agent_memory.memory.warm.format.records import BlockRecord, Manifest

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class SaveBlock:
    """Write a block's (or a snapshot's) file, unless its name already holds one."""

    kind: ClassVar[str] = "save_block"
    block: BlockRecord
    tensors: Tensors

    @property
    def subject(self) -> str:
        return self.block.hash


@dataclass(frozen=True)
class SaveManifest:
    """Write an agent's manifest; with a shared backend, as version `etag` replacing `base`."""

    kind: ClassVar[str] = "save_agent"
    manifest: Manifest
    base: str | None = None
    etag: str | None = None

    @property
    def subject(self) -> str:
        return self.manifest.key.id


@dataclass(frozen=True)
class DeleteBlock:
    """Delete a block's copy (its file, or its key in a shared backend)."""

    kind: ClassVar[str] = "delete_block"
    block_hash: str


@dataclass(frozen=True)
class DeleteAgent:
    """Delete an agent's manifest; `done` gets whether the backend had it."""

    kind: ClassVar[str] = "delete_agent"
    key: AgentKey
    done: Future


Job = SaveBlock | SaveManifest | DeleteBlock | DeleteAgent


def say_failed(kind: str, e: Exception, said: set[tuple[str, object]]) -> None:
    """Say once per kind of failure (`said`: those said already) what happened and what it
    means; then stay quiet."""
    key = (kind, getattr(e, "errno", None) or type(e).__name__)
    level = logging.DEBUG if key in said else logging.WARNING
    said.add(key)
    log.log(
        level,
        "warm tier: %s failed (%s); blocks stay in memory or are recomputed%s",
        kind,
        e,
        "" if level == logging.DEBUG else " (said once for this kind of failure)",
        exc_info=not isinstance(e, (OSError, ConnectionError, TimeoutError)) and not _redis_error(e),
    )


def _redis_error(e: Exception) -> bool:
    return type(e).__module__.startswith("redis")

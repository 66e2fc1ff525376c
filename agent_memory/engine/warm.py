"""Open the warm tier for the loaded model: its folder under the cache dir, named by model,
fingerprint and disk precision. A disk that cannot hold it (read-only, full, not a folder)
means serving without it, said in the log and on /health, never a failed start."""

from __future__ import annotations

import logging
from pathlib import Path

from agent_memory.engine import kv
from agent_memory.engine.loader import LoadedModel
from agent_memory.memory.disk import DiskTier
from agent_memory.memory.folder import BLOCK_TOKENS, Folder, FolderScan, entries, folder_name

log = logging.getLogger(__name__)


def open_warm_tier(
    cache_dir: Path | None, budget_bytes: int, loaded: LoadedModel, shape: kv.KVShape, precisions: kv.Precisions
) -> tuple[DiskTier | None, FolderScan | None, str | None]:
    """(the tier, what its folder held, why there is none)."""
    if cache_dir is None or budget_bytes <= 0:
        return None, None, None
    precision = precisions.disk
    name = folder_name(loaded.name, loaded.fingerprint, precision.tag)
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
    disk = DiskTier(
        Folder(kv_dir / name),
        fingerprint=loaded.fingerprint,
        meta=precision.file_meta(),
        name=loaded.name,
        block_tokens=BLOCK_TOKENS,
        block_layout=lambda n: kv.block_layout(n, shape, precision),
    )
    try:
        scan = disk.open()
    except OSError as e:
        reason = f"the cache folder {kv_dir} cannot be used ({e.strerror or e})"
        log.warning("serving without the warm tier: %s", reason)
        return None, None, reason
    return disk, scan, None

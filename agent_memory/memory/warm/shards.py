"""The warm memory of a model split over processes, sharded like the model: each rank keeps its
part of every block (its KV heads, or its layers) in its own folder, named by the layout
(`<model>-<fp>-<precision>-tp2r1`: 2-way tensor parallel, rank 1), whose model.json says which
part it holds and the `epoch` of the set of folders the ranks wrote together. Rank 0's folder
is a full one (manifests, server.json); the others hold block files only.

At start the ranks agree (one gather) to reuse their folders only when every rank holds its
own part of the same set; otherwise every rank starts cold with a new epoch, and rank 0 says why
in one line. A rank without a warm tier (its disk full or read-only) means none for all: rank
0 would otherwise ask for writes and reads a rank cannot make.
"""

from __future__ import annotations

import logging
import secrets
from pathlib import Path

from agent_memory.memory.warm.folder.paths import Folder
from agent_memory.memory.warm.scan import FolderScan
from agent_memory.memory.warm.tier import WarmTier

log = logging.getLogger(__name__)

SAME, NEW, OTHER_PART = 0, 1, 2  # what a rank's folder held at start, before the epochs compare


def part_of(layout) -> dict:
    """What model.json records of a rank's part (engine/distributed/group.py ShardLayout)."""
    return {
        "mode": layout.mode,
        "size": layout.size,
        "rank": layout.rank,
        "kv_heads": list(layout.kv_heads),
        "layers": list(layout.layers),
    }


def suffix(part: dict) -> str:
    """The folder name's end for a part: `tp2r1`, `pp4r3`."""
    return f"{'tp' if part['mode'] == 'tensor' else 'pp'}{part['size']}r{part['rank']}"


def describe(suffix_text: str | None) -> str:
    """A folder's split in words, from its name's suffix (None: a single process's)."""
    if not suffix_text:
        return "one process"
    mode = "tensor" if suffix_text.startswith("tp") else "pipeline"
    return f"a {suffix_text[2:].split('r')[0]}-way {mode} split"


def held(root: Path, part: dict) -> tuple[int, int, int]:
    """(epoch, what it held, the rank it said) of a rank's folder, read before the tier opens
    (opening rewrites model.json): epoch 0 when new or holding another part."""
    info, _ = Folder(root).read_model_json()
    shard = info.get("shard") if isinstance(info, dict) else None
    if not isinstance(shard, dict):
        return 0, NEW, -1
    if {k: v for k, v in shard.items() if k != "epoch"} != part:
        rank = shard.get("rank")
        return 0, OTHER_PART, rank if isinstance(rank, int) else -1
    epoch = shard.get("epoch")
    return (epoch if isinstance(epoch, int) else 0), SAME, part["rank"]


def agree(group, opened: tuple, part: dict, before: tuple[int, int, int]) -> tuple:
    """Every rank (the same collectives): whether the ranks' folders are reused, the epoch each
    records, and the tier, scan and reason this rank goes on with (`opened`, opening.Opened,
    this rank's own)."""
    tier, scan, why = opened
    epoch, state, said = before
    rows = group.gather([int(tier is not None), epoch, state, said], "the warm folders")
    if missing := [r for r, row in enumerate(rows) if not row[0]]:
        if tier is None or len(missing) == group.size:  # its own reason (or none asked for one)
            return tier, scan, why
        tier.close()
        why = f"rank {', '.join(map(str, missing))} of {group.size} has no warm tier (its log says why)"
        log.warning("serving without the warm tier: %s", why)
        return None, None, why
    epochs = {row[1] for row in rows}
    reuse = len(epochs) == 1 and 0 not in epochs
    if not reuse:
        fresh = secrets.randbelow(2**31 - 2) + 1 if group.rank == 0 else 0
        (epoch,) = group.agree([fresh], "the warm folders' epoch")
        if group.rank == 0 and (why := _why_cold(rows)):
            log.warning("warm memory of the %d ranks not reused, starting cold: %s", group.size, why)
        scan = _emptied(tier, scan)
    tier.shard = {**part, "epoch": epoch}
    tier.folder.write_model_json(tier.model_info())
    return tier, scan, None


def _why_cold(rows: list[list[int]]) -> str | None:
    """Which rank's folder does not fit the others, in words (None: every folder is new)."""
    for r, (_, epoch, state, said) in enumerate(rows):
        if state == OTHER_PART:
            return f"rank {r}'s folder holds the part of rank {said}, not its own"
    if all(state == NEW for _, _, state, _ in rows):
        return None
    new = [r for r, row in enumerate(rows) if row[2] == NEW]
    if new:
        return f"rank {', '.join(map(str, new))} has no memory of the run the others hold"
    return "the ranks' folders hold memory of different runs"


def _emptied(tier: WarmTier, scan: FolderScan | None) -> FolderScan:
    """A cold start: what the folder held is deleted (rank 0's manifests would name blocks
    another rank lacks), before the writer starts."""
    for block_hash in list(scan.blocks) if scan is not None else ():
        tier.backend.delete_block(block_hash)
    for manifest in scan.manifests if scan is not None else ():
        if manifest.path is not None:
            tier.folder.unlink(manifest.path)
    return FolderScan()


class BlocksOnly:
    """A follower's TierEvents: its writer's saves need no index (rank 0's store is the one)."""

    def block_saved(self, block_hash: str, nbytes: int) -> None:
        pass

    def manifest_written(self, agent, etag: str, ok: bool) -> None:
        pass

    def still_used(self, hashes: list[str]) -> set[str]:
        return set(hashes)

    def written(self, kind: str, subject: str, started: float) -> None:
        pass

    def tier_back(self, lost: bool) -> None:
        pass

"""One model folder (or shared Redis namespace) of the warm tier as found at one moment: its
scan, its model.json, and what the operator's commands ask of it (which model owns a file,
which blocks an agent shares, the block size a manifest was written with). The listing itself
is folder/paths.py's (it follows no link inside a model folder and opens only regular files) or
redis/folder.py's."""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterable
from dataclasses import dataclass, field
from functools import cached_property

from agent_memory.memory.warm.folder.paths import FOLDER_RE, Folder
from agent_memory.memory.warm.format.records import BLOCK_TOKENS, BlockRecord, Manifest
from agent_memory.memory.warm.redis.folder import RedisFolder
from agent_memory.memory.warm.scan import FolderScan


@dataclass
class ModelFolder:
    """One `<model>-<fingerprint>-<precision>` folder as found at one moment: the commands'
    common view of it, so each decides from the same facts."""

    layout: Folder | RedisFolder
    meta: dict  # model.json
    meta_error: str | None
    files: FolderScan = field(default_factory=FolderScan)
    token_counts: dict[str, int | None] = field(default_factory=dict)  # block hash -> tokens in its file

    @classmethod
    def scan(cls, layout: Folder | RedisFolder) -> ModelFolder:
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
    def follower(self) -> bool:
        """A folder of a rank other than 0 of a split server (memory/warm/shards.py): block files
        only, which rank 0's manifests name."""
        parsed = FOLDER_RE.match(self.folder)
        return bool(parsed and parsed["shard"] and parsed["shard"].split("r")[1] != "0")

    @cached_property
    def users(self) -> Counter[str]:
        """Block hash -> how many manifests name it. A follower rank's blocks: rank 0's folder's
        manifests, beside it; on a machine without it, every block counts as used."""
        if not self.follower:
            return Counter(h for m in self.files.manifests for h in set(m.names))
        shard = FOLDER_RE.match(self.folder)["shard"]
        lead = self.layout.root.with_name(self.folder[: -len(shard)] + shard.split("r")[0] + "r0")
        if not lead.is_dir():
            return Counter(self.files.blocks)
        return ModelFolder.scan(Folder(lead)).users

    def bytes_of(self, hashes: Iterable[str]) -> int:
        return sum(self.files.blocks[h].size for h in set(hashes) if h in self.files.blocks)

    def private_blocks(self, manifest: Manifest) -> list[str]:
        """The agent's block files that no other agent names: what removing it frees."""
        return self.blocks_only_of([manifest])

    def blocks_only_of(self, manifests: list[Manifest]) -> list[str]:
        """The block files that these agents name and no other agent does: what removing
        them all frees."""
        named = Counter(h for m in manifests for h in dict.fromkeys(m.names))
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

"""FolderBackend: the warm tier in the cache folder on this machine (backend.py says what a
backend is; folder/paths.py lays the folder out)."""

from __future__ import annotations

import logging
from collections.abc import Callable

import numpy as np

from agent_memory.agent_key import AgentKey
from agent_memory.memory.warm.format import blockfile
from agent_memory.memory.warm.backend import BlockMissing, ManifestWrite, WarmBackend
from agent_memory.memory.warm.format.blockfile import BlockFileError, Layout
from agent_memory.memory.warm.folder.paths import Folder
from agent_memory.memory.warm.format.records import Manifest
from agent_memory.memory.warm.scan import FolderScan
from agent_memory.memory.warm.stems import move_folder_manifests

log = logging.getLogger(__name__)


class FolderBackend(WarmBackend):
    """The cache folder: block files and manifest files (folder/paths.py, format/blockfile.py), owned by
    one server at a time. Manifests carry no version: the owner is their only writer."""

    def __init__(self, folder: Folder) -> None:
        self.folder = folder

    @property
    def location(self) -> str:
        return str(self.folder.root)

    def open(self, model_info: dict, owns: Callable[[str], bool]) -> FolderScan:
        """Create the folders, drop temp files, index blocks and manifests. Manifests that
        fail their checks are quarantined; those under an older version's name move (stems.py)."""
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
        move_folder_manifests(folder, scan)
        if scan.stray_files:  # left alone, and said once: only `cache verify` would list them
            found = scan.strays_counted()
            said = "warm tier %s: %s the server did not write, left alone; `agent-memory cache verify` lists them"
            log.warning(said, folder.root, found)
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


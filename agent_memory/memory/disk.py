"""DiskTier: the warm tier. Block files and agent manifests in one model folder (folder.py),
written behind the request path by one thread and read back by another.

Every write is atomic (blockfile.write_atomic); a crash leaves old or new files and temp files
that the next start removes. Nothing here touches MLX: the engine hands over numpy arrays it
made, and gets numpy arrays back. The writer thread does the copying, checksumming and I/O.
A write that fails (a full disk, a folder planted as a link, a directory where a file should
go) costs that file only: the writer says so once per kind of failure and goes on, and
`write_error` says what failed last until a write succeeds again.
"""

from __future__ import annotations

import itertools
import logging
import queue
import threading
import time
from collections.abc import Callable
from concurrent.futures import Future, ThreadPoolExecutor
from agent_memory.memory import blockfile
from agent_memory.memory.blockfile import BlockFileError, Layout, Tensors
from agent_memory.memory.folder import AgentKey, BlockRecord, Folder, FolderScan, Manifest, tokens_text

log = logging.getLogger(__name__)


class DiskTier:
    def __init__(
        self,
        folder: Folder,
        *,
        fingerprint: str,
        meta: dict[str, str],
        block_layout: Callable[[int], Layout],
        name: str,
        block_tokens: int,
    ) -> None:
        """meta: precision fields every block file carries and must match on read;
        block_layout(n): the tensors a block of n tokens must hold; name and block_tokens:
        the model's name and the block size, for model.json."""
        self.folder = folder
        self.fingerprint = fingerprint
        self.meta = {"fingerprint": fingerprint, **meta}
        self.name = name
        self.block_tokens = block_tokens
        self.block_layout = block_layout
        self.on_saved: Callable[[str, int], None] = lambda block_hash, nbytes: None
        # (priority, order, job): a block's deletion goes before queued writes, so that the
        # disk holds at most one block over its budget while a commit's blocks are written
        # (an eviction's deletions would otherwise wait behind them). Safe: a block is only
        # deleted once its file is written, and a save queued later stays after the delete.
        self._jobs: queue.PriorityQueue = queue.PriorityQueue()
        self._order = itertools.count()
        self._pending: set[str] = set()
        self._logged_errors: set[tuple[str, object]] = set()
        # What the folder may hold on its disk, when less than the configured budget (set at
        # start by engine/warm.py; the store honours it), and why.
        self.budget_bytes: int | None = None
        self.budget_note: str | None = None
        self.write_error: str | None = None  # the last failed job, until a write succeeds
        self.write_error_since: float | None = None  # wall clock
        self.failed_jobs = 0
        self._writer = threading.Thread(target=self._write_loop, name="kv-writer", daemon=True)
        self._reader = ThreadPoolExecutor(1, thread_name_prefix="kv-reader")

    # -- start --------------------------------------------------------------------------

    def model_info(self) -> dict:
        """model.json: what the folder holds, for people and `agent-memory cache`. The string
        fields of `meta` are the ones every block file repeats (checked by `cache verify`)."""
        precision = {k: int(v) for k, v in self.meta.items() if k in ("bits", "group_size")}
        return {"name": self.name, **self.meta, "block_tokens": self.block_tokens, "precision": precision}

    def open(self) -> FolderScan:
        """Create the folders, drop temp files, index blocks and manifests; start writing.
        Manifests that fail their checks are quarantined."""
        self.folder.make()
        # Atomic like every other write: a crash never leaves a torn model.json for the CLI.
        # Written only when it changes, so that a full disk does not stop a start.
        if self.folder.read_model_json()[0] != self.model_info():
            self.folder.write_model_json(self.model_info())
        scan = self.folder.scan(owns=lambda fingerprint: fingerprint == self.fingerprint)
        # Files of an older version, or copied in, may be readable by others: they hold
        # conversations. The scan has stat()ed every file already; only those need a chmod.
        self.folder.make_private(scan.loose)
        for tmp in scan.temp_files:
            self.folder.unlink(tmp.path)
        for path, reason in scan.bad_manifests:
            self.folder.quarantine(path, f"bad manifest: {reason}")
        self._writer.start()
        return scan

    @property
    def alive(self) -> bool:
        """False once the writer thread has died: nothing would reach the disk any more."""
        return self._writer.is_alive()

    # -- writes (queued, in order: a block before the manifest that names it) -----------

    def save_block(self, block: BlockRecord, tensors: Tensors) -> None:
        if block.hash in self._pending:
            return
        self._pending.add(block.hash)
        self._put(("save_block", block, tensors))

    def save_agent(self, manifest: Manifest) -> None:
        self._put(("save_agent", manifest.key, manifest.to_bytes()))

    def delete_block(self, block_hash: str) -> None:
        self._put(("delete_block", block_hash, None), priority=0)

    def delete_agent(self, key: AgentKey) -> None:
        self._put(("delete_agent", key, None))

    def _put(self, job: tuple | None, priority: int = 1) -> None:
        self._jobs.put((priority, next(self._order), job))

    def flush(self) -> None:
        """Wait until every queued write and delete is done."""
        self._jobs.join()

    def close(self) -> None:
        self.flush()
        self._put(None, priority=2)
        self._writer.join()
        self._reader.shutdown()

    def _write_loop(self) -> None:
        while (job := self._jobs.get()[2]) is not None:
            kind, key, data = job
            try:
                self._run_job(kind, key, data)
                if kind.startswith("save"):
                    self.write_error = self.write_error_since = None
            except Exception as e:  # one file's failure must not stop the writer
                self.failed_jobs += 1
                if self.write_error is None:
                    self.write_error_since = time.time()
                self.write_error = f"{kind.replace('_', ' ')} failed: {getattr(e, 'strerror', None) or e}"
                self._log_once(kind, e)
            finally:
                if kind == "save_block":
                    self._pending.discard(key.hash)
                self._jobs.task_done()
        self._jobs.task_done()

    def _run_job(self, kind: str, key, data) -> None:
        if kind == "save_block":
            meta = {**self.meta, **key.meta()}
            path = self.folder.block_path(key.hash)
            self.folder.make_subfolder(path.parent)  # a real folder: a planted link is refused
            nbytes = self.folder.write(path, blockfile.encode(meta, data))
            self.on_saved(key.hash, nbytes)
        elif kind == "save_agent":
            self.folder.write(self.folder.agent_path(key), [data])
        elif kind == "delete_block":
            self.folder.unlink(self.folder.block_path(key))
        elif kind == "delete_agent":
            self.folder.unlink(self.folder.agent_path(key))

    def _log_once(self, kind: str, e: Exception) -> None:
        """Say once per kind of failure what happened and what it means; then stay quiet."""
        key = (kind, getattr(e, "errno", None) or type(e).__name__)
        level = logging.DEBUG if key in self._logged_errors else logging.WARNING
        self._logged_errors.add(key)
        log.log(
            level,
            "disk tier: %s failed (%s); blocks stay in memory or are recomputed%s",
            kind,
            e,
            "" if level == logging.DEBUG else " (said once for this kind of failure)",
            exc_info=not isinstance(e, OSError),
        )

    # -- reads ----------------------------------------------------------------------------

    def read_block(self, block: BlockRecord) -> Future:
        """Future of the block's tensors as numpy; a damaged file is quarantined and raises."""
        expect = {**self.meta, "hash": block.hash, "tokens": tokens_text(block.tokens)}
        layout = self.block_layout(len(block.tokens))
        path = self.folder.block_path(block.hash)

        def read():
            try:
                return blockfile.read(path, expect, layout)[1]
            except BlockFileError as e:
                self.folder.quarantine(path, str(e))
                raise

        return self._reader.submit(read)

    def quarantine_manifest(self, manifest: Manifest, reason: str) -> None:
        if manifest.path is not None:
            self.folder.quarantine(manifest.path, reason)

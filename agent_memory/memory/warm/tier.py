"""WarmTier: block files and agent manifests in a backend (backend.py) — the model folder
(folder/backend.py) or a Redis several servers share (redis/backend.py) — written behind the
request path by one thread and read back by another. No MLX: numpy in, numpy out.

Every write is atomic (files.write_atomic: a crash leaves old or new files and temp files the
next start removes; Redis: one command or one script). A failed write (a full disk, a link
planted for a folder, a Redis that does not answer) costs that write only: said once per kind
of failure, and in `write_error` until a write succeeds. With a shared backend a manifest
write is compare-and-set (`_write_manifest`): no server overwrites a turn it did not see, and
a backend that does not answer is skipped until it does (watch.py).

Each write is a typed job (jobs.py). What the writer does is told to the `TierEvents` (events.py)
given to `start`, which starts the writer: until then writes only queue.
"""
from __future__ import annotations

import itertools
import logging
import queue
import threading
import time
from collections.abc import Callable, Iterable
from concurrent.futures import Future, ThreadPoolExecutor

from agent_memory.agent_key import AgentKey
from agent_memory.memory.warm.format import blockfile
from agent_memory.memory.warm.backend import BackendUsage, WarmBackend
from agent_memory.memory.warm.events import TierEvents
from agent_memory.memory.warm.format.blockfile import Layout, Tensors
from agent_memory.memory.warm.folder.paths import Folder
from agent_memory.memory.warm.folder.backend import FolderBackend
from agent_memory.memory.warm.format.records import BlockRecord, Manifest, tokens_text
from agent_memory.memory.warm.jobs import DeleteAgent, DeleteBlock, Job, SaveBlock, SaveManifest, say_failed
from agent_memory.memory.warm.scan import FolderScan
from agent_memory.memory.warm.watch import TierWatch
from agent_memory.precision import KVPrecision

log = logging.getLogger(__name__)

HEADER_BYTES = 2048  # a block file's safetensors header and metadata, about
CAS_TRIES = 8  # compare-and-set attempts of one manifest write before it gives way


class WarmTier:
    def __init__(
        self,
        backend: WarmBackend | Folder,
        *,
        fingerprint: str,
        precision: KVPrecision,
        block_layout: Callable[[int], Layout],
        name: str,
        block_tokens: int,
        snapshot_layout: Callable[[int], Layout] | None = None,
    ) -> None:
        """backend: where blocks and manifests live (a Folder means FolderBackend(folder)).
        precision: of the blocks' KV, which every block file says and must match on read;
        block_layout(n): the tensors a block of n tokens must hold; snapshot_layout(position):
        those of a snapshot (models with state layers); name and block_tokens: the model's
        name and the block size, for model.json."""
        self.backend = FolderBackend(backend) if isinstance(backend, Folder) else backend
        self.folder = self.backend.folder  # None for a shared backend
        self.shared = self.backend.shared
        self.fingerprint = fingerprint
        self.precision = precision
        self.meta = {"fingerprint": fingerprint, **precision.file_meta()}
        self.name = name
        self.block_tokens = block_tokens
        self.block_layout = block_layout
        self.snapshot_layout = snapshot_layout
        self.events: TierEvents | None = None  # who hears what the writer did (given to `start`)
        self.shard: dict | None = None  # split over processes: this rank's part, in model.json (shards.py)
        self.told: Callable[[str], None] | None = None  # rank 0 split: told each block deleted (its ranks follow)
        # (priority, order, job): a block's deletion goes before queued writes, so that the disk holds
        # at most one block over its budget while a commit's are written (an eviction's would wait
        # behind them). Safe: a block is deleted once its file is written; a later save stays after.
        self._jobs: queue.PriorityQueue = queue.PriorityQueue()
        self._order = itertools.count()
        self._pending: set[str] = set()
        self._logged_errors: set[tuple[str, object]] = set()
        # What the folder may hold on its disk, when less than the configured budget (set at
        # start by folder/room.py; AgentCacheStore evicts to it), and why.
        self.budget_bytes: int | None = None
        self.budget_note: str | None = None
        self.write_error: str | None = None  # the last failed job, until a write succeeds
        self.write_error_since: float | None = None  # wall clock
        self.failed_jobs = 0
        self.watch = TierWatch(self.backend)  # a shared backend: used, or skipped while it does not answer
        self._writer = threading.Thread(target=self._write_loop, name="kv-writer", daemon=True)
        self._reader = ThreadPoolExecutor(1, thread_name_prefix="kv-reader")

    @property
    def location(self) -> str:
        return self.backend.location

    @property
    def usage(self) -> BackendUsage:  # a shared backend's figures, as the watch last read them
        return self.watch.usage

    def layout(self, block: BlockRecord) -> Layout:
        """The tensors a block's (or a snapshot's) file must hold."""
        return self.snapshot_layout(block.start) if block.snapshot else self.block_layout(len(block.tokens))

    @staticmethod
    def file_bytes(layout: Layout) -> int:
        """About what a file of this layout takes in the backend: its tensors and a header."""
        return HEADER_BYTES + blockfile.layout_bytes(layout)

    # -- start --------------------------------------------------------------------------

    def model_info(self) -> dict:
        """model.json: what the folder holds, for people and `agent-memory cache`. The string
        fields of `meta` are the ones every block file repeats (checked by `cache verify`)."""
        p = self.precision
        precision = {"bits": p.bits, "group_size": p.group_size if p.quantized else 0}
        info = {"name": self.name, **self.meta, "block_tokens": self.block_tokens, "precision": precision}
        return info if self.shard is None else {**info, "shard": self.shard}

    def open(self) -> FolderScan:
        """Make the backend ready; what it holds to restore (a folder: every agent; a shared
        backend: nothing, agents are probed when they come back)."""
        scan = self.backend.open(self.model_info(), owns=lambda fingerprint: fingerprint == self.fingerprint)
        if self.shared:
            self.watch.check()  # its first: nothing can have come back yet
        return scan

    def start(self, events: TierEvents) -> None:
        """Start writing what is queued and will be, telling `events` (the index of the blocks,
        made once the tier is open) what each write did."""
        self.events = events
        self._writer.start()

    @property
    def alive(self) -> bool:
        """False once the writer thread has died: nothing would reach the disk any more."""
        return self._writer.is_alive()

    # -- writes (queued, in order: a block before the manifest that names it) -----------

    def save_block(self, block: BlockRecord, tensors: Tensors) -> None:
        if block.hash in self._pending:
            return
        self._pending.add(block.hash)
        self._put(SaveBlock(block, tensors))

    def save_agent(self, manifest: Manifest, base: str | None = None, etag: str | None = None) -> None:
        """Write the agent's manifest; with a shared backend, as version `etag` replacing `base`."""
        self._put(SaveManifest(manifest, base, etag))

    def delete_block(self, block_hash: str, first: bool = True) -> None:
        """`first`: before queued writes (see `_jobs`); a follower rank's go in rank 0's order."""
        if self.told is not None:
            self.told(block_hash)
        self._put(DeleteBlock(block_hash), priority=0 if first else 1)

    def saving(self, block_hash: str) -> bool:  # a save of it queued, not done yet
        return block_hash in self._pending

    def delete_agent(self, key: AgentKey) -> Future:
        """Future of whether the backend had the agent's manifest."""
        done: Future = Future()
        self._put(DeleteAgent(key, done))
        return done

    def _put(self, job: Job | None, priority: int = 1) -> None:
        self._jobs.put((priority, next(self._order), job))

    def flush(self) -> None:
        """Wait until every queued write and delete is done."""
        self._jobs.join()

    def close(self) -> None:
        """Write what is queued and stop (a tier never started, closed at start, writes nothing)."""
        if self.events is not None:
            self.flush()
            self._put(None, priority=2)
            self._writer.join()
        self._reader.shutdown()
        self.backend.close()

    def _write_loop(self) -> None:
        while True:
            try:
                job = self._jobs.get(timeout=self.watch.interval() if self.shared else None)[2]
            except queue.Empty:
                self._check()
                continue
            if job is None:
                break
            started = time.perf_counter()
            try:
                self.watch.guard()  # never skipped: a folder (it always answers)
                self._run_job(job)
                if isinstance(job, (SaveBlock, SaveManifest)):
                    self.write_error = self.write_error_since = None
                    self.events.written(job.kind, job.subject, started)
            except Exception as e:  # one file's failure must not stop the writer
                self.watch.failed(e)
                self.failed_jobs += 1
                if self.write_error is None:
                    self.write_error_since = time.time()
                self.write_error = f"{job.kind.replace('_', ' ')} failed: {getattr(e, 'strerror', None) or e}"
                say_failed(job.kind, e, self._logged_errors)
                if isinstance(job, DeleteAgent):
                    job.done.set_exception(e)
                # A manifest that could not be written stays the agent's latest state here: the
                # next one is compared with the backend's and written over it if it contains it.
            finally:
                if isinstance(job, SaveBlock):
                    self._pending.discard(job.block.hash)
                self._jobs.task_done()
            if self.shared and self.watch.due():
                self._check()
        self._jobs.task_done()

    def _check(self) -> None:
        """The watch's check; a backend back or that lost its data is told to the events."""
        lost = self.watch.check()
        if lost is not None:
            self.events.tier_back(lost)

    def _run_job(self, job: Job) -> None:
        match job:
            case SaveBlock(block, tensors):
                meta = {**self.meta, **block.meta()}
                nbytes = self.backend.put_block(block.hash, blockfile.encode(meta, tensors))
                self.events.block_saved(block.hash, nbytes)
            case SaveManifest(manifest, base, etag):
                self._write_manifest(manifest, base, etag)
            case DeleteBlock(block_hash):
                self.backend.delete_block(block_hash)
            case DeleteAgent(key, done):
                result = self.backend.delete_manifest(key)
                self._free(result.freed)
                done.set_result(result.ok)

    def _write_manifest(self, manifest: Manifest, base: str | None, etag: str | None) -> None:
        """Write a manifest; with a shared backend, compare-and-set: it replaces version `base`.

        If the backend holds another version, a server (or `cache rm`) changed the agent since we
        last saw it. Ours is written over it only if our tokens contain theirs (nothing they
        committed is lost). Otherwise theirs stays: it is the later turn, or another branch of
        the conversation committed first, or the agent was ended (a delete wins over a turn in
        flight). Ours is then dropped and the agent's next turn here adopts the backend's."""
        if not self.shared:
            self.backend.write_manifest(manifest, base, etag or "")
            return
        for _ in range(CAS_TRIES):
            result = self.backend.write_manifest(manifest, base, etag)
            if result.ok:
                self._free(result.freed)
                self.events.manifest_written(manifest.key, etag, True)
                return
            try:
                current = self.backend.read_manifest(manifest.key)
            except ValueError:  # unreadable: ours replaces it
                base = result.current
                continue
            if current is None:
                if base is not None:
                    break  # ended meanwhile
                continue  # made and deleted in between: try again as the first
            theirs, their_etag = current
            if not manifest.extends(theirs):
                break
            base = their_etag
        log.debug("manifest of %s not written: the shared backend holds a later or other turn", manifest.key)
        self.events.manifest_written(manifest.key, etag, False)

    def _free(self, hashes: Iterable[str]) -> None:
        """Delete blocks that no manifest in the shared backend names any more, unless this
        server still uses them (a manifest naming them may be queued here). It never raises: the
        manifest's change succeeded, and a block that cannot be deleted now is only space, which
        its TTL gives back."""
        hashes = list(hashes)
        if not hashes:
            return
        keep = self.events.still_used(hashes)
        try:
            for h in hashes:
                if h not in keep:
                    self.backend.delete_block(h)
        except Exception as e:  # noqa: BLE001 - the manifest write it follows succeeded
            log.info("could not free %d unused blocks in the shared tier (%s): their TTL will expire them", len(hashes), e)

    # -- reads ----------------------------------------------------------------------------

    def read_block(self, block: BlockRecord) -> Future:
        """Future of the block's tensors as numpy; a damaged copy is set aside and raises, a
        missing one raises BlockMissing."""
        expect = {**self.meta, "hash": block.hash, "tokens": tokens_text(block.tokens)}
        return self.watch.submit(self._reader, self.backend.read_block, block.hash, expect, self.layout(block))

    def probe(self, key: AgentKey | None, known: str | None, hashes: list[str]) -> Future:
        """Future of what the shared backend holds for a request (backend.Probe)."""
        return self.watch.submit(self._reader, self.backend.probe, key, known, hashes)

    def quarantine_manifest(self, manifest: Manifest, reason: str) -> None:
        self.backend.quarantine_manifest(manifest, reason)


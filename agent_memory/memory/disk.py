"""DiskTier: the warm tier. Block files and agent manifests under one folder per model and
KV precision, written behind the request path by one thread, read back by another.

    <cache-dir>/kv/<model>-<fingerprint>-<precision>/
        model.json                         what this folder holds (for people and the CLI)
        blocks/<h[:2]>/<hash>.safetensors  one block, content-addressed (blockfile.py)
        agents/<hash of agent id>.json     an agent's manifest: its tokens and block hashes
        quarantine/                        files that failed a check, kept for inspection

Agent ids never become file names: a manifest is named by a hash of the id and holds the id.
Every write is atomic (blockfile.write_atomic); a crash leaves old or new files and temp files
that the next start removes. Nothing here touches MLX: the engine turns payloads into numpy
before they reach this module, and numpy back into payloads after.
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
import queue
import re
import secrets
import threading
import time
from collections.abc import Callable
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path

from agent_memory.memory import blockfile
from agent_memory.memory.blockfile import BlockFileError, Layout, Tensors

log = logging.getLogger(__name__)

HASH_RE = re.compile(r"^[0-9a-f]{32}$")
MANIFEST_VERSION = 1
MAX_MANIFEST_BYTES = 64 << 20
MAX_TOKEN_ID = 2**32  # block hashes pack token ids as uint32 (prefix.py)


def agent_file_stem(agent: str) -> str:
    # surrogatepass: total over every Python string, though the API admits only valid Unicode.
    return hashlib.blake2b(agent.encode("utf-8", "surrogatepass"), digest_size=16).hexdigest()


def tokens_text(tokens) -> str:
    """How token ids are written in block metadata (compared exactly on read)."""
    return json.dumps(list(tokens), separators=(",", ":"))


@dataclass
class Manifest:
    agent: str
    fingerprint: str
    tokens: list[int]
    blocks: list[str]
    last_used: float  # wall clock
    path: Path | None = None

    def to_bytes(self) -> bytes:
        return json.dumps(
            {
                "version": MANIFEST_VERSION,
                "agent": self.agent,
                "fingerprint": self.fingerprint,
                "last_used": self.last_used,
                "blocks": self.blocks,
                "tokens": self.tokens,
            },
            separators=(",", ":"),
        ).encode()

    @classmethod
    def read(cls, path: Path) -> "Manifest":
        """Parse and check a manifest; ValueError says what is wrong with it."""
        if path.stat().st_size > MAX_MANIFEST_BYTES:
            raise ValueError("manifest too large")
        try:
            data = json.loads(path.read_bytes())
        except RecursionError as e:  # deeply nested JSON: a bad file, not a crash
            raise ValueError("manifest nested too deeply") from e
        if not isinstance(data, dict) or data.get("version") != MANIFEST_VERSION:
            raise ValueError("not a manifest of this version")
        agent, tokens, blocks = data.get("agent"), data.get("tokens"), data.get("blocks")
        if not isinstance(agent, str) or agent_file_stem(agent) != path.stem:
            raise ValueError("agent id does not match the file name")
        # Out-of-range ids would raise OverflowError later, in the hash chain.
        if not isinstance(tokens, list) or not all(type(t) is int and 0 <= t < MAX_TOKEN_ID for t in tokens):
            raise ValueError("tokens must be a list of token ids (integers 0 <= id < 2**32)")
        if not isinstance(blocks, list) or not all(isinstance(h, str) and HASH_RE.match(h) for h in blocks):
            raise ValueError("blocks must be a list of block hashes")
        last_used = data.get("last_used")
        if type(last_used) not in (int, float) or not isinstance(data.get("fingerprint"), str):
            raise ValueError("missing fingerprint or last_used")
        if not abs(last_used) < 1e15:  # also false for NaN and inf; float(10**400) would overflow
            raise ValueError("last_used is not a time")
        return cls(agent, data["fingerprint"], tokens, blocks, float(last_used), path)


class DiskLayout:
    """Paths of one model-and-precision folder."""

    def __init__(self, root: Path) -> None:
        self.root = root
        self.blocks = root / "blocks"
        self.agents = root / "agents"
        self.quarantine_dir = root / "quarantine"

    @staticmethod
    def folder_name(model_name: str, fingerprint: str, precision_tag: str) -> str:
        safe = re.sub(r"[^A-Za-z0-9._-]", "_", model_name)[:64] or "model"
        return f"{safe}-{fingerprint[:12]}-{precision_tag}"

    def block_path(self, block_hash: str) -> Path:
        return self.blocks / block_hash[:2] / f"{block_hash}.safetensors"

    def agent_path(self, agent: str) -> Path:
        return self.agents / f"{agent_file_stem(agent)}.json"

    def block_files(self) -> dict[str, Path]:
        """Block hash -> file, for every well-named block file."""
        found = {}
        for sub in _listdir(self.blocks):
            for f in _listdir(sub):
                if f.suffix == ".safetensors" and HASH_RE.match(f.stem) and f.stem[:2] == sub.name:
                    found[f.stem] = f
        return found

    def temp_files(self) -> list[Path]:
        """Leftovers of interrupted atomic writes (model.json's are in the root)."""
        dirs = [self.root, self.agents, *_listdir(self.blocks)]
        return [f for d in dirs for f in _listdir(d) if f.name.endswith(blockfile.TEMP_SUFFIX)]

    def quarantine(self, path: Path, reason: str) -> None:
        """Move a file that failed a check out of the way, with a note saying why. The random
        part keeps two files of one name quarantined in the same second apart."""
        target = self.quarantine_dir / f"{int(time.time())}-{secrets.token_hex(4)}-{path.name}"
        try:
            self.quarantine_dir.mkdir(parents=True, exist_ok=True)
            os.replace(path, target)
            target.with_name(target.name + ".why").write_text(reason + "\n")
        except FileNotFoundError:
            return
        except OSError as e:  # a read-only folder, say: the caller treats the file as bad anyway
            log.warning("could not quarantine %s (%s): %s", path.name, e, reason)
            return
        log.warning("quarantined %s: %s", path.name, reason)


def _listdir(path: Path) -> list[Path]:
    """A folder's entries; none if it is not a folder or vanishes meanwhile (another process
    may prune the cache while the server starts)."""
    try:
        return list(path.iterdir())
    except (FileNotFoundError, NotADirectoryError):
        return []


def _size(path: Path) -> int | None:
    try:
        return path.stat().st_size
    except FileNotFoundError:
        return None


@dataclass
class ScanResult:
    manifests: list[Manifest]
    files: dict[str, int]  # block hash -> file size


class DiskTier:
    def __init__(
        self,
        layout: DiskLayout,
        *,
        fingerprint: str,
        meta: dict[str, str],
        block_layout: Callable[[int], Layout],
        encode: Callable[[object], Tensors],
        name: str | None = None,
        block_tokens: int | None = None,
    ) -> None:
        """meta: precision fields every block file carries and must match on read;
        block_layout(n): the tensors a block of n tokens must hold; encode(payload): tensors;
        name, block_tokens: the model's name and the block size, for model.json."""
        self.layout = layout
        self.fingerprint = fingerprint
        self.meta = {"fingerprint": fingerprint, **meta}
        self.name = name or layout.root.name
        self.block_tokens = block_tokens
        self.block_layout = block_layout
        self.encode = encode
        self.on_saved: Callable[[str, int], None] = lambda block_hash, nbytes: None
        self._jobs: queue.Queue = queue.Queue()
        self._pending: set[str] = set()
        self._logged_errors: set[tuple[str, object]] = set()
        self._writer = threading.Thread(target=self._write_loop, name="kv-writer", daemon=True)
        self._reader = ThreadPoolExecutor(1, thread_name_prefix="kv-reader")

    # -- start --------------------------------------------------------------------------

    def model_info(self) -> dict:
        """model.json: what the folder holds, for people and `agent-memory cache`. The string
        fields of `meta` are the ones every block file repeats (checked by `cache verify`)."""
        info = {"name": self.name, **self.meta}
        if self.block_tokens is not None:
            info["block_tokens"] = self.block_tokens
        info["precision"] = {k: int(v) for k, v in self.meta.items() if k in ("bits", "group_size")}
        return info

    def open(self) -> ScanResult:
        """Create the folders, drop temp files, index blocks and manifests; start writing."""
        for d in (self.layout.blocks, self.layout.agents):
            d.mkdir(parents=True, exist_ok=True)
        # Atomic like every other write: a crash never leaves a torn model.json for the CLI.
        blockfile.write_atomic(self.layout.root / "model.json", [json.dumps(self.model_info(), indent=1).encode()])
        for tmp in self.layout.temp_files():
            tmp.unlink(missing_ok=True)
        sizes = {h: _size(p) for h, p in self.layout.block_files().items()}
        files = {h: n for h, n in sizes.items() if n is not None}
        manifests = []
        for path in sorted(self.layout.agents.glob("*.json")):
            try:
                manifest = Manifest.read(path)
                if manifest.fingerprint != self.fingerprint:
                    raise ValueError("manifest of another model")
                manifests.append(manifest)
            except (OSError, ValueError) as e:
                self.layout.quarantine(path, f"bad manifest: {e}")
        self._writer.start()
        return ScanResult(manifests, files)

    # -- writes (queued; called with the store's lock held) ------------------------------

    def save_block(self, block) -> None:
        if block.hash in self._pending:
            return
        meta = {
            **self.meta,
            "hash": block.hash,
            "parent": block.parent or "",
            "start": str(block.start),
            "tokens": tokens_text(block.tokens),
        }
        chunks = blockfile.encode(meta, self.encode(block.payload))
        self._pending.add(block.hash)
        self._jobs.put(("save_block", block.hash, chunks))

    def save_agent(self, manifest: Manifest) -> None:
        self._jobs.put(("save_agent", manifest.agent, manifest.to_bytes()))

    def delete_block(self, block_hash: str) -> None:
        self._jobs.put(("delete_block", block_hash, None))

    def delete_agent(self, agent: str) -> None:
        self._jobs.put(("delete_agent", agent, None))

    def flush(self) -> None:
        """Wait until every queued write and delete is done."""
        self._jobs.join()

    def close(self) -> None:
        self.flush()
        self._jobs.put(None)
        self._writer.join()
        self._reader.shutdown()

    def _write_loop(self) -> None:
        while (job := self._jobs.get()) is not None:
            kind, key, data = job
            try:
                self._run_job(kind, key, data)
            except Exception as e:  # one file's failure must not stop the writer
                self._log_once(kind, e)
                if kind == "save_block":
                    self._pending.discard(key)
            finally:
                self._jobs.task_done()
        self._jobs.task_done()

    def _run_job(self, kind: str, key: str, data) -> None:
        if kind == "save_block":
            path = self.layout.block_path(key)
            path.parent.mkdir(exist_ok=True)
            nbytes = blockfile.write_atomic(path, data)
            self._pending.discard(key)
            self.on_saved(key, nbytes)
        elif kind == "save_agent":
            blockfile.write_atomic(self.layout.agent_path(key), [data])
        elif kind == "delete_block":
            self.layout.block_path(key).unlink(missing_ok=True)
        elif kind == "delete_agent":
            self.layout.agent_path(key).unlink(missing_ok=True)

    def _log_once(self, kind: str, e: Exception) -> None:
        """Say once per kind of failure what happened and what it means; then stay quiet."""
        key = (kind, getattr(e, "errno", None) or type(e).__name__)
        level = logging.DEBUG if key in self._logged_errors else logging.WARNING
        self._logged_errors.add(key)
        log.log(level, "disk tier: %s failed (%s); blocks stay in memory or are recomputed", kind, e, exc_info=not isinstance(e, OSError))

    # -- reads ----------------------------------------------------------------------------

    def read_block(self, block) -> Future:
        """Future of the block's tensors as numpy; a damaged file is quarantined and raises."""
        expect = {**self.meta, "hash": block.hash, "tokens": tokens_text(block.tokens)}
        layout = self.block_layout(len(block.tokens))
        path = self.layout.block_path(block.hash)

        def read():
            try:
                return blockfile.read(path, expect, layout)[1]
            except BlockFileError as e:
                self.layout.quarantine(path, str(e))
                raise

        return self._reader.submit(read)

    def quarantine_manifest(self, manifest: Manifest, reason: str) -> None:
        if manifest.path is not None:
            self.layout.quarantine(manifest.path, reason)


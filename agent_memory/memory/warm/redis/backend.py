"""RedisBackend: the warm tier in a Redis that several servers share (backend.py says what a
backend is). Any Redis-compatible service that runs Lua scripts will do; tests use Debian's
redis-server. The keys and the scripts are redis/keys.py's.

Blocks: `SET NX EX` (the first writer's bytes stay; equal names are equal bytes), read with
`GETEX` (a read renews the TTL), checked like a file. A damaged block is deleted only if the key
still holds those very bytes (compared by SHA-1 in a script), so a good copy another server has
written meanwhile stays. Every block carries a TTL (BLOCK_TTL_S, renewed by each read and write)
and manifests and reference counts carry none, so with `maxmemory-policy volatile-lru` Redis
evicts least recently used blocks when full and never a manifest: several servers share one
budget, Redis' `maxmemory`, and no server evicts on its own (see docs/scale-out.md).

Manifests: a write names the etag it replaces and is one script: compare, then adjust the
reference counts by the difference between the old and new block lists, then store. Blocks whose
count reaches zero are returned; the caller deletes them. A deletion is one script too.
"""

from __future__ import annotations

import hashlib
import json
import logging
import secrets
from collections.abc import Callable, Iterable

import numpy as np

from agent_memory.agent_key import AgentKey
from agent_memory.memory.warm.format import blockfile
from agent_memory.memory.warm.backend import BackendUsage, BlockMissing, ManifestWrite, Probe, WarmBackend
from agent_memory.memory.warm.format.blockfile import Layout
from agent_memory.memory.warm.format.records import Manifest
from agent_memory.memory.warm.redis.keys import (
    BLOCK_TTL_S,
    CAS_MANIFEST,
    DELETE_MANIFEST,
    DISCARD_BLOCK,
    FETCH_IF_CHANGED,
    RedisNamespace,
)
from agent_memory.memory.warm.scan import FolderScan
from agent_memory.memory.warm.stems import move_redis_manifests

log = logging.getLogger(__name__)


class RedisBackend(WarmBackend):
    shared = True

    def __init__(self, url: str, namespace: str, *, client=None) -> None:
        self.keys = RedisNamespace(url, namespace, client=client)  # where things are, the client, the scripts
        self.model_info: dict | None = None
        self._model_written = False
        self.epoch: str | None = None  # the namespace's epoch key as this server last saw it

    @property
    def location(self) -> str:
        return self.keys.location

    # -- start -----------------------------------------------------------------------------

    def open(self, model_info: dict, owns: Callable[[str], bool]) -> FolderScan:
        """Nothing is restored at start: an agent's manifest is read when the agent comes back
        (probe), since most agents of a shared tier belong to other servers. A Redis that does
        not answer yet is no failed start: every read is a miss and every write fails (on
        /health) until it answers."""
        self.model_info = model_info
        try:
            self._write_model_info()
            move_redis_manifests(self.keys)
            usage = self.check()[0]
            if usage.note:
                log.warning("warm tier %s: %s", self.location, usage.note)
        except Exception as e:  # noqa: BLE001 - redis' errors: the tier starts degraded
            log.warning("warm tier %s does not answer (%s): misses until it does", self.location, e)
        return FolderScan()

    def _write_model_info(self) -> None:
        if not self._model_written and self.model_info is not None:
            self.keys.client.set(self.keys.model_key, json.dumps(self.model_info, sort_keys=True))
            self._model_written = True

    # -- blocks ----------------------------------------------------------------------------

    def put_block(self, block_hash: str, chunks: list) -> int:
        self._write_model_info()
        data = b"".join(chunks)  # memoryviews joined as they are: one copy
        key = self.keys.block_key(block_hash)
        pipe = self.keys.client.pipeline(transaction=False)
        pipe.set(key, data, nx=True, ex=BLOCK_TTL_S)
        pipe.expire(key, BLOCK_TTL_S)  # already there: it is in use again
        pipe.execute()
        return len(data)

    def get_block_bytes(self, block_hash: str) -> bytes | None:
        return self.keys.client.getex(self.keys.block_key(block_hash), ex=BLOCK_TTL_S)

    def read_block(self, block_hash: str, expect: dict[str, str], layout: Layout) -> dict[str, np.ndarray]:
        data = self.get_block_bytes(block_hash)
        if data is None:
            raise BlockMissing(block_hash)
        try:
            return blockfile.read_bytes(data, expect, layout)[1]
        except blockfile.BlockFileError as e:
            gone = self.keys.script(DISCARD_BLOCK)(keys=[self.keys.block_key(block_hash)], args=[hashlib.sha1(data).hexdigest()])
            log.warning(
                "damaged block %s in %s (%s): %s; it is recomputed and written again",
                block_hash[:16],
                self.location,
                e,
                "deleted" if gone else "already replaced",
            )
            raise

    def delete_block(self, block_hash: str) -> None:
        self.keys.client.delete(self.keys.block_key(block_hash))

    # -- manifests -------------------------------------------------------------------------

    def read_manifest(self, key: AgentKey) -> tuple[Manifest, str] | None:
        name = self.keys.manifest_key(key)
        etag, data = self.keys.client.hmget(name, ["etag", "data"])
        if etag is None or data is None:
            return None
        return self.keys.parse_manifest(name, data), etag.decode()

    def write_manifest(self, manifest: Manifest, base: str | None, etag: str) -> ManifestWrite:
        self._write_model_info()
        blocks = " ".join(dict.fromkeys(manifest.names))
        out = self.keys.script(CAS_MANIFEST)(
            keys=[self.keys.manifest_key(manifest.key), self.keys.refs_key],
            args=[base or "", etag, manifest.to_bytes(), blocks],
        )
        if int(out[0]) == 1:
            return ManifestWrite(True, etag, [h.decode() for h in out[2:]])
        return ManifestWrite(False, out[1].decode() or None)

    def delete_manifest(self, key: AgentKey) -> ManifestWrite:
        out = self.keys.script(DELETE_MANIFEST)(keys=[self.keys.manifest_key(key), self.keys.refs_key], args=[])
        return ManifestWrite(bool(int(out[0])), None, [h.decode() for h in out[1:]])

    def quarantine_manifest(self, manifest: Manifest, reason: str) -> None:
        """A manifest whose blocks do not match its tokens: the next write of the agent replaces it."""
        log.warning("manifest of an agent in %s is unusable (%s): it is ignored", self.location, reason)

    def probe(self, key: AgentKey | None, known: str | None, hashes: Iterable[str]) -> Probe:
        """One round trip: the agent's manifest if its etag is not `known`, and which blocks exist."""
        hashes = list(hashes)
        pipe = self.keys.client.pipeline(transaction=False)
        name = self.keys.manifest_key(key) if key is not None else None
        if name is not None:
            self.keys.script(FETCH_IF_CHANGED)(keys=[name], args=[known or ""], client=pipe)
        for h in hashes:
            pipe.strlen(self.keys.block_key(h))
        out = pipe.execute()
        manifest: tuple[Manifest, str] | None | bool = True
        if name is not None:
            found, out = out[0], out[1:]
            if not found:
                manifest = None
            elif len(found) == 2:
                try:
                    manifest = (self.keys.parse_manifest(name, found[1]), found[0].decode())
                except ValueError as e:
                    log.warning("unreadable manifest %s in %s: %s", name, self.location, e)
                    manifest = True  # as if unchanged: the next write replaces it
        return Probe(known, manifest, {h: n for h, n in zip(hashes, out) if n})

    # -- budget ----------------------------------------------------------------------------

    def usage(self) -> BackendUsage:
        return self._usage(self.keys.client.info("memory"))

    @staticmethod
    def _usage(info: dict) -> BackendUsage:
        used, limit, policy = info.get("used_memory"), info.get("maxmemory") or None, info.get("maxmemory_policy")
        note = None
        if not limit:
            note = "Redis has no maxmemory: nothing bounds the warm tier (set maxmemory and maxmemory-policy volatile-lru)"
        elif str(policy).startswith("allkeys-"):
            note = f"maxmemory-policy {policy} may evict agents' manifests: use volatile-lru (only blocks carry a TTL)"
        elif policy == "noeviction":
            note = "maxmemory-policy noeviction: writes fail once Redis is full; use volatile-lru"
        return BackendUsage(used, limit, policy, note)

    def check(self) -> tuple[BackendUsage, bool]:
        """Usage, and whether Redis lost its data since the last check: the namespace's epoch
        key, set by the first server to find it absent and never evicted (it has no TTL), is
        gone, or another server found it gone and set a new one."""
        pipe = self.keys.client.pipeline(transaction=False)
        pipe.get(self.keys.epoch_key)
        pipe.info("memory")
        found, info = pipe.execute()
        if found is None:  # SET NX, then GET: Redis 6.2 takes no GET with NX
            self.keys.client.set(self.keys.epoch_key, secrets.token_hex(8), nx=True)
            found = self.keys.client.get(self.keys.epoch_key)
        epoch = found.decode() if found is not None else None
        lost = self.epoch is not None and epoch != self.epoch
        self.epoch = epoch
        if lost:  # the model key went too: the `cache` commands find the namespace by it
            self._model_written = False
            self._write_model_info()
        return self._usage(info), lost

    def unreachable(self, e: BaseException) -> bool:
        import redis

        return isinstance(e, (redis.ConnectionError, redis.TimeoutError, OSError))

    def close(self) -> None:
        self.keys.close()

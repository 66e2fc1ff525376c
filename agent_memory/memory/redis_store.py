"""RedisStore: the warm tier in a Redis that several servers share (warmstore.py says what a
store is). Any Redis-compatible service that runs Lua scripts will do; tests use Debian's
redis-server.

Keys, for a namespace `ns` (the folder name: `<model>-<fingerprint>-<precision>`):

    am:{ns}:model      string  model.json: what the namespace holds (for people and the CLI)
    am:{ns}:m:<stem>   hash    an agent's manifest: etag, data (the manifest file's JSON), blocks
    am:{ns}:refs       hash    block hash -> how many manifests name it
    am:ns:b:<hash>     string  a block: the very bytes of its block file, with a TTL

`{ns}` is a hash tag: manifests and the reference counts share a slot, so one Lua script changes
both at once (in Redis Cluster too), while blocks spread over every slot. <stem> is the manifest
file's name (a hash of tenant and agent id): agent ids never become key names.

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
import io
import json
import logging
import threading
import time
from collections.abc import Callable, Iterable
from pathlib import PurePosixPath
from urllib.parse import urlsplit, urlunsplit

import numpy as np

from agent_memory.memory import blockfile
from agent_memory.memory.blockfile import Layout
from agent_memory.memory.folder import (
    HASH_RE,
    AgentKey,
    FileInfo,
    FolderScan,
    Manifest,
    agent_file_stem,
)
from agent_memory.memory.warmstore import BlockMissing, ManifestWrite, Probe, StoreUsage, WarmStore

log = logging.getLogger(__name__)

PREFIX = "am"
BLOCK_TTL_S = 30 * 86400  # an unused block expires after 30 days (each read or write renews it)
SCAN_COUNT = 1000
SCHEMES = ("redis", "rediss", "unix")

# KEYS: manifest, refs. ARGV: base etag ("" = none), new etag, data, blocks (space-separated).
# Returns {1, etag, freed...} or {0, current etag ("" = none)}.
CAS_MANIFEST = """
local cur = redis.call('HGET', KEYS[1], 'etag') or ''
if cur ~= ARGV[1] then return {0, cur} end
local old, new = {}, {}
local was = redis.call('HGET', KEYS[1], 'blocks')
if was then for h in string.gmatch(was, '%x+') do old[h] = true end end
for h in string.gmatch(ARGV[4], '%x+') do
  if not new[h] then
    new[h] = true
    if not old[h] then redis.call('HINCRBY', KEYS[2], h, 1) end
  end
end
local out = {1, ARGV[2]}
for h in pairs(old) do
  if not new[h] and redis.call('HINCRBY', KEYS[2], h, -1) <= 0 then
    redis.call('HDEL', KEYS[2], h)
    table.insert(out, h)
  end
end
redis.call('HSET', KEYS[1], 'etag', ARGV[2], 'data', ARGV[3], 'blocks', ARGV[4])
return out
"""

# KEYS: manifest, refs. Returns {existed (0/1), freed...}.
DELETE_MANIFEST = """
local was = redis.call('HGET', KEYS[1], 'blocks')
if not was then return {0} end
local out, seen = {1}, {}
for h in string.gmatch(was, '%x+') do
  if not seen[h] then
    seen[h] = true
    if redis.call('HINCRBY', KEYS[2], h, -1) <= 0 then
      redis.call('HDEL', KEYS[2], h)
      table.insert(out, h)
    end
  end
end
redis.call('DEL', KEYS[1])
return out
"""

# KEYS: manifest. ARGV: the etag the caller knows. Returns {} (none), {etag} (unchanged) or {etag, data}.
FETCH_IF_CHANGED = """
local cur = redis.call('HGET', KEYS[1], 'etag')
if not cur then return {} end
if cur == ARGV[1] then return {cur} end
return {cur, redis.call('HGET', KEYS[1], 'data')}
"""

# KEYS: block. ARGV: SHA-1 of the bytes found damaged. Deletes them only if they are still there.
DISCARD_BLOCK = """
local v = redis.call('GET', KEYS[1])
if v and redis.sha1hex(v) == ARGV[1] then redis.call('DEL', KEYS[1]) return 1 end
return 0
"""


class RedisPath(PurePosixPath):
    """A Redis key where the `cache` commands show a path: redis://host:port/db/key."""

    def __str__(self) -> str:
        text = super().__str__()
        return "redis:/" + text if text.startswith("/") else text


def check_url(url: str) -> str:
    """ValueError unless `url` is a Redis URL this server can use."""
    parts = urlsplit(url)
    if parts.scheme not in SCHEMES:
        raise ValueError(f"takes redis://HOST:PORT/DB (or rediss://, unix://), not {redact(url)!r}")
    if parts.scheme != "unix" and not parts.hostname:
        raise ValueError(f"names no host: {redact(url)!r}")
    return url


def redact(url: str) -> str:
    """The URL without its password, for logs, /health and `settings:`."""
    parts = urlsplit(url)
    if parts.password is None:
        return url
    netloc = parts.netloc.rsplit("@", 1)[1]
    user = f"{parts.username}:***@" if parts.username else ":***@"
    return urlunsplit(parts._replace(netloc=user + netloc))


def connect(url: str):
    """A client (a pool of connections, safe across threads). Failures surface per command."""
    import redis
    from redis.backoff import ExponentialBackoff
    from redis.retry import Retry

    return redis.Redis.from_url(
        url,
        socket_timeout=5,
        socket_connect_timeout=2,
        health_check_interval=30,
        retry=Retry(ExponentialBackoff(cap=0.5, base=0.05), 2),
    )


def store_root(url: str) -> RedisPath:
    """Where a Redis shows in paths: redis://host:port/db (no password)."""
    parts = urlsplit(url)
    if parts.scheme == "unix":
        return RedisPath("/" + parts.path.strip("/"))
    db = parts.path.strip("/") or "0"
    return RedisPath(f"/{parts.hostname}:{parts.port or 6379}/{db}")


def namespaces(url: str) -> list[RedisStore]:
    """Every namespace a Redis holds (by its model key), for the `cache` commands."""
    client = connect(url)
    names = set()
    for key in client.scan_iter(match=f"{PREFIX}:{{*}}:model", count=SCAN_COUNT):
        key = key.decode(errors="replace")
        names.add(key[len(PREFIX) + 2 : -len("}:model")])
    return [RedisStore(url, name, client=client) for name in sorted(names)]


class RedisStore(WarmStore):
    shared = True

    def __init__(self, url: str, namespace: str, *, client=None) -> None:
        self.url = url
        self.ns = namespace
        self._client = client
        self._lock = threading.Lock()
        self._scripts: dict[str, object] = {}
        self.evicts_itself = False  # known once the policy is read (usage)
        self.model_info: dict | None = None
        self._model_written = False
        self.root = store_root(url)

    # -- keys ------------------------------------------------------------------------------

    @property
    def location(self) -> str:
        return redact(self.url)

    @property
    def name(self) -> str:
        return self.ns

    @property
    def model_key(self) -> str:
        return f"{PREFIX}:{{{self.ns}}}:model"

    @property
    def refs_key(self) -> str:
        return f"{PREFIX}:{{{self.ns}}}:refs"

    def manifest_key(self, key: AgentKey | str) -> str:
        return f"{PREFIX}:{{{self.ns}}}:m:{agent_file_stem(key)}"

    def block_key(self, block_hash: str) -> str:
        return f"{PREFIX}:{self.ns}:b:{block_hash}"

    @property
    def client(self):
        if self._client is None:
            with self._lock:
                if self._client is None:
                    self._client = connect(self.url)
        return self._client

    def _script(self, source: str):
        if source not in self._scripts:
            self._scripts[source] = self.client.register_script(source)
        return self._scripts[source]

    # -- start -----------------------------------------------------------------------------

    def open(self, model_info: dict, owns: Callable[[str], bool]) -> FolderScan:
        """Nothing is restored at start: an agent's manifest is read when the agent comes back
        (probe), since most agents of a shared store belong to other servers. A Redis that does
        not answer yet is no failed start: every read is a miss and every write fails (on
        /health) until it answers."""
        self.model_info = model_info
        try:
            self._write_model_info()
            usage = self.usage()
            if usage.note:
                log.warning("warm tier %s: %s", self.location, usage.note)
        except Exception as e:  # noqa: BLE001 - redis' errors: the tier starts degraded
            log.warning("warm tier %s does not answer (%s): misses until it does", self.location, e)
        return FolderScan()

    def _write_model_info(self) -> None:
        if not self._model_written and self.model_info is not None:
            self.client.set(self.model_key, json.dumps(self.model_info, sort_keys=True))
            self._model_written = True

    # -- blocks ----------------------------------------------------------------------------

    def put_block(self, block_hash: str, chunks: list) -> int:
        self._write_model_info()
        data = b"".join(bytes(c) if isinstance(c, memoryview) else c for c in chunks)
        key = self.block_key(block_hash)
        pipe = self.client.pipeline(transaction=False)
        pipe.set(key, data, nx=True, ex=BLOCK_TTL_S)
        pipe.expire(key, BLOCK_TTL_S)  # already there: it is in use again
        pipe.execute()
        return len(data)

    def get_block_bytes(self, block_hash: str) -> bytes | None:
        return self.client.getex(self.block_key(block_hash), ex=BLOCK_TTL_S)

    def read_block(self, block_hash: str, expect: dict[str, str], layout: Layout) -> dict[str, np.ndarray]:
        data = self.get_block_bytes(block_hash)
        if data is None:
            raise BlockMissing(block_hash)
        try:
            return blockfile.read_bytes(data, expect, layout)[1]
        except blockfile.BlockFileError as e:
            gone = self._script(DISCARD_BLOCK)(keys=[self.block_key(block_hash)], args=[hashlib.sha1(data).hexdigest()])
            log.warning(
                "damaged block %s in %s (%s): %s; it is recomputed and written again",
                block_hash[:16],
                self.location,
                e,
                "deleted" if gone else "already replaced",
            )
            raise

    def delete_block(self, block_hash: str) -> None:
        self.client.delete(self.block_key(block_hash))

    def block_sizes(self, hashes: Iterable[str]) -> dict[str, int]:
        hashes = list(hashes)
        pipe = self.client.pipeline(transaction=False)
        for h in hashes:
            pipe.strlen(self.block_key(h))
        return {h: n for h, n in zip(hashes, pipe.execute()) if n}

    # -- manifests -------------------------------------------------------------------------

    def _parse(self, key_name: str, data: bytes) -> Manifest:
        return Manifest.parse(data, key_name.rsplit(":", 1)[1], self.root / key_name)

    def read_manifest(self, key: AgentKey) -> tuple[Manifest, str] | None:
        name = self.manifest_key(key)
        etag, data = self.client.hmget(name, ["etag", "data"])
        if etag is None or data is None:
            return None
        return self._parse(name, data), etag.decode()

    def write_manifest(self, manifest: Manifest, base: str | None, etag: str) -> ManifestWrite:
        self._write_model_info()
        blocks = " ".join(dict.fromkeys(manifest.blocks))
        out = self._script(CAS_MANIFEST)(
            keys=[self.manifest_key(manifest.key), self.refs_key],
            args=[base or "", etag, manifest.to_bytes(), blocks],
        )
        if int(out[0]) == 1:
            return ManifestWrite(True, etag, [h.decode() for h in out[2:]])
        return ManifestWrite(False, out[1].decode() or None)

    def delete_manifest(self, key: AgentKey) -> ManifestWrite:
        out = self._script(DELETE_MANIFEST)(keys=[self.manifest_key(key), self.refs_key], args=[])
        return ManifestWrite(bool(int(out[0])), None, [h.decode() for h in out[1:]])

    def quarantine_manifest(self, manifest: Manifest, reason: str) -> None:
        """A manifest whose blocks do not match its tokens: the next write of the agent replaces it."""
        log.warning("manifest of an agent in %s is unusable (%s): it is ignored", self.location, reason)

    def probe(self, key: AgentKey | None, known: str | None, hashes: Iterable[str]) -> Probe:
        """One round trip: the agent's manifest if its etag is not `known`, and which blocks exist."""
        hashes = list(hashes)
        pipe = self.client.pipeline(transaction=False)
        name = self.manifest_key(key) if key is not None else None
        if name is not None:
            self._script(FETCH_IF_CHANGED)(keys=[name], args=[known or ""], client=pipe)
        for h in hashes:
            pipe.strlen(self.block_key(h))
        out = pipe.execute()
        manifest: tuple[Manifest, str] | None | bool = True
        if name is not None:
            found, out = out[0], out[1:]
            if not found:
                manifest = None
            elif len(found) == 2:
                try:
                    manifest = (self._parse(name, found[1]), found[0].decode())
                except ValueError as e:
                    log.warning("unreadable manifest %s in %s: %s", name, self.location, e)
                    manifest = True  # as if unchanged: the next write replaces it
        return Probe(known, manifest, {h: n for h, n in zip(hashes, out) if n})

    # -- budget ----------------------------------------------------------------------------

    def usage(self) -> StoreUsage:
        info = self.client.info("memory")
        used, limit, policy = info.get("used_memory"), info.get("maxmemory") or None, info.get("maxmemory_policy")
        self.evicts_itself = bool(limit) and str(policy).startswith("volatile-")
        note = None
        if not limit:
            note = "Redis has no maxmemory: nothing bounds the warm tier (set maxmemory and maxmemory-policy volatile-lru)"
        elif str(policy).startswith("allkeys-"):
            note = f"maxmemory-policy {policy} may evict agents' manifests: use volatile-lru (only blocks carry a TTL)"
        elif policy == "noeviction":
            note = "maxmemory-policy noeviction: writes fail once Redis is full; use volatile-lru"
        return StoreUsage(used, limit, policy, note)

    def close(self) -> None:
        if self._client is not None:
            self._client.close()

    # -- the `cache` commands' view (Folder's interface, on keys) -----------------------------

    def read_model_json(self) -> tuple[dict, str | None]:
        raw = self.client.get(self.model_key)
        if raw is None:
            return {}, "no model key"
        try:
            data = json.loads(raw)
        except ValueError as e:
            return {}, f"unreadable model key: {e}"
        return (data, None) if isinstance(data, dict) else ({}, "the model key is not a JSON object")

    def read_server_json(self) -> None:
        """Servers of a shared store are not recorded: agents are deleted in Redis itself, and a
        server that holds one finds it gone on its next turn (a delete wins)."""
        return None

    def scan(self, owns: Callable[[str], bool]) -> FolderScan:
        """Every manifest and block of the namespace, as a folder scan (paths are keys)."""
        scan, client, now = FolderScan(), self.client, time.time()
        names = [k.decode() for k in client.scan_iter(match=f"{PREFIX}:{{{self.ns}}}:m:*", count=SCAN_COUNT)]
        for start in range(0, len(names), 500):
            chunk = names[start : start + 500]
            pipe = client.pipeline(transaction=False)
            for name in chunk:
                pipe.hget(name, "data")
            for name, data in zip(chunk, pipe.execute()):
                path = self.root / name
                if data is None:
                    continue  # deleted meanwhile
                try:
                    manifest = self._parse(name, data)
                    if not owns(manifest.fingerprint):
                        raise ValueError("manifest of another model")
                    scan.manifests.append(manifest)
                except (ValueError, RecursionError) as e:
                    scan.bad_manifests.append((path, str(e) or type(e).__name__))
        keys = [k.decode() for k in client.scan_iter(match=f"{PREFIX}:{self.ns}:b:*", count=SCAN_COUNT)]
        for start in range(0, len(keys), 500):
            chunk = keys[start : start + 500]
            pipe = client.pipeline(transaction=False)
            for key in chunk:
                pipe.strlen(key)
                pipe.pttl(key)
            out = pipe.execute()
            for i, key in enumerate(chunk):
                size, ttl = out[2 * i], out[2 * i + 1]
                block_hash = key.rsplit(":", 1)[1]
                if not size:
                    continue
                info = FileInfo(self.root / key, size, now - (BLOCK_TTL_S - ttl / 1000 if ttl > 0 else 0))
                if HASH_RE.match(block_hash):
                    scan.blocks[block_hash] = info
                else:
                    scan.stray_files.append(info)
        return scan

    def unlink(self, path: PurePosixPath) -> bool:
        """Delete a manifest (its blocks' counts go down with it) or a block no manifest names."""
        name = path.name
        if name.startswith(f"{PREFIX}:{{{self.ns}}}:m:"):
            out = self._script(DELETE_MANIFEST)(keys=[name, self.refs_key], args=[])
            return bool(int(out[0]))
        block_hash = name.rsplit(":", 1)[1]
        if self.client.hexists(self.refs_key, block_hash):
            return False  # a manifest names it now (a server wrote one meanwhile)
        return bool(self.client.delete(name))

    def size_at(self, path: PurePosixPath) -> int:
        name = path.name
        if ":m:" in name:
            return int(self.client.hstrlen(name, "data"))
        return int(self.client.strlen(name))

    def manifest_at(self, path: PurePosixPath) -> Manifest:
        data = self.client.hget(path.name, "data")
        if data is None:
            raise FileNotFoundError(str(path))
        return self._parse(path.name, data)

    def read_block_at(self, path: PurePosixPath, expect: dict[str, str], layout: Layout | None):
        data = self.client.get(path.name)
        if data is None:
            raise FileNotFoundError(str(path))
        return blockfile.read_bytes(data, expect, layout)

    def block_meta_at(self, info: FileInfo) -> dict[str, str]:
        data = self.client.get(info.path.name)
        if data is None:
            raise FileNotFoundError(str(info.path))
        return blockfile.read_header(io.BytesIO(data), len(data))[0]

"""The `cache` commands' view of a namespace in a shared Redis: Folder's interface (folder/paths.py)
on keys, so that ls/show/verify/rm/prune work on the shared tier as on a cache folder. Paths
are keys (redis/url.py's RedisPath); the layout is redis/keys.py's."""

from __future__ import annotations

import io
import json
import time
from collections.abc import Callable
from pathlib import PurePosixPath

from agent_memory.memory.warm.format import blockfile
from agent_memory.memory.warm.format.blockfile import Layout
from agent_memory.memory.warm.format.records import HASH_RE, Manifest
from agent_memory.memory.warm.redis.keys import BLOCK_TTL_S, DELETE_MANIFEST, PREFIX, SCAN_COUNT, RedisNamespace
from agent_memory.memory.warm.redis.url import connect
from agent_memory.memory.warm.scan import FileInfo, FolderScan


def namespaces(url: str) -> list[RedisFolder]:
    """Every namespace a Redis holds (by its model key), for the `cache` commands."""
    client = connect(url)
    names = set()
    for key in client.scan_iter(match=f"{PREFIX}:{{*}}:model", count=SCAN_COUNT):
        key = key.decode(errors="replace")
        names.add(key[len(PREFIX) + 2 : -len("}:model")])
    return [RedisFolder(url, name, client=client) for name in sorted(names)]


class RedisFolder(RedisNamespace):
    """A namespace as the `cache` commands read a model folder (paths are keys)."""

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
        """Servers of a shared tier are not recorded: agents are deleted in Redis itself, and a
        server that holds one finds it gone on its next turn (a delete wins)."""
        return None

    def scan(self, owns: Callable[[str], bool]) -> FolderScan:
        """Every manifest and block of the namespace, as a folder scan (paths are keys)."""
        scan, client, now = FolderScan(), self.client, time.time()
        names = [k.decode() for k in client.scan_iter(match=self.manifest_pattern, count=SCAN_COUNT)]
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
                    manifest = self.parse_manifest(name, data)
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
            out = self.script(DELETE_MANIFEST)(keys=[name, self.refs_key], args=[])
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
        return self.parse_manifest(path.name, data)

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

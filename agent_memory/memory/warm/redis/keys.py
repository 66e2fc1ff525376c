"""Where a namespace's things are in a Redis, and the Lua scripts that change several of them at
once: what the server's backend (RedisBackend, redis/backend.py) and the `cache` commands' view
of it (RedisFolder, redis/folder.py) share.

Keys, for a namespace `ns` (the folder name: `<model>-<fingerprint>-<precision>`):

    am:{ns}:model      string  model.json: what the namespace holds (for people and the CLI)
    am:{ns}:m:<stem>   hash    an agent's manifest: etag, data (the manifest file's JSON), blocks
    am:{ns}:refs       hash    block hash -> how many manifests name it
    am:{ns}:epoch      string  set by the first server to find it absent: gone means Redis lost its data
    am:{ns}:stems      string  "2" once older versions' manifest names are moved (stems.py)
    am:ns:b:<hash>     string  a block: the very bytes of its block file, with a TTL

`{ns}` is a hash tag: manifests and the reference counts share a slot, so one Lua script changes
both at once, and would share a slot in Redis Cluster, while blocks would spread over every slot
(the client here is a single node's: Cluster is not supported yet, docs/scale-out.md). <stem>
is the manifest file's name (a hash of tenant, agent id and kind): agent ids never become key names.
"""

from __future__ import annotations

import threading

from agent_memory.agent_key import AgentKey, agent_file_stem
from agent_memory.memory.warm.format.records import Manifest
from agent_memory.memory.warm.redis.url import connect, redact, store_root

PREFIX = "am"
BLOCK_TTL_S = 30 * 86400  # an unused block expires after 30 days (each read or write renews it)
SCAN_COUNT = 1000

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

# KEYS: a manifest under its legacy name, its name, refs. ARGV: the etag read there. Moves it
# if unchanged; when its name is taken already (a newer server wrote it), drops it and its
# references instead (its blocks expire by their TTL). Returns 1 (moved), 2 (dropped) or 0.
MOVE_MANIFEST = """
if redis.call('HGET', KEYS[1], 'etag') ~= ARGV[1] then return 0 end
if redis.call('EXISTS', KEYS[2]) == 0 then
  redis.call('RENAME', KEYS[1], KEYS[2])
  return 1
end
local seen = {}
for h in string.gmatch(redis.call('HGET', KEYS[1], 'blocks') or '', '%x+') do
  if not seen[h] then
    seen[h] = true
    if redis.call('HINCRBY', KEYS[3], h, -1) <= 0 then redis.call('HDEL', KEYS[3], h) end
  end
end
redis.call('DEL', KEYS[1])
return 2
"""

# KEYS: block. ARGV: SHA-1 of the bytes found damaged. Deletes them only if they are still there.
DISCARD_BLOCK = """
local v = redis.call('GET', KEYS[1])
if v and redis.sha1hex(v) == ARGV[1] then redis.call('DEL', KEYS[1]) return 1 end
return 0
"""


class RedisNamespace:
    """One namespace's keys in a Redis, the client that reaches them and the scripts it runs."""

    def __init__(self, url: str, namespace: str, *, client=None) -> None:
        self.url = url
        self.ns = namespace
        self._client = client
        self._lock = threading.Lock()
        self._scripts: dict[str, object] = {}
        self.root = store_root(url)

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

    @property
    def stems_key(self) -> str:
        return f"{PREFIX}:{{{self.ns}}}:stems"

    @property
    def epoch_key(self) -> str:
        return f"{PREFIX}:{{{self.ns}}}:epoch"

    def manifest_key(self, key: AgentKey | str) -> str:
        return f"{PREFIX}:{{{self.ns}}}:m:{agent_file_stem(key)}"

    @property
    def manifest_pattern(self) -> str:
        """Every manifest key of the namespace, for SCAN."""
        return f"{PREFIX}:{{{self.ns}}}:m:*"

    def block_key(self, block_hash: str) -> str:
        return f"{PREFIX}:{self.ns}:b:{block_hash}"

    @property
    def client(self):
        if self._client is None:
            with self._lock:
                if self._client is None:
                    self._client = connect(self.url)
        return self._client

    def script(self, source: str):
        """A Lua script registered once per namespace."""
        if source not in self._scripts:
            self._scripts[source] = self.client.register_script(source)
        return self._scripts[source]

    def close(self) -> None:
        if self._client is not None:
            self._client.close()

    def parse_manifest(self, key_name: str, data: bytes) -> Manifest:
        """A manifest read from its key (its stem checked against the agent it names)."""
        return Manifest.parse(data, key_name.rsplit(":", 1)[1], self.root / key_name)

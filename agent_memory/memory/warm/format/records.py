"""The records of the warm tier's format, wherever they are stored (a folder, a shared Redis):
an agent's manifest (who it is, its token ids and block hashes; stored under
`agent_file_stem`, or an older version's `legacy_file_stem` until moved at start), what a block
file says about its block, and the record of the server running on a folder. Each parse checks
what it reads: token ids must fit the hash chain's uint32 packing (memory/hashing.py), hashes
must be block hashes. No MLX here.
"""

from __future__ import annotations

import json
import os
import re
from dataclasses import dataclass, field
from pathlib import Path

from agent_memory import files
from agent_memory.agent_key import AGENT, KINDS, AgentKey, agent_file_stem, legacy_file_stem
from agent_memory.memory.hashing import SpanKey, covering

BLOCK_TOKENS = 64  # tokens per block; a sequence's last block may be shorter
HASH_RE = re.compile(r"^[0-9a-f]{32}$")
HEX_RE = re.compile(r"^(?:[0-9a-f]{2}){1,64}$")  # an extra key: up to 64 bytes (a digest)
MANIFEST_VERSION = 1
MAX_MANIFEST_BYTES = 64 << 20
MAX_TOKEN_ID = 2**32  # block hashes pack token ids as uint32 (hashing.py)


def tokens_text(tokens) -> str:
    """How token ids are written in block metadata (compared exactly on read)."""
    return json.dumps(list(tokens), separators=(",", ":"))


def valid_tokens(tokens: object) -> bool:
    return isinstance(tokens, list) and all(type(t) is int and 0 <= t < MAX_TOKEN_ID for t in tokens)


@dataclass(frozen=True)
class BlockRecord:
    """What a block file says about its block, besides the tensors and the folder's fields."""

    hash: str
    parent: str | None
    start: int
    tokens: tuple[int, ...]
    snapshot: bool = False  # a snapshot: no tokens, the state at `start` after the prefix `parent` names
    extras: tuple[SpanKey, ...] = ()  # what fixes its KV beyond its tokens, relative to `start` (hashing.py)

    def meta(self) -> dict[str, str]:
        """The block file's metadata that names the block (WarmTier adds the folder's fields)."""
        parent = self.parent or ""
        meta = {"hash": self.hash, "parent": parent, "start": str(self.start), "tokens": tokens_text(self.tokens)}
        if self.extras:  # only when there are some: a block file without is as before
            meta["extras"] = json.dumps([[s.start, s.end, s.key.hex()] for s in self.extras], separators=(",", ":"))
        return {**meta, "snapshot": "1"} if self.snapshot else meta

    @classmethod
    def from_meta(cls, meta: dict) -> BlockRecord:
        """Parse a block file's metadata; ValueError says what is wrong with it."""
        block_hash, parent, start = meta.get("hash"), meta.get("parent") or None, meta.get("start")
        try:
            tokens = json.loads(meta.get("tokens") or "null")
        except (ValueError, TypeError, RecursionError) as e:
            raise ValueError(f"unreadable token ids: {e}") from e
        if not (isinstance(block_hash, str) and HASH_RE.match(block_hash)):
            raise ValueError("its hash is not a block hash")
        snapshot = meta.get("snapshot") == "1"
        if not valid_tokens(tokens) or bool(tokens) == snapshot:
            raise ValueError("its metadata holds no valid token ids" if not snapshot else "a snapshot holds no tokens")
        if parent is not None and not (isinstance(parent, str) and HASH_RE.match(parent)):
            raise ValueError("its parent is not a block hash")
        if not (isinstance(start, str) and start.isascii() and start.isdigit()):
            raise ValueError("its start position is not a number")
        if snapshot and parent is None:
            raise ValueError("a snapshot names the prefix it follows")
        try:
            spans = json.loads(meta.get("extras") or "[]")
        except (ValueError, TypeError, RecursionError) as e:
            raise ValueError(f"unreadable extras: {e}") from e
        extras = parse_extras(spans, len(tokens), relative=True)
        return cls(block_hash, parent, int(start), tuple(tokens), snapshot, extras)


@dataclass(frozen=True)
class ServerRecord:
    """server.json: a server process serving the folder. While it lives, agents are ended
    through it (the `cache` commands), never by deleting files it still counts."""

    pid: int
    url: str  # base URL, http://host:port
    started: float  # wall clock
    path: Path


def pid_alive(pid: object) -> bool:
    """Whether a process of this id exists (signal 0 checks without sending anything)."""
    if type(pid) is not int or not 0 < pid < 2**31:  # 0 and -1 would name process groups
        return False
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:  # it exists, as another user's process
        return True
    return True


def stems_of(key: AgentKey) -> tuple[str, ...]:
    """The names a manifest of this key may be stored under: its own, and its legacy one."""
    legacy = legacy_file_stem(key)
    return (agent_file_stem(key), legacy) if legacy else (agent_file_stem(key),)


@dataclass
class Manifest:
    """An agent's latest sequence as stored: whose it is, its tokens and their block hashes, and
    the snapshots of its state layers it keeps (position, name), for models that have them."""

    key: AgentKey
    fingerprint: str
    tokens: list[int]
    blocks: list[str]
    last_used: float  # wall clock
    path: Path | None = None
    root: str | None = None  # where its hash chain starts: its namespace (memory/hashing.py)
    snapshots: list[tuple[int, str]] = field(default_factory=list)
    extras: tuple[SpanKey, ...] = ()  # what fixes its KV beyond its tokens (memory/hashing.py)
    # Role -> snapshot name: why it keeps each (memory/index/snapshots.py); written only when it
    # has some, a field older versions pass over, and read as none from their manifests.
    roles: dict[str, str] = field(default_factory=dict)
    # Wall clock until which its memory is kept with priority, on disk too (prompt_cache_retention
    # 24h: memory/index/keep.py); 0: not asked. A field older versions pass over.
    keep_until: float = 0.0
    # When it was pinned against eviction (memory/index/pins.py; wall clock), 0: not pinned.
    # Written only when pinned, a field older versions pass over.
    pinned: float = 0.0
    # (prompt tokens its latest client turn committed, client turns so far): how an unnamed
    # conversation's resend is recognised and a one-off told apart (memory/index/conversations.py);
    # written only when set, read as (0, 0) from older manifests.
    turn: tuple[int, int] = (0, 0)

    def extends(self, theirs: Manifest) -> bool:
        """Whether this sequence contains theirs: the same namespace, their tokens a prefix of ours."""
        n = len(theirs.tokens)
        same = theirs.root == self.root and covering(theirs.extras, 0, n) == covering(self.extras, 0, n)
        return same and n <= len(self.tokens) and self.tokens[:n] == theirs.tokens

    @property
    def names(self) -> list[str]:
        """Every block file it names: its blocks, then its snapshots."""
        return [*self.blocks, *(h for _, h in self.snapshots)]

    def to_bytes(self) -> bytes:
        key = self.key
        data = {
            "version": MANIFEST_VERSION,
            "agent": key.id,
            "fingerprint": self.fingerprint,
            "last_used": self.last_used,
            "blocks": self.blocks,
            "tokens": self.tokens,
        }
        if key.tenant:
            data["tenant"] = key.tenant
        if key.kind != AGENT:
            data["kind"] = key.kind
        if self.root:
            data["root"] = self.root
        if self.snapshots:
            data["snapshots"] = [list(s) for s in self.snapshots]
        if self.extras:  # written only when there are some: a manifest without is as before
            data["extras"] = [[s.start, s.end, s.key.hex()] for s in self.extras]
        if self.roles:
            data["roles"] = self.roles
        if self.keep_until:
            data["keep_until"] = self.keep_until
        if self.pinned:
            data["pinned"] = self.pinned
        if any(self.turn):
            data["turn"] = list(self.turn)
        return json.dumps(data, separators=(",", ":")).encode()

    @classmethod
    def read(cls, path: Path) -> Manifest:
        """Parse and check a manifest; ValueError says what is wrong with it."""
        with files.open_regular(path) as f:
            if os.fstat(f.fileno()).st_size > MAX_MANIFEST_BYTES:
                raise ValueError("manifest too large")
            raw = f.read()
        return cls.parse(raw, path.stem, path)

    @classmethod
    def parse(cls, raw: bytes, stem: str, path: Path | None = None) -> Manifest:
        """Check a manifest's bytes, stored under `stem` (a file name, or a Redis key's end)."""
        if len(raw) > MAX_MANIFEST_BYTES:
            raise ValueError("manifest too large")
        try:
            data = json.loads(raw)
        except RecursionError as e:  # deeply nested JSON: a bad file, not a crash
            raise ValueError("manifest nested too deeply") from e
        if not isinstance(data, dict) or data.get("version") != MANIFEST_VERSION:
            raise ValueError("not a manifest of this version")
        agent, tokens, blocks = data.get("agent"), data.get("tokens"), data.get("blocks")
        tenant, root, kind = data.get("tenant", ""), data.get("root"), data.get("kind", AGENT)
        if not isinstance(tenant, str) or not (root is None or (isinstance(root, str) and HASH_RE.match(root))):
            raise ValueError("tenant must be a string and root a block hash")
        if kind not in KINDS:
            raise ValueError(f"kind must be one of {', '.join(KINDS)}")
        # Under its name, or the name an older version gave it (moved at start: stems.py).
        if not isinstance(agent, str) or stem not in stems_of(key := AgentKey(agent, tenant, kind)):
            raise ValueError("agent id does not match the file name")
        # Out-of-range ids would raise OverflowError later, in the hash chain.
        if not valid_tokens(tokens):
            raise ValueError("tokens must be a list of token ids (integers 0 <= id < 2**32)")
        if not isinstance(blocks, list) or not all(isinstance(h, str) and HASH_RE.match(h) for h in blocks):
            raise ValueError("blocks must be a list of block hashes")
        snapshots = data.get("snapshots", [])
        if not isinstance(snapshots, list) or not all(
            isinstance(s, list) and len(s) == 2 and type(s[0]) is int and 0 < s[0] <= len(tokens)
            and isinstance(s[1], str) and HASH_RE.match(s[1])
            for s in snapshots
        ):
            raise ValueError("snapshots must be a list of [position, hash] within its tokens")
        extras = parse_extras(data.get("extras", []), len(tokens))
        roles = data.get("roles", {})
        if not isinstance(roles, dict) or not all(
            isinstance(r, str) and isinstance(h, str) and h in {s[1] for s in snapshots} for r, h in roles.items()
        ):
            raise ValueError("roles must name its snapshots")
        turn = data.get("turn", [0, 0])
        if not (isinstance(turn, list) and len(turn) == 2 and all(type(n) is int and n >= 0 for n in turn)):
            raise ValueError("turn must be [prompt tokens, turns]")
        if turn[0] > len(tokens):
            raise ValueError("turn must start within its tokens")
        last_used = data.get("last_used")
        if type(last_used) not in (int, float) or not isinstance(data.get("fingerprint"), str):
            raise ValueError("missing fingerprint or last_used")
        if not abs(last_used) < 1e15:  # also false for NaN and inf; float(10**400) would overflow
            raise ValueError("last_used is not a time")
        keep_until = data.get("keep_until", 0.0)
        if type(keep_until) not in (int, float) or not 0 <= keep_until < 1e15:
            raise ValueError("keep_until is not a time")
        pinned = data.get("pinned", 0.0)
        if type(pinned) not in (int, float) or not 0 <= pinned < 1e15:
            raise ValueError("pinned is not a time")
        return cls(
            key, data["fingerprint"], tokens, blocks, float(last_used), path, root, [(p, h) for p, h in snapshots],
            extras, roles, float(keep_until), float(pinned), (turn[0], turn[1]),
        )


def parse_extras(extras: object, n_tokens: int, relative: bool = False) -> tuple[SpanKey, ...]:
    """Spans of extra keys, checked: [start, end, key as hex] within a manifest's tokens, or
    (`relative`: a block file's) over some of a block's."""
    if not isinstance(extras, list) or not all(
        isinstance(s, list) and len(s) == 3 and type(s[0]) is int and type(s[1]) is int and s[0] < s[1]
        and (s[0] < n_tokens and s[1] > 0 if relative else 0 <= s[0] and s[1] <= n_tokens)
        and isinstance(s[2], str) and HEX_RE.match(s[2])
        for s in extras
    ):
        raise ValueError("extras must be a list of [start, end, key as hex] within its tokens")
    return tuple(sorted(SpanKey(s, e, bytes.fromhex(k)) for s, e, k in extras))

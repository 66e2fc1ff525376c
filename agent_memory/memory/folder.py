"""The cache folder's format: where each file lives and what it holds, for the server's disk
tier (disk.py) and the `cache` commands alike. No MLX here.

    <cache-dir>/kv/<model>-<fingerprint>-<precision>/
        model.json                         what this folder holds (for people and the CLI)
        server.json                        the server running on this folder: pid, URL, start
        blocks/<h[:2]>/<hash>.safetensors  one block, content-addressed (blockfile.py)
        agents/<hash of agent id>.json     an agent's manifest: its tokens and block hashes
        quarantine/                        files that failed a check, with a .why note

Agent ids never become file names: a manifest is named by a hash of the id and holds the id.
Nothing here follows a symbolic link inside a model folder or opens anything but a regular
file: a link or a FIFO planted in the folder is listed as stray and otherwise left alone, and
files are written, moved and deleted through their folder's descriptor, opened without
following a link (blockfile.open_dir), so a link planted as blocks/xx/ or quarantine/ leads
nowhere. The model folder itself and `kv` may be links the user placed; they are followed.
Folders are made 0700 and files 0600: they hold every conversation's tokens. A start makes
those it finds readable by others private again (`FolderScan.loose`).
"""

from __future__ import annotations

import errno
import hashlib
import json
import logging
import os
import re
import secrets
import stat
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import NamedTuple

from agent_memory.memory import blockfile

log = logging.getLogger(__name__)

BLOCK_TOKENS = 64  # tokens per block; a sequence's last block may be shorter
HASH_RE = re.compile(r"^[0-9a-f]{32}$")
FOLDER_RE = re.compile(r"^(?P<model>.+)-(?P<fp>[0-9a-f]{12})-(?P<tag>[A-Za-z0-9]+)$")
MANIFEST_VERSION = 1
MAX_MANIFEST_BYTES = 64 << 20
MAX_MODEL_JSON_BYTES = 1 << 20
MAX_TOKEN_ID = 2**32  # block hashes pack token ids as uint32 (hashing.py)
MODEL_JSON = "model.json"
SERVER_JSON = "server.json"
BLOCK_META_KEYS = ("fingerprint", "bits", "group_size")  # model.json fields every block file repeats


def folder_name(model_name: str, fingerprint: str, precision_tag: str) -> str:
    safe = re.sub(r"[^A-Za-z0-9._-]", "_", model_name)[:64] or "model"
    return f"{safe}-{fingerprint[:12]}-{precision_tag}"


class AgentKey(NamedTuple):
    """An agent: its id within its tenant (an API key's name; "" with one key or none). A
    stored Responses-API response is agent-like: kind "response", its id the response id."""

    id: str
    tenant: str = ""
    kind: str = "agent"


def agent_file_stem(key: AgentKey | str) -> str:
    key = AgentKey(key) if isinstance(key, str) else key
    # surrogatepass: total over every Python string, though the API admits only valid Unicode.
    raw = key.id.encode("utf-8", "surrogatepass")
    if key.tenant or key.kind != "agent":
        raw = b"\0".join([key.tenant.encode("utf-8", "surrogatepass"), raw, key.kind.encode()])
    return hashlib.blake2b(raw, digest_size=16).hexdigest()


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

    def meta(self) -> dict[str, str]:
        """The block file's metadata that names the block (DiskTier adds the folder's fields)."""
        parent = self.parent or ""
        return {"hash": self.hash, "parent": parent, "start": str(self.start), "tokens": tokens_text(self.tokens)}

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
        if not tokens or not valid_tokens(tokens):
            raise ValueError("its metadata holds no valid token ids")
        if parent is not None and not (isinstance(parent, str) and HASH_RE.match(parent)):
            raise ValueError("its parent is not a block hash")
        if not (isinstance(start, str) and start.isascii() and start.isdigit()):
            raise ValueError("its start position is not a number")
        return cls(block_hash, parent, int(start), tuple(tokens))


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


@dataclass
class Manifest:
    agent: str
    fingerprint: str
    tokens: list[int]
    blocks: list[str]
    last_used: float  # wall clock
    path: Path | None = None
    tenant: str = ""
    root: str | None = None  # where its hash chain starts: its namespace (hashing.py)
    kind: str = "agent"

    @property
    def key(self) -> AgentKey:
        return AgentKey(self.agent, self.tenant, self.kind)

    def to_bytes(self) -> bytes:
        data = {
            "version": MANIFEST_VERSION,
            "agent": self.agent,
            "fingerprint": self.fingerprint,
            "last_used": self.last_used,
            "blocks": self.blocks,
            "tokens": self.tokens,
        }
        if self.tenant:
            data["tenant"] = self.tenant
        if self.kind != "agent":
            data["kind"] = self.kind
        if self.root:
            data["root"] = self.root
        return json.dumps(data, separators=(",", ":")).encode()

    @classmethod
    def read(cls, path: Path) -> Manifest:
        """Parse and check a manifest; ValueError says what is wrong with it."""
        with blockfile.open_regular(path) as f:
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
        tenant, root, kind = data.get("tenant", ""), data.get("root"), data.get("kind", "agent")
        if not isinstance(tenant, str) or not (root is None or (isinstance(root, str) and HASH_RE.match(root))):
            raise ValueError("tenant must be a string and root a block hash")
        if kind not in ("agent", "response"):
            raise ValueError("kind must be agent or response")
        if not isinstance(agent, str) or agent_file_stem(AgentKey(agent, tenant, kind)) != stem:
            raise ValueError("agent id does not match the file name")
        # Out-of-range ids would raise OverflowError later, in the hash chain.
        if not valid_tokens(tokens):
            raise ValueError("tokens must be a list of token ids (integers 0 <= id < 2**32)")
        if not isinstance(blocks, list) or not all(isinstance(h, str) and HASH_RE.match(h) for h in blocks):
            raise ValueError("blocks must be a list of block hashes")
        last_used = data.get("last_used")
        if type(last_used) not in (int, float) or not isinstance(data.get("fingerprint"), str):
            raise ValueError("missing fingerprint or last_used")
        if not abs(last_used) < 1e15:  # also false for NaN and inf; float(10**400) would overflow
            raise ValueError("last_used is not a time")
        return cls(agent, data["fingerprint"], tokens, blocks, float(last_used), path, tenant, root, kind)


@dataclass(frozen=True)
class FileInfo:
    path: Path
    size: int
    mtime: float


@dataclass
class FolderScan:
    """What one model folder held at one moment."""

    blocks: dict[str, FileInfo] = field(default_factory=dict)  # block hash -> its file
    manifests: list[Manifest] = field(default_factory=list)
    bad_manifests: list[tuple[Path, str]] = field(default_factory=list)
    temp_files: list[FileInfo] = field(default_factory=list)  # leftovers of interrupted writes
    stray_files: list[FileInfo] = field(default_factory=list)  # anything the server did not write
    quarantined: list[FileInfo] = field(default_factory=list)
    # Real folders and regular files (never links) that others may read: (path, the mode they
    # should have). The scan only reports them; the server's start makes them private.
    loose: list[tuple[Path, int]] = field(default_factory=list)

    def note_mode(self, path: Path, st: os.stat_result) -> None:
        want = 0o700 if stat.S_ISDIR(st.st_mode) else 0o600
        if (stat.S_ISDIR(st.st_mode) or stat.S_ISREG(st.st_mode)) and stat.S_IMODE(st.st_mode) != want:
            self.loose.append((path, want))


def entries(folder: Path) -> list[tuple[os.DirEntry, os.stat_result]]:
    """A folder's entries with their own (not followed) stat; none if it is not a real folder or
    vanishes meanwhile (another process may prune the cache while we list it)."""
    try:
        if not stat.S_ISDIR(os.lstat(folder).st_mode):
            return []
        with os.scandir(folder) as it:
            listed = list(it)
    except (FileNotFoundError, NotADirectoryError):
        return []
    out = []
    for entry in sorted(listed, key=lambda e: e.name):
        try:
            out.append((entry, entry.stat(follow_symlinks=False)))
        except FileNotFoundError:
            continue
    return out


def model_folders(kv_dir: Path) -> list[Folder]:
    """The model folders in `<cache-dir>/kv`. `kv` and a model folder may be links, as the
    user placed them (the server follows them too); nothing inside a model folder is followed."""
    try:
        with os.scandir(kv_dir) as it:
            listed = sorted(it, key=lambda e: e.name)
    except (FileNotFoundError, NotADirectoryError):
        return []
    return [Folder(Path(e.path)) for e in listed if e.is_dir()]


def _info(entry: os.DirEntry, st: os.stat_result) -> FileInfo:
    return FileInfo(Path(entry.path), st.st_size, st.st_mtime)


class Folder:
    """One `<model>-<fingerprint>-<precision>` folder: its paths, its listing, its upkeep."""

    def __init__(self, root: Path) -> None:
        self.root = root
        self.blocks = root / "blocks"
        self.agents = root / "agents"
        self.quarantine_dir = root / "quarantine"

    @property
    def name(self) -> str:
        return self.root.name

    def block_path(self, block_hash: str) -> Path:
        return self.blocks / block_hash[:2] / f"{block_hash}.safetensors"

    def agent_path(self, key: AgentKey | str) -> Path:
        return self.agents / f"{agent_file_stem(key)}.json"

    def make(self) -> None:
        """Create the folders, private to this user (existing ones are made private too). The
        model folder and `kv` may be links the user placed; `blocks` and `agents` must be real
        folders (OSError otherwise: the server then runs without its warm tier)."""
        self.root.parent.mkdir(mode=0o700, parents=True, exist_ok=True)
        # The cache's `kv` folder is ours to make private; any other parent is the user's.
        for d in (self.root.parent, self.root) if self.root.parent.name == "kv" else (self.root,):
            d.mkdir(mode=0o700, exist_ok=True)
            _make_private(d, os.stat(d), 0o700)
        for d in (self.blocks, self.agents):
            self.make_subfolder(d)

    def make_subfolder(self, d: Path) -> None:
        """A real, private folder in the model folder (or in blocks/): never a link's target.
        OSError (ENOTDIR) when something else already has its name."""
        parent_fd = self._dir_fd(d.parent)
        try:
            try:
                os.mkdir(d.name, 0o700, dir_fd=parent_fd)
            except FileExistsError:
                pass
            st = os.stat(d.name, dir_fd=parent_fd, follow_symlinks=False)
            if not stat.S_ISDIR(st.st_mode):
                kind = "a link" if stat.S_ISLNK(st.st_mode) else "not a folder"
                raise NotADirectoryError(errno.ENOTDIR, f"{kind}, where the cache keeps a folder", str(d))
        finally:
            os.close(parent_fd)
        _make_private(d, st, 0o700)

    def _dir_fd(self, d: Path) -> int:
        """A folder of this model folder, opened for *at() calls: links the user placed are
        followed only as the model folder itself."""
        return blockfile.open_dir(d, follow=d == self.root)

    def write(self, path: Path, chunks) -> int:
        """Write one of the folder's files atomically (never through a planted link)."""
        return blockfile.write_atomic(path, chunks, follow_parent=path.parent == self.root)

    def unlink(self, path: Path) -> bool:
        """Delete one of the folder's regular files (see unlink_regular)."""
        return unlink_regular(path, follow_parent=path.parent == self.root)

    # What the `cache` commands read, by path; a shared store (redis_store.py) answers the same.

    def size_at(self, path: Path) -> int:
        try:
            return os.lstat(path).st_size
        except FileNotFoundError:
            return 0

    def manifest_at(self, path: Path) -> Manifest:
        return Manifest.read(path)

    def read_block_at(self, path: Path, expect: dict[str, str], layout) -> tuple[dict[str, str], dict]:
        return blockfile.read(path, expect, layout)

    def block_meta_at(self, info: FileInfo) -> dict[str, str]:
        with blockfile.open_regular(info.path) as f:
            return blockfile.read_header(f, info.size)[0]

    def make_private(self, loose: list[tuple[Path, int]]) -> None:
        """chmod what a scan found readable by others; a failure is said once, not fatal."""
        for path, mode in loose:
            try:
                fd = self._dir_fd(path.parent)
                try:
                    st = os.stat(path.name, dir_fd=fd, follow_symlinks=False)
                    if stat.S_ISDIR(st.st_mode) or stat.S_ISREG(st.st_mode):  # still what the scan saw
                        os.chmod(path.name, mode, dir_fd=fd)
                finally:
                    os.close(fd)
            except FileNotFoundError:
                continue
            except OSError as e:
                log.warning("could not make %s private (%s): others may read cached tokens", path, e.strerror or e)
                return
        if loose:
            log.info("made %d files and folders of %s private (0600/0700)", len(loose), self.root)

    def write_model_json(self, info: dict) -> None:
        self.write(self.root / MODEL_JSON, [json.dumps(info, indent=1).encode()])

    def read_model_json(self) -> tuple[dict, str | None]:
        """model.json as a dict ({} if absent) and what is wrong with it, if anything."""
        return self._read_json(MODEL_JSON)

    def _read_json(self, name: str) -> tuple[dict, str | None]:
        try:
            with blockfile.open_regular(self.root / name) as f:
                if os.fstat(f.fileno()).st_size > MAX_MODEL_JSON_BYTES:
                    return {}, f"{name} is too large"
                data = json.loads(f.read())
        except FileNotFoundError:
            return {}, None
        except (OSError, ValueError, RecursionError) as e:
            return {}, f"unreadable {name}: {e}"
        if not isinstance(data, dict):
            return {}, f"{name} is not a JSON object"
        return data, None

    @property
    def server_json(self) -> Path:
        return self.root / SERVER_JSON

    def write_server_json(self, url: str) -> None:
        """Record this process as the folder's server, once it serves (atomic, 0600)."""
        record = {"pid": os.getpid(), "url": url, "started": time.time()}
        self.write(self.server_json, [json.dumps(record, indent=1).encode()])

    def read_server_json(self) -> ServerRecord | None:
        """The server serving this folder; None when there is no record, it is unreadable, or
        its process is gone: a crashed server leaves no claim behind."""
        data, _ = self._read_json(SERVER_JSON)
        pid, url, started = data.get("pid"), data.get("url"), data.get("started")
        if not (isinstance(url, str) and type(started) in (int, float) and pid_alive(pid)):
            return None
        return ServerRecord(pid, url, float(started), self.server_json)

    def remove_server_json(self) -> None:
        """At a clean shutdown: only this process's own record (another server may have
        recorded itself since)."""
        if self._read_json(SERVER_JSON)[0].get("pid") == os.getpid():
            self.unlink(self.server_json)

    def scan(self, owns: Callable[[str], bool]) -> FolderScan:
        """List every file; read and check manifests (those `owns` refuses are bad ones)."""
        scan = FolderScan()
        for sub, sub_st in entries(self.blocks):
            if not stat.S_ISDIR(sub_st.st_mode):
                if not sub.name.startswith("."):
                    scan.stray_files.append(_info(sub, sub_st))
                continue
            scan.note_mode(Path(sub.path), sub_st)
            for entry, st in entries(Path(sub.path)):
                scan.note_mode(Path(entry.path), st)
                self._sort_block_entry(scan, sub.name, entry, st)
        for entry, st in entries(self.root):
            if entry.name in (MODEL_JSON, SERVER_JSON, "quarantine"):
                scan.note_mode(Path(entry.path), st)
            if stat.S_ISREG(st.st_mode) and entry.name.endswith(blockfile.TEMP_SUFFIX):
                scan.temp_files.append(_info(entry, st))  # an interrupted model.json write
        for entry, st in entries(self.agents):
            path = Path(entry.path)
            scan.note_mode(path, st)
            if not stat.S_ISREG(st.st_mode):
                scan.stray_files.append(_info(entry, st))
            elif entry.name.endswith(blockfile.TEMP_SUFFIX):
                scan.temp_files.append(_info(entry, st))
            elif path.suffix == ".json":
                try:
                    manifest = Manifest.read(path)
                    if not owns(manifest.fingerprint):
                        raise ValueError("manifest of another model")
                    scan.manifests.append(manifest)
                except FileNotFoundError:
                    continue
                except (OSError, ValueError, RecursionError) as e:
                    scan.bad_manifests.append((path, str(e) or type(e).__name__))
            elif not entry.name.startswith("."):
                scan.stray_files.append(_info(entry, st))
        for entry, st in entries(self.quarantine_dir):
            if stat.S_ISREG(st.st_mode):
                scan.quarantined.append(_info(entry, st))
                scan.note_mode(Path(entry.path), st)
        return scan

    @staticmethod
    def _sort_block_entry(scan: FolderScan, sub: str, entry: os.DirEntry, st: os.stat_result) -> None:
        name = entry.name
        if not stat.S_ISREG(st.st_mode):
            scan.stray_files.append(_info(entry, st))
        elif name.endswith(blockfile.TEMP_SUFFIX):
            scan.temp_files.append(_info(entry, st))
        elif name.endswith(".safetensors") and HASH_RE.match(name[:-12]) and name[:2] == sub:
            scan.blocks[name[:-12]] = _info(entry, st)
        elif not name.startswith("."):
            scan.stray_files.append(_info(entry, st))

    def quarantine(self, path: Path, reason: str) -> None:
        """Move a file that failed a check out of the way, with a note saying why. The random
        part keeps two files of one name quarantined in the same second apart. Both ends are
        folders opened without following a link: a quarantine/ planted as a link is refused,
        and the file stays where it is (the caller treats it as bad anyway)."""
        name = f"{int(time.time())}-{secrets.token_hex(4)}-{path.name}"
        try:
            self.make_subfolder(self.quarantine_dir)
            src_fd, dst_fd = self._dir_fd(path.parent), self._dir_fd(self.quarantine_dir)
            try:
                if not stat.S_ISREG(os.stat(path.name, dir_fd=src_fd, follow_symlinks=False).st_mode):
                    return  # never move what we did not write
                os.replace(path.name, name, src_dir_fd=src_fd, dst_dir_fd=dst_fd)
            finally:
                os.close(src_fd)
                os.close(dst_fd)
            self.write(self.quarantine_dir / (name + ".why"), [(reason + "\n").encode()])
        except FileNotFoundError:
            return
        except OSError as e:  # a read-only folder, a planted link: the caller treats the file as bad anyway
            where = f": {e.filename}" if e.filename else ""
            log.warning("could not quarantine %s (%s%s): %s", path.name, e.strerror or e, where, reason)
            return
        log.warning("quarantined %s: %s", path.name, reason)


def _make_private(path: Path, st: os.stat_result, mode: int) -> None:
    if stat.S_IMODE(st.st_mode) != mode:  # only when needed: a read-only disk is not an error here
        os.chmod(path, mode)


def unlink_regular(path: Path, *, follow_parent: bool = False) -> bool:
    """Delete a file we wrote; never a link's target, never a folder or a FIFO, never through
    a link planted as its folder (unless follow_parent). False if it was not there (or not ours)."""
    try:
        dir_fd = blockfile.open_dir(path.parent, follow=follow_parent)
    except (FileNotFoundError, NotADirectoryError):
        return False
    except OSError as e:
        if e.errno == errno.ELOOP:  # the folder is a link
            return False
        raise
    try:
        if not stat.S_ISREG(os.stat(path.name, dir_fd=dir_fd, follow_symlinks=False).st_mode):
            return False
        os.unlink(path.name, dir_fd=dir_fd)
    except FileNotFoundError:
        return False
    finally:
        os.close(dir_fd)
    return True

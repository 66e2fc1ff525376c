"""The cache folder: where each file lives (what the files hold: format/records.py), for the server's
warm tier (folder/backend.py) and the `cache` commands alike. No MLX here.

    <cache-dir>/kv/<model>-<fingerprint>-<precision>/
        model.json                         what this folder holds (for people and the CLI)
        server.json                        the server running on this folder: pid, URL, start
        blocks/<h[:2]>/<hash>.safetensors  one block, content-addressed (format/blockfile.py)
        agents/<hash of agent id>.json     an agent's manifest: its tokens and block hashes
        quarantine/                        files that failed a check, with a .why note

Agent ids never become file names: a manifest is named by a hash of the id and holds the id.
Nothing here follows a symbolic link inside a model folder or opens anything but a regular
file: a link or a FIFO planted in the folder is listed as stray and otherwise left alone, and
files are written, moved and deleted through their folder's descriptor, opened without
following a link (agent_memory/files.py), so a link planted as blocks/xx/ or quarantine/ leads
nowhere. The model folder itself and `kv` may be links the user placed; they are followed.
Folders are made 0700 and files 0600: they hold every conversation's tokens. A start makes
those it finds readable by others private again (`FolderScan.loose`).
"""

from __future__ import annotations

import contextlib
import errno
import json
import logging
import os
import re
import secrets
import stat
import time
from collections.abc import Callable
from pathlib import Path

from agent_memory import files
from agent_memory.agent_key import AgentKey, agent_file_stem
from agent_memory.files import TEMP_SUFFIX, entries
from agent_memory.memory.warm.format import blockfile
from agent_memory.memory.warm.format.records import Manifest, ServerRecord, pid_alive
from agent_memory.memory.warm.scan import FileInfo, FolderScan

log = logging.getLogger(__name__)

FOLDER_RE = re.compile(r"^(?P<model>.+)-(?P<fp>[0-9a-f]{12})-(?P<tag>[A-Za-z0-9]+)(?:-(?P<shard>(?:tp|pp)\d+r\d+))?$")
MAX_MODEL_JSON_BYTES = 1 << 20
MODEL_JSON = "model.json"
SERVER_JSON = "server.json"
BLOCK_META_KEYS = ("fingerprint", "bits", "group_size")  # model.json fields every block file repeats


def folder_name(model_name: str, fingerprint: str, precision_tag: str, shard: str = "") -> str:
    safe = re.sub(r"[^A-Za-z0-9._-]", "_", model_name)[:64] or "model"  # shard: a split's part (shards.py)
    return f"{safe}-{fingerprint[:12]}-{precision_tag}" + (f"-{shard}" if shard else "")


def model_names(folder: str, name: str | None) -> list[str]:
    """What `--model` and `--filter model=` match: the model's name (model.json), its
    folder's name, and the model name that folder name starts with."""
    parsed = FOLDER_RE.match(folder)
    return [n for n in (name, folder, parsed["model"] if parsed else None) if n]


def model_folders(kv_dir: Path) -> list[Folder]:
    """The model folders in `<cache-dir>/kv`. `kv` and a model folder may be links, as the
    user placed them (the server follows them too); nothing inside a model folder is followed."""
    try:
        with os.scandir(kv_dir) as it:
            listed = sorted(it, key=lambda e: e.name)
    except (FileNotFoundError, NotADirectoryError):
        return []
    return [Folder(Path(e.path)) for e in listed if e.is_dir()]


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

    def holding_elsewhere(self, key: AgentKey) -> str | None:
        """The sibling folder (another model, or this one at another precision) holding the
        agent's manifest, if one does: why a named agent is new here (memory/index/misses.py)."""
        stem = f"{agent_file_stem(key)}.json"
        for sibling, st in entries(self.root.parent):
            if sibling.name != self.root.name and stat.S_ISDIR(st.st_mode):
                with contextlib.suppress(OSError):
                    if stat.S_ISREG(os.lstat(Path(sibling.path) / "agents" / stem).st_mode):
                        return sibling.name
        return None

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
            if stat.S_IMODE(st.st_mode) != 0o700:  # opened without following: a link swapped in fails
                fd = os.open(d.name, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW, dir_fd=parent_fd)
                try:
                    os.fchmod(fd, 0o700)
                finally:
                    os.close(fd)
        finally:
            os.close(parent_fd)

    def _dir_fd(self, d: Path) -> int:
        """A folder of this model folder, opened for *at() calls: links the user placed are
        followed only as the model folder itself."""
        return files.open_dir(d, follow=d == self.root)

    def write(self, path: Path, chunks) -> int:
        """Write one of the folder's files atomically (never through a planted link)."""
        return files.write_atomic(path, chunks, follow_parent=path.parent == self.root)

    def unlink(self, path: Path) -> bool:
        """Delete one of the folder's regular files (see files.unlink_regular)."""
        return files.unlink_regular(path, follow_parent=path.parent == self.root)

    def rename(self, path: Path, target: Path) -> None:
        """Move one of the folder's regular files to another name in the same folder, atomically
        (a file there is replaced) and durably, never through a planted link."""
        fd = self._dir_fd(path.parent)
        try:
            if not stat.S_ISREG(os.stat(path.name, dir_fd=fd, follow_symlinks=False).st_mode):
                raise files.NotRegularFile(f"{path.name} is not a regular file")
            os.replace(path.name, target.name, src_dir_fd=fd, dst_dir_fd=fd)
            os.fsync(fd)
        finally:
            os.close(fd)

    # What the `cache` commands read, by path; a shared Redis namespace (redis/folder.py) answers the same.

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
        with files.open_regular(info.path) as f:
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
            with files.open_regular(self.root / name) as f:
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
                    scan.stray_files.append(FileInfo.of(sub, sub_st))
                continue
            scan.note_mode(Path(sub.path), sub_st)
            for entry, st in entries(Path(sub.path)):
                scan.add_block_entry(sub.name, entry, st)
        for entry, st in entries(self.root):
            if entry.name in (MODEL_JSON, SERVER_JSON, "quarantine"):
                scan.note_mode(Path(entry.path), st)
            if stat.S_ISREG(st.st_mode) and entry.name.endswith(TEMP_SUFFIX):
                scan.temp_files.append(FileInfo.of(entry, st))  # an interrupted model.json write
        for entry, st in entries(self.agents):
            scan.add_agent_entry(entry, st, owns)
        for entry, st in entries(self.quarantine_dir):
            if stat.S_ISREG(st.st_mode):
                scan.quarantined.append(FileInfo.of(entry, st))
                scan.note_mode(Path(entry.path), st)
        return scan

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


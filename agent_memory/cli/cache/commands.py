"""`agent-memory cache`: look into and tidy the warm tier on disk without loading any model.

It reads the very files the server writes (memory/disk.py, memory/blockfile.py) and never
imports MLX, so it starts at once and runs where MLX cannot. The server may be running:
nothing here takes a lock, a file that vanishes mid-scan is skipped, and every deletion is a
single unlink made in the one safe order: a manifest first, then only block files that no
manifest still on disk names. The server writes a block before the manifest naming it, so a
block no manifest names (an orphan) or a temp file younger than GRACE_S may be a write still
under way; those are left alone until they are older.
"""

from __future__ import annotations

import json
import os
import re
import time
from collections import Counter
from collections.abc import Callable, Iterable
from dataclasses import asdict, dataclass, field
from enum import Enum
from functools import cached_property
from pathlib import Path
from typing import NoReturn

import typer
from rich.console import Console
from rich.progress import (
    BarColumn,
    MofNCompleteColumn,
    Progress,
    TextColumn,
    TimeElapsedColumn,
)
from rich.table import Table
from rich.text import Text

from agent_memory.config import ConfigError, load_settings
from agent_memory.memory import blockfile
from agent_memory.memory.folder import HASH_RE, Folder as DiskLayout, Manifest, agent_file_stem
from agent_memory.memory.hashing import BlockNames

BLOCK_TOKENS = 64  # the server's block size (engine/batch.py), for when no block file says
GRACE_S = 600.0  # younger orphans and temp files may belong to a write the server is making
FOLDER_RE = re.compile(r"^(?P<model>.+)-(?P<fp>[0-9a-f]{12})-(?P<tag>[A-Za-z0-9]+)$")
BLOCK_META_KEYS = ("fingerprint", "bits", "group_size")  # model.json fields every block repeats
MAX_MODEL_JSON_BYTES = 1 << 20

cache_app = typer.Typer(
    no_args_is_help=True,
    add_completion=False,
    help="Inspect and maintain the disk cache (KV block files and agent manifests) without loading a model.",
)


class Format(str, Enum):
    human = "human"
    json = "json"
    quiet = "quiet"


class Sort(str, Enum):
    last_used = "last-used"
    tokens = "tokens"
    bytes = "bytes"
    id = "id"


CacheDirOption = typer.Option(
    None,
    "--cache-dir",
    help="Cache folder (env AGENT_MEMORY_CACHE_DIR or the config file; default ~/.cache/agent-memory).",
)
FormatOption = typer.Option(
    Format.human, "--format", help="human: tables; json: one JSON document on stdout; quiet: exit code only."
)
ModelOption = typer.Option(
    None, "--model", help="Only this model folder: its folder name, or the model name the folder starts with."
)
YesOption = typer.Option(False, "-y", "--yes", help="Do not ask for confirmation.")
AgentArgument = typer.Argument(..., metavar="ID", help="The agent id (as sent in prompt_cache_key, X-Agent-Id, ...).")
SortOption = typer.Option(Sort.last_used, "--sort", help="Newest, most tokens, most bytes first; ids A to Z.")
ReverseOption = typer.Option(False, "--reverse", help="Reverse the order.")
LimitOption = typer.Option(None, "--limit", min=1, help="Show at most this many agents.")
OlderThanOption = typer.Option(
    None, "--older-than", help="Also remove agents unused for this long: 90s, 15m, 12h, 7d, 2w (default: keep all)."
)
QuarantineOption = typer.Option(False, "--quarantine", help="Also empty the quarantine folders.")
DryRunOption = typer.Option(False, "--dry-run", help="List what would be removed; remove nothing.")


# -- what is on disk -----------------------------------------------------------------------


@dataclass(frozen=True)
class FileInfo:
    path: Path
    size: int
    mtime: float


def _stat(path: Path) -> FileInfo | None:
    """The file's size and age, or None if it has just vanished (the server deleted it)."""
    try:
        st = path.stat()
    except FileNotFoundError:
        return None
    return FileInfo(path, st.st_size, st.st_mtime)


def _listdir(path: Path) -> list[Path]:
    try:
        return sorted(path.iterdir())
    except (FileNotFoundError, NotADirectoryError):
        return []


def _read_model_json(path: Path) -> tuple[dict, str | None]:
    """model.json as a dict ({} if absent) and what is wrong with it, if anything."""
    try:
        if path.stat().st_size > MAX_MODEL_JSON_BYTES:
            return {}, "model.json is too large"
        data = json.loads(path.read_bytes())
    except FileNotFoundError:
        return {}, None
    except (OSError, ValueError, RecursionError) as e:
        return {}, f"unreadable model.json: {e}"
    if not isinstance(data, dict):
        return {}, "model.json is not a JSON object"
    return data, None


@dataclass
class ModelFolder:
    """One `<model>-<fingerprint>-<precision>` folder as found at one moment: the commands'
    common view of it, so each decides from the same facts."""

    layout: DiskLayout
    meta: dict  # model.json
    meta_error: str | None
    manifests: list[Manifest] = field(default_factory=list)
    bad_manifests: list[tuple[Path, str]] = field(default_factory=list)
    blocks: dict[str, FileInfo] = field(default_factory=dict)  # block hash -> its file
    temp_files: list[FileInfo] = field(default_factory=list)
    stray_files: list[FileInfo] = field(default_factory=list)  # names the server ignores
    quarantined: list[FileInfo] = field(default_factory=list)
    token_counts: dict[str, int | None] = field(default_factory=dict)  # block hash -> tokens in its file

    @property
    def folder(self) -> str:
        return self.layout.root.name

    @property
    def name(self) -> str:
        name = self.meta.get("name")
        return name if isinstance(name, str) and name else self.folder

    @property
    def fingerprint(self) -> str | None:
        fingerprint = self.meta.get("fingerprint")
        return fingerprint if isinstance(fingerprint, str) and fingerprint else None

    def owns(self, fingerprint: object) -> bool:
        """Whether a manifest or block with this fingerprint belongs in this folder: model.json
        says which model it is; without it the folder name carries the fingerprint's start."""
        if not isinstance(fingerprint, str):
            return False
        if self.fingerprint is not None:
            return fingerprint == self.fingerprint
        parsed = FOLDER_RE.match(self.folder)
        return parsed is None or fingerprint[:12] == parsed["fp"]

    @cached_property
    def users(self) -> Counter[str]:
        """Block hash -> how many manifests name it."""
        return Counter(h for m in self.manifests for h in set(m.blocks))

    def bytes_of(self, hashes: Iterable[str]) -> int:
        return sum(self.blocks[h].size for h in set(hashes) if h in self.blocks)

    def private_blocks(self, manifest: Manifest) -> list[str]:
        """The agent's block files that no other agent names: what removing it frees."""
        return [h for h in dict.fromkeys(manifest.blocks) if h in self.blocks and self.users[h] <= 1]

    def token_count(self, block_hash: str) -> int | None:
        """Tokens in a block file, from its header (None when there is no readable file)."""
        if block_hash not in self.token_counts:
            count = None
            info = self.blocks.get(block_hash)
            if info is not None:
                try:
                    with open(info.path, "rb") as f:
                        meta, _ = blockfile.read_header(f, os.fstat(f.fileno()).st_size)
                    tokens = json.loads(meta.get("tokens"))
                    count = len(tokens) if isinstance(tokens, list) else None
                except (OSError, ValueError, TypeError, RecursionError, blockfile.BlockFileError):
                    count = None
            self.token_counts[block_hash] = count
        return self.token_counts[block_hash]

    def block_tokens(self, manifest: Manifest) -> int:
        """The block size the manifest was written with: model.json says (the server writes
        it there); else every block but the last is full, so one block file of the manifest
        tells; the server's BLOCK_TOKENS when none can."""
        size = self.meta.get("block_tokens")
        if type(size) is int and size > 0:
            return size
        n, total = len(manifest.blocks), len(manifest.tokens)
        if n <= 1:
            return max(total, 1)
        for i, h in enumerate(manifest.blocks):
            count = self.token_count(h)
            if count is None:
                continue
            if i < n - 1:
                return count
            rest = total - count  # only the (maybe partial) last block has a file
            if rest > 0 and rest % (n - 1) == 0:
                return rest // (n - 1)
        return BLOCK_TOKENS

    def spans(self, manifest: Manifest) -> list[tuple[str, int, int]]:
        """(hash, start, tokens) of each of the manifest's blocks."""
        size, total = self.block_tokens(manifest), len(manifest.tokens)
        return [(h, i * size, max(0, min(size, total - i * size))) for i, h in enumerate(manifest.blocks)]


def scan_folder(root: Path) -> ModelFolder:
    layout = DiskLayout(root)
    folder = ModelFolder(layout, *_read_model_json(root / "model.json"))
    for sub in _listdir(layout.blocks):
        for path in _listdir(sub) if sub.is_dir() else [sub]:
            info = _stat(path)
            if info is None:
                continue
            if path.name.endswith(blockfile.TEMP_SUFFIX):
                folder.temp_files.append(info)
            elif path.suffix == ".safetensors" and HASH_RE.match(path.stem) and path.stem[:2] == sub.name:
                folder.blocks[path.stem] = info
            elif not path.name.startswith("."):
                folder.stray_files.append(info)
    for path in _listdir(layout.root):  # an interrupted model.json write
        if path.name.endswith(blockfile.TEMP_SUFFIX) and (info := _stat(path)):
            folder.temp_files.append(info)
    for path in _listdir(layout.agents):
        if path.name.endswith(blockfile.TEMP_SUFFIX):
            if info := _stat(path):
                folder.temp_files.append(info)
        elif path.suffix == ".json":
            try:
                manifest = Manifest.read(path)
                if not folder.owns(manifest.fingerprint):
                    raise ValueError("manifest of another model")
                folder.manifests.append(manifest)
            except FileNotFoundError:
                continue
            except (OSError, ValueError, RecursionError) as e:
                folder.bad_manifests.append((path, str(e) or type(e).__name__))
        elif not path.name.startswith(".") and (info := _stat(path)):
            folder.stray_files.append(info)
    folder.quarantined = [info for p in _listdir(layout.quarantine_dir) if (info := _stat(p))]
    return folder


def _matches(root: Path, model: str) -> bool:
    parsed = FOLDER_RE.match(root.name)
    return model in (root.name, parsed and parsed["model"], _read_model_json(root / "model.json")[0].get("name"))


def scan_cache(cache_dir: Path, model: str | None) -> list[ModelFolder]:
    """Every model folder under <cache-dir>/kv/, or those `--model` names (none: exit 1)."""
    roots = [p for p in _listdir(cache_dir / "kv") if p.is_dir()]
    if model is not None:
        chosen = [p for p in roots if _matches(p, model)]
        if not chosen:
            known = ", ".join(p.name for p in roots) or "none"
            _fail(f"no model folder matches {model!r} in {cache_dir / 'kv'} (there: {known})")
        roots = chosen
    return [scan_folder(p) for p in roots]


# -- small helpers -------------------------------------------------------------------------

_UNITS = {"s": 1, "m": 60, "h": 3600, "d": 86400, "w": 604800}


def parse_duration(text: str) -> float:
    """Seconds in '90s', '15m', '12h', '7d', '2w' or a sum of them like '1d12h'."""
    spec = text.strip().lower()
    if not re.fullmatch(r"(\d+(\.\d+)?[smhdw])+", spec):
        raise typer.BadParameter(f"{text!r} is not a duration like 90s, 15m, 12h, 7d or 2w")
    return sum(float(n) * _UNITS[unit] for n, unit in re.findall(r"(\d+(?:\.\d+)?)([smhdw])", spec))


def human_bytes(n: int) -> str:
    value = float(n)
    for unit in ("B", "KiB", "MiB", "GiB", "TiB"):
        if value < 1024 or unit == "TiB":
            break
        value /= 1024
    return f"{n} B" if unit == "B" else f"{value:.1f} {unit}"


def human_age(when: float, now: float) -> str:
    seconds = now - when
    if seconds < 1:
        return "just now"
    for unit, size, at_least in (("w", 604800, 14 * 86400), ("d", 86400, 86400), ("h", 3600, 3600), ("m", 60, 60)):
        if seconds >= at_least:
            return f"{int(seconds // size)}{unit} ago"
    return f"{int(seconds)}s ago"


def _printable(text: str) -> str:
    """Agent ids (and names found on disk) on one line, without escape codes: ids are opaque
    and may hold anything; such ones are shown JSON-quoted."""
    return text if text.isprintable() else json.dumps(text)


def _cell(text: str, style: str = "") -> Text:
    return Text(_printable(text), style=style)  # Text: never read as rich markup


def _root(cache_dir: Path | None) -> Path:
    """--cache-dir, else the settings' (env, config file, default)."""
    try:
        return load_settings(cache_dir=cache_dir).cache_dir
    except ConfigError as e:
        _fail(str(e), code=2)


def _stdout() -> Console:
    console = Console(highlight=False)
    if not console.is_terminal and "COLUMNS" not in os.environ:
        console.width = 200  # piped: do not squeeze tables into 80 columns
    return console


def _stderr() -> Console:
    return Console(stderr=True, highlight=False)


def _fail(message: str, code: int = 1) -> NoReturn:
    _stderr().print(Text.assemble(("error: ", "red"), message))
    raise typer.Exit(code)


def _emit_json(doc: dict) -> None:
    typer.echo(json.dumps(doc, indent=2))


def _rel(path: Path, root: Path) -> str:
    try:
        return str(path.relative_to(root))
    except ValueError:
        return str(path)


def _table(*columns: str, right: Iterable[str] = ()) -> Table:
    table = Table(box=None, header_style="bold", pad_edge=False)
    for column in columns:
        table.add_column(column, justify="right" if column in right else "left", overflow="fold")
    return table


# -- ls ------------------------------------------------------------------------------------


@dataclass
class AgentRow:
    id: str
    model: str
    folder: str
    tokens: int
    blocks: int
    on_disk: int
    cold: int
    bytes: int
    last_used: float
    manifest: str


def _agent_row(folder: ModelFolder, manifest: Manifest) -> AgentRow:
    on_disk = [h for h in manifest.blocks if h in folder.blocks]
    return AgentRow(
        id=manifest.agent,
        model=folder.name,
        folder=folder.folder,
        tokens=len(manifest.tokens),
        blocks=len(manifest.blocks),
        on_disk=len(on_disk),
        cold=len(manifest.blocks) - len(on_disk),
        bytes=folder.bytes_of(on_disk),
        last_used=manifest.last_used,
        manifest=str(manifest.path),
    )


SORT_KEYS: dict[Sort, Callable[[AgentRow], object]] = {
    Sort.last_used: lambda r: r.last_used,
    Sort.tokens: lambda r: r.tokens,
    Sort.bytes: lambda r: r.bytes,
    Sort.id: lambda r: r.id,
}


@cache_app.command("ls")
def ls_command(
    model: str | None = ModelOption,
    sort: Sort = SortOption,
    reverse: bool = ReverseOption,
    limit: int | None = LimitOption,
    cache_dir: Path | None = CacheDirOption,
    fmt: Format = FormatOption,
) -> None:
    """List every agent that has a manifest on disk, across all models (like `hf cache ls`)."""
    root = _root(cache_dir)
    folders = scan_cache(root, model)
    rows = [_agent_row(f, m) for f in folders for m in f.manifests]
    rows.sort(key=lambda r: (r.id, r.folder))
    rows.sort(key=SORT_KEYS[sort], reverse=(sort is not Sort.id) != reverse)
    rows = rows[:limit] if limit else rows
    if fmt is Format.json:
        _emit_json({"cache_dir": str(root), "agents": [asdict(r) for r in rows]})
    elif fmt is Format.quiet:
        for row in rows:
            typer.echo(_printable(row.id))
    else:
        now = time.time()
        table = _table("id", "model", "tokens", "blocks", "size", "last used", right=("tokens", "blocks", "size"))
        for r in rows:
            blocks = f"{r.on_disk} + {r.cold} cold" if r.cold else str(r.on_disk)
            table.add_row(
                _cell(r.id), _cell(r.model), str(r.tokens), blocks, human_bytes(r.bytes), human_age(r.last_used, now)
            )
        console = _stdout()
        console.print(table)
        shown = {(r.folder, r.id) for r in rows}
        unique = sum(
            f.bytes_of(h for m in f.manifests if (f.folder, m.agent) in shown for h in m.blocks) for f in folders
        )
        console.print(f"{len(rows)} agent{'s' * (len(rows) != 1)}, {human_bytes(unique)} of blocks on disk")


# -- show ----------------------------------------------------------------------------------


def _find_agent(folders: list[ModelFolder], agent: str) -> tuple[ModelFolder, Manifest]:
    """The one folder holding the agent's manifest; exit 1 if none or several (then --model)."""
    found = [(f, m) for f in folders for m in f.manifests if m.agent == agent]
    if len(found) == 1:
        return found[0]
    if found:
        where = ", ".join(f.folder for f, _ in found)
        _fail(f"agent {_printable(agent)} is cached for several models ({where}): pass --model")
    stem = agent_file_stem(agent)
    damaged = [(f, why) for f in folders for p, why in f.bad_manifests if p.stem == stem]
    if damaged:
        _fail(f"agent {_printable(agent)}: its manifest in {damaged[0][0].folder} is unusable ({damaged[0][1]})")
    _fail(f"no agent {_printable(agent)} in the disk cache")


@cache_app.command("show")
def show_command(
    agent_id: str = AgentArgument,
    model: str | None = ModelOption,
    cache_dir: Path | None = CacheDirOption,
    fmt: Format = FormatOption,
) -> None:
    """Show one agent: its manifest and each of its blocks, on disk or cold, and what it shares."""
    root = _root(cache_dir)
    folder, manifest = _find_agent(scan_cache(root, model), agent_id)
    blocks = [
        {
            "hash": h,
            "start": start,
            "tokens": count,
            "on_disk": h in folder.blocks,
            "bytes": folder.bytes_of([h]),
            "shared_with": folder.users[h] - 1,
        }
        for h, start, count in folder.spans(manifest)
    ]
    on_disk = [b for b in blocks if b["on_disk"]]
    totals = {
        "blocks": len(blocks),
        "on_disk": len(on_disk),
        "cold": len(blocks) - len(on_disk),
        "bytes": sum(b["bytes"] for b in on_disk),
        "private_bytes": folder.bytes_of(folder.private_blocks(manifest)),
    }
    if fmt is Format.json:
        _emit_json(
            {
                "id": manifest.agent,
                "model": folder.name,
                "folder": folder.folder,
                "manifest": str(manifest.path),
                "fingerprint": manifest.fingerprint,
                "tokens": len(manifest.tokens),
                "block_tokens": folder.block_tokens(manifest),
                "last_used": manifest.last_used,
                "blocks": blocks,
                "totals": totals,
            }
        )
    elif fmt is Format.human:
        console = _stdout()
        console.print(Text.assemble(("agent     ", "bold"), _printable(manifest.agent)))
        console.print(Text.assemble(("model     ", "bold"), _printable(f"{folder.name} ({folder.layout.root})")))
        console.print(Text.assemble(("manifest  ", "bold"), str(manifest.path)))
        age = human_age(manifest.last_used, time.time())
        console.print(Text.assemble(("tokens    ", "bold"), f"{len(manifest.tokens)}, last used {age}"))
        table = _table(
            "#",
            "block",
            "start",
            "tokens",
            "where",
            "size",
            "shared with",
            right=("#", "start", "tokens", "size", "shared with"),
        )
        for i, b in enumerate(blocks):
            shared = f"{b['shared_with']} agent{'s' * (b['shared_with'] != 1)}" if b["shared_with"] else "-"
            size = human_bytes(b["bytes"]) if b["on_disk"] else "-"
            table.add_row(
                str(i),
                b["hash"][:16],
                str(b["start"]),
                str(b["tokens"]),
                "disk" if b["on_disk"] else "cold",
                size,
                shared,
            )
        console.print(table)
        console.print(
            f"{totals['blocks']} blocks: {totals['on_disk']} on disk ({human_bytes(totals['bytes'])}), "
            f"{totals['cold']} cold; removing this agent frees {human_bytes(totals['private_bytes'])}"
        )


# -- verify --------------------------------------------------------------------------------


@dataclass
class Problem:
    path: Path
    kind: str  # block, manifest, model.json, temp, stray
    reason: str


def _block_hash(fingerprint: str, parent: str | None, tokens: list[int]) -> str:
    return BlockNames(fingerprint, max(len(tokens), 1)).block_hash(parent, tokens)


def check_block(folder: ModelFolder, block_hash: str, path: Path) -> str | None:
    """Why the server would refuse this block file or why its name lies; None when sound.
    Records the file's token count for the manifest checks. FileNotFoundError passes through."""
    folder.token_counts[block_hash] = None
    expect = {k: v for k in BLOCK_META_KEYS if isinstance(v := folder.meta.get(k), str)}
    try:
        meta, _ = blockfile.read(path, {**expect, "hash": block_hash}, None)
        fingerprint, parent, start = meta.get("fingerprint"), meta.get("parent") or None, meta.get("start")
        tokens = json.loads(meta.get("tokens") or "null")
    except FileNotFoundError:
        raise
    except blockfile.BlockFileError as e:
        return str(e)
    except Exception as e:  # noqa: BLE001 - a hand-made header can break the reader in many ways
        return f"malformed file ({type(e).__name__}: {e})"
    if not folder.owns(fingerprint):
        return f"fingerprint {str(fingerprint)[:12]!r} is another model's"
    if not isinstance(tokens, list) or not tokens or not all(type(t) is int and 0 <= t < 1 << 32 for t in tokens):
        return "its metadata holds no valid token ids"
    if parent is not None and not (isinstance(parent, str) and HASH_RE.match(parent)):
        return "its parent is not a block hash"
    if not (isinstance(start, str) and start.isdigit()):
        return "its start position is not a number"
    actual = _block_hash(fingerprint, parent, tokens)
    if actual != block_hash:
        return f"its parent and tokens hash to {actual[:16]}…, not to its name"
    folder.token_counts[block_hash] = len(tokens)
    return None


def check_manifest(folder: ModelFolder, manifest: Manifest) -> str | None:
    """Whether the manifest's block hashes are the hash chain of its tokens (what the server
    checks at start before trusting a single block of it)."""
    size = folder.block_tokens(manifest)
    try:
        chain = [h for h, *_ in BlockNames(manifest.fingerprint, size).chain(manifest.tokens)]
    except (ValueError, OverflowError) as e:
        return f"token ids out of range: {e}"
    if chain != manifest.blocks:
        return f"its block hashes do not match its tokens (in {size}-token blocks)"
    return None


def verify_folder(folder: ModelFolder, advance: Callable[[], None], now: float) -> list[Problem]:
    problems = []
    if folder.meta_error:
        problems.append(Problem(folder.layout.root / "model.json", "model.json", folder.meta_error))
    parsed = FOLDER_RE.match(folder.folder)
    if folder.fingerprint and parsed and folder.fingerprint[:12] != parsed["fp"]:
        problems.append(Problem(folder.layout.root / "model.json", "model.json", "its fingerprint is not the folder's"))
    for block_hash, info in sorted(folder.blocks.items()):
        try:
            reason = check_block(folder, block_hash, info.path)
        except FileNotFoundError:
            reason = None  # deleted by the server meanwhile
        if reason:
            problems.append(Problem(info.path, "block", reason))
        advance()
    for path, reason in folder.bad_manifests:
        problems.append(Problem(path, "manifest", reason))
        advance()
    for manifest in folder.manifests:
        if reason := check_manifest(folder, manifest):
            problems.append(Problem(manifest.path, "manifest", reason))
        advance()
    for info in folder.temp_files:
        if now - info.mtime > GRACE_S:
            problems.append(Problem(info.path, "temp", "leftover temp file of an interrupted write"))
    for info in folder.stray_files:
        problems.append(Problem(info.path, "stray", "not a file the server writes here (it is ignored)"))
    return problems


@cache_app.command("verify")
def verify_command(
    model: str | None = ModelOption,
    cache_dir: Path | None = CacheDirOption,
    fmt: Format = FormatOption,
) -> None:
    """Check every block file and manifest as the server would; exit 1 if anything is wrong.

    Also checks that each block file's name is the hash of its contents and each manifest's
    blocks are the hash chain of its tokens. Changes nothing."""
    root = _root(cache_dir)
    folders = scan_cache(root, model)
    now = time.time()
    problems: list[Problem] = []
    total = sum(len(f.blocks) + len(f.manifests) + len(f.bad_manifests) for f in folders)
    progress = Progress(
        TextColumn("{task.description}"),
        BarColumn(),
        MofNCompleteColumn(),
        TimeElapsedColumn(),
        console=_stderr(),
        transient=True,
        disable=fmt is Format.quiet,
    )
    with progress:
        task = progress.add_task("verifying", total=total)
        for folder in folders:
            progress.update(task, description=f"verifying {folder.folder}")
            problems += verify_folder(folder, lambda: progress.advance(task), now)
    checked = {
        "folders": len(folders),
        "blocks": sum(len(f.blocks) for f in folders),
        "manifests": sum(len(f.manifests) + len(f.bad_manifests) for f in folders),
    }
    if fmt is Format.json:
        _emit_json(
            {
                "ok": not problems,
                "checked": checked,
                "problems": [{"path": str(p.path), "kind": p.kind, "reason": p.reason} for p in problems],
            }
        )
    elif fmt is Format.human:
        console = _stdout()
        summary = (
            f"{checked['blocks']} block files, {checked['manifests']} manifests in {checked['folders']} model folders"
        )
        if problems:
            table = _table("file", "kind", "problem")
            for p in problems:
                table.add_row(_cell(_rel(p.path, root)), p.kind, _cell(p.reason))
            console.print(table)
            console.print(f"[red]{len(problems)} problem{'s' * (len(problems) != 1)}[/red] in {summary}")
        else:
            console.print(f"[green]all good[/green]: {summary}")
    if problems:
        raise typer.Exit(1)


# -- rm and prune --------------------------------------------------------------------------


def delete_in_order(folder: ModelFolder, manifests: Iterable[Manifest], blocks: Iterable[str]) -> tuple[list[str], int]:
    """Unlink the manifests, then each of `blocks` that no manifest still on disk names
    (read again now: the running server may have named one meanwhile). Returns the block
    hashes removed and the bytes freed, manifests included."""
    freed = 0
    for manifest in manifests:
        info = _stat(manifest.path)
        try:
            manifest.path.unlink()
            freed += info.size if info else 0
        except FileNotFoundError:
            pass
    named = scan_folder(folder.layout.root).users
    removed = []
    for h in dict.fromkeys(blocks):
        info = folder.blocks.get(h)
        if h in named or info is None:
            continue
        try:
            info.path.unlink()
        except FileNotFoundError:
            continue
        removed.append(h)
        freed += info.size
    return removed, freed


@cache_app.command("rm")
def rm_command(
    agent_id: str = AgentArgument,
    model: str | None = ModelOption,
    yes: bool = YesOption,
    cache_dir: Path | None = CacheDirOption,
    fmt: Format = FormatOption,
) -> None:
    """Remove one agent: its manifest, then the block files no other agent uses.

    While the server runs, prefer DELETE /v1/agents/ID: the server writes an agent it still
    holds back to disk on its next request."""
    root = _root(cache_dir)
    folder, manifest = _find_agent(scan_cache(root, model), agent_id)
    private = folder.private_blocks(manifest)
    shared = [h for h in dict.fromkeys(manifest.blocks) if h in folder.blocks and h not in private]
    if not yes:
        typer.confirm(
            f"Remove agent {_printable(agent_id)} from {folder.folder} "
            f"({len(private)} block files, {human_bytes(folder.bytes_of(private))})?",
            abort=True,
            err=True,
        )
    removed, freed = delete_in_order(folder, [manifest], private)
    if fmt is Format.json:
        _emit_json(
            {
                "id": manifest.agent,
                "folder": folder.folder,
                "manifest": str(manifest.path),
                "removed_blocks": removed,
                "kept_shared_blocks": len(shared),
                "freed_bytes": freed,
            }
        )
    elif fmt is Format.human:
        _stdout().print(
            Text(
                f"removed agent {_printable(manifest.agent)} from {folder.folder}: "
                f"its manifest and {len(removed)} block files, freed {human_bytes(freed)}; "
                f"kept {len(shared)} block files other agents use"
            )
        )


@dataclass
class PrunePlan:
    folder: ModelFolder
    agents: list[Manifest]
    blocks: list[str]
    temp_files: list[FileInfo]
    quarantined: list[FileInfo]

    def items(self) -> list[tuple[str, str, int]]:
        """(kind, what, bytes) of everything the plan removes."""
        sizes = {m.agent: (_stat(m.path) or FileInfo(m.path, 0, 0)).size for m in self.agents}
        return [
            *(("agent", m.agent, sizes[m.agent]) for m in self.agents),
            *(("block", h, self.folder.blocks[h].size) for h in self.blocks),
            *(("temp", str(t.path), t.size) for t in self.temp_files),
            *(("quarantine", str(q.path), q.size) for q in self.quarantined),
        ]


def plan_prune(folder: ModelFolder, max_age: float | None, quarantine: bool, now: float) -> PrunePlan:
    """Agents unused for longer than max_age, the blocks only they or nobody name (orphans only
    once older than GRACE_S), old temp files and, if asked, the quarantine."""
    old = [m for m in folder.manifests if max_age is not None and now - m.last_used > max_age]
    kept = {h for m in folder.manifests if m not in old for h in m.blocks}
    blocks = [
        h for h, info in folder.blocks.items() if h not in kept and (h in folder.users or now - info.mtime > GRACE_S)
    ]
    temps = [t for t in folder.temp_files if now - t.mtime > GRACE_S]
    return PrunePlan(folder, old, blocks, temps, folder.quarantined if quarantine else [])


def _still_unused(manifest: Manifest, max_age: float, now: float) -> bool:
    """Re-read before deleting: the running server may have just used the agent."""
    try:
        return now - Manifest.read(manifest.path).last_used > max_age
    except FileNotFoundError:
        return False
    except (OSError, ValueError, RecursionError):
        return True


@cache_app.command("prune")
def prune_command(
    older_than: str | None = OlderThanOption,
    quarantine: bool = QuarantineOption,
    dry_run: bool = DryRunOption,
    yes: bool = YesOption,
    model: str | None = ModelOption,
    cache_dir: Path | None = CacheDirOption,
    fmt: Format = FormatOption,
) -> None:
    """Remove old agents, orphan block files, leftover temp files (and the quarantine if asked).

    Never removes a block that an agent that stays still uses."""
    max_age = parse_duration(older_than) if older_than else None
    root, now = _root(cache_dir), time.time()
    plans = [plan_prune(f, max_age, quarantine, now) for f in scan_cache(root, model)]
    planned = [(plan.folder.folder, *item) for plan in plans for item in plan.items()]
    if planned and not (yes or dry_run):
        agents = sum(len(p.agents) for p in plans)
        typer.confirm(
            f"Remove {agents} agents and {len(planned) - agents} files ({human_bytes(sum(i[3] for i in planned))})?",
            abort=True,
            err=True,
        )
    freed = sum(i[3] for i in planned)
    if not dry_run:
        freed = 0
        for plan in plans:
            agents = [m for m in plan.agents if _still_unused(m, max_age, now)] if max_age is not None else []
            _, n = delete_in_order(plan.folder, agents, plan.blocks)
            freed += n
            for info in [*plan.temp_files, *plan.quarantined]:
                try:
                    info.path.unlink()
                    freed += info.size
                except FileNotFoundError:
                    pass
    if fmt is Format.json:
        _emit_json(
            {
                "dry_run": dry_run,
                "older_than_s": max_age,
                "removed": [
                    {"folder": folder, "kind": kind, "name": name, "bytes": size}
                    for folder, kind, name, size in planned
                ],
                "freed_bytes": freed,
            }
        )
    elif fmt is Format.human:
        console = _stdout()
        if planned:
            table = _table("model", "kind", "what", "size", right=("size",))
            for folder, kind, name, size in planned:
                shown = (
                    _rel(Path(name), root) if kind in ("temp", "quarantine") else name[:16] if kind == "block" else name
                )
                table.add_row(_cell(folder), kind, _cell(shown), human_bytes(size))
            console.print(table)
        verb = "would free" if dry_run else "freed"
        console.print(
            f"{len(planned)} item{'s' * (len(planned) != 1)}, {verb} {human_bytes(freed)}"
            + (" (dry run)" if dry_run else "")
        )


# -- stats ---------------------------------------------------------------------------------


@dataclass
class FolderStats:
    model: str
    folder: str
    agents: int
    block_files: int
    bytes: int
    cold_blocks: int
    orphan_blocks: int
    quarantined_files: int
    quarantined_bytes: int
    temp_files: int

    @classmethod
    def of(cls, f: ModelFolder) -> FolderStats:
        return cls(
            model=f.name,
            folder=f.folder,
            agents=len(f.manifests),
            block_files=len(f.blocks),
            bytes=sum(i.size for i in f.blocks.values()),
            cold_blocks=sum(1 for h in f.users if h not in f.blocks),
            orphan_blocks=sum(1 for h in f.blocks if h not in f.users),
            quarantined_files=len(f.quarantined),
            quarantined_bytes=sum(i.size for i in f.quarantined),
            temp_files=len(f.temp_files),
        )


@cache_app.command("stats")
def stats_command(
    model: str | None = ModelOption,
    cache_dir: Path | None = CacheDirOption,
    fmt: Format = FormatOption,
) -> None:
    """Per model folder and in total: agents, block files and bytes, cold, orphan, quarantined and temp files."""
    root = _root(cache_dir)
    rows = [FolderStats.of(f) for f in scan_cache(root, model)]
    numbers = [k for k in FolderStats.__dataclass_fields__ if k not in ("model", "folder")]
    total = {k: sum(getattr(r, k) for r in rows) for k in numbers}
    if fmt is Format.json:
        _emit_json({"cache_dir": str(root), "models": [asdict(r) for r in rows], "total": total})
    elif fmt is Format.human:
        table = _table(
            "model",
            "agents",
            "blocks",
            "size",
            "cold",
            "orphans",
            "quarantined",
            "temp",
            right=("agents", "blocks", "size", "cold", "orphans", "quarantined", "temp"),
        )
        for r in [*rows, FolderStats("total", "", **total)]:
            quarantined = f"{r.quarantined_files} ({human_bytes(r.quarantined_bytes)})" if r.quarantined_files else "0"
            table.add_row(
                _cell(r.folder or r.model, "bold" if not r.folder else ""),
                str(r.agents),
                str(r.block_files),
                human_bytes(r.bytes),
                str(r.cold_blocks),
                str(r.orphan_blocks),
                quarantined,
                str(r.temp_files),
            )
        console = _stdout()
        console.print(table)

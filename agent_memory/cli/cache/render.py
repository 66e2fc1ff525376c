"""What the `cache` commands print: plain tables on stdout, one JSON document, or nothing
(quiet); sizes, ages and durations for people. Tables are plain columns whether or not stdout
is a terminal (no box drawing, no wrapping, the same columns whatever the rows hold), so a
pipe gets what the screen shows. Ids and names found on disk never reach the terminal as
markup or escape codes."""

from __future__ import annotations

import json
import re
import time
from collections.abc import Collection, Sequence
from dataclasses import asdict
from enum import Enum
from pathlib import Path

import typer
from rich import filesize
from rich.cells import cell_len
from rich.console import Console
from rich.text import Text

from agent_memory.agent_key import shown_id
from agent_memory.cli.cache.rows import AgentRow, FolderStats
from agent_memory.memory.warm.admin.operations import Problem
from agent_memory.memory.warm.admin.model_folder import ModelFolder


class Format(str, Enum):
    human = "human"
    json = "json"
    quiet = "quiet"


IMAGE_DIGEST = 12  # hex digits of an image's digest shown (the JSON has all 64)
_UNITS = {"s": 1, "m": 60, "h": 3600, "d": 86400, "w": 604800, "mo": 30 * 86400, "y": 365 * 86400}
_DURATION = r"(\d+(?:\.\d+)?)(mo|y|[smhdw])"


def parse_duration(text: str) -> float:
    """Seconds in '90s', '15m', '12h', '7d', '2w', '3mo', '1y' or a sum of them like '1d12h'."""
    spec = text.strip().lower()
    if not re.fullmatch(f"(?:{_DURATION})+", spec):
        raise typer.BadParameter(f"{text!r} is not a duration like 90s, 15m, 12h, 7d, 2w or 3mo")
    return sum(float(n) * _UNITS[unit] for n, unit in re.findall(_DURATION, spec))


def human_bytes(n: int) -> str:
    """Decimal units, as `hf cache` and the download bars show them (and `size>10MB` reads)."""
    return filesize.decimal(n)


def human_age(when: float, now: float) -> str:
    seconds = now - when
    if seconds < 1:
        return "just now"
    for unit, size, at_least in (("w", 604800, 14 * 86400), ("d", 86400, 86400), ("h", 3600, 3600), ("m", 60, 60)):
        if seconds >= at_least:
            return f"{int(seconds // size)}{unit} ago"
    return f"{int(seconds)}s ago"


def plural(n: int, word: str) -> str:
    return f"{n} {word}{'s' * (n != 1)}"


def _stdout() -> Console:
    """Free text for people: styles on a terminal, plain when piped, never wrapped."""
    return Console(highlight=False, soft_wrap=True)


def emit_json(doc: dict) -> None:
    typer.echo(json.dumps(doc, indent=2))


def say(text: str) -> None:
    """One plain line for people (no markup read in it)."""
    _stdout().print(Text(text))


def _rel(path: Path, root: Path) -> str:
    try:
        return str(path.relative_to(root))
    except ValueError:
        return str(path)


def table(columns: Sequence[str], rows: Sequence[Sequence[str]], right: Collection[str] = ()) -> None:
    """Plain columns on stdout: a header line, then one line per row, cells padded to their
    column and two spaces apart; `right` columns right-aligned, no trailing spaces. Cells
    are shown as `shown_id` makes them (JSON-quoted when they hold what does not print). Not
    rich's Table: it fits a table to the console's width, so at 80 columns a long id is cut to "…" and the last columns are dropped
    (measured: `size` vanished), and it pads the last column with spaces."""
    cells = [[shown_id(str(c)) for c in row] for row in rows]
    widths = [max([cell_len(h), *(cell_len(r[i]) for r in cells)]) for i, h in enumerate(columns)]

    def line(row: Sequence[str]) -> str:
        parts = []
        for i, (cell, width) in enumerate(zip(row, widths)):
            pad = " " * (width - cell_len(cell))
            parts.append(pad + cell if columns[i] in right else cell + pad)
        return "  ".join(parts).rstrip()

    for row in [list(columns), *cells]:
        typer.echo(line(row))


def ls(root: Path, rows: list[AgentRow], folders: list[ModelFolder], responses: int, fmt: Format) -> None:
    if fmt is Format.json:
        emit_json({"cache_dir": str(root), "agents": [asdict(r) for r in rows], "stored_responses": responses})
    elif fmt is Format.quiet:
        for row in rows:
            typer.echo(shown_id(row.label))
    else:
        now = time.time()
        table(
            ("id", "model", "tokens", "blocks", "size", "last_used", "where"),
            [
                (
                    r.label,
                    r.model,
                    str(r.tokens),
                    f"{r.on_disk} + {r.cold} cold" if r.cold else str(r.on_disk),
                    human_bytes(r.bytes),
                    human_age(r.last_used, now),
                    r.where,
                )
                for r in rows
            ],
            right=("tokens", "blocks", "size"),
        )
        shown = {(r.folder, r.id) for r in rows}
        unique = sum(
            f.bytes_of(h for m in f.files.manifests if (f.folder, m.key.id) in shown for h in m.names) for f in folders
        )
        in_server = sum(1 for r in rows if r.where == "server")
        memory_only = f" ({in_server} only in a running server's memory so far)" if in_server else ""
        say(
            f"{plural(len(rows), 'agent')}{memory_only}, {human_bytes(unique)} of blocks on disk; "
            f"{plural(responses, 'stored response')} besides"
        )


def show(doc: dict, folder_path: Path) -> None:
    """`show` for people, from the document `--format json` prints."""
    console = _stdout()
    console.print(Text.assemble(("agent     ", "bold"), shown_id(doc["id"])))
    console.print(Text.assemble(("model     ", "bold"), shown_id(f"{doc['model']} ({folder_path})")))
    console.print(Text.assemble(("manifest  ", "bold"), doc["manifest"]))
    age = human_age(doc["last_used"], time.time())
    console.print(Text.assemble(("tokens    ", "bold"), f"{doc['tokens']}, last used {age}"))
    images = doc.get("images") or []  # a vision model's: the column only where there are some
    columns = ("#", "block", "start", "tokens", "where", "size", "shared_with", *(("images",) if images else ()))
    table(
        columns,
        [
            (
                str(i),
                b["hash"][:16],
                str(b["start"]),
                str(b["tokens"]),
                "disk" if b["on_disk"] else "cold",
                human_bytes(b["bytes"]) if b["on_disk"] else "-",
                plural(b["shared_with"], "agent") if b["shared_with"] else "-",
                *((", ".join(d[:IMAGE_DIGEST] for d in b["images"]) or "-",) if images else ()),
            )
            for i, b in enumerate(doc["blocks"])
        ],
        right=("#", "start", "tokens", "size", "shared_with"),
    )
    if images:
        held = ", ".join(f"{i['digest'][:IMAGE_DIGEST]} at {i['start']}-{i['end']}" for i in images)
        say(f"{plural(len(images), 'image')} (SHA-256 of its pixels, tokens): {held}")
    totals, snapshots = doc["totals"], doc.get("snapshots") or []
    if snapshots:  # a model with window or recurrent layers resumes only at one of these
        held = ", ".join(f"{s['position']} ({human_bytes(s['bytes'])})" for s in snapshots)
        say(f"snapshots of its state layers at tokens {held}")
    with_snapshots = " with its snapshots" if snapshots else ""
    say(
        f"{totals['blocks']} blocks: {totals['on_disk']} on disk ({human_bytes(totals['bytes'])}{with_snapshots}), "
        f"{totals['cold']} cold; removing this agent frees {human_bytes(totals['private_bytes'])}"
    )


def verify(root: Path, checked: dict[str, int], problems: list[Problem], fmt: Format) -> None:
    if fmt is Format.json:
        found = [{"path": str(p.path), "kind": p.kind, "reason": p.reason} for p in problems]
        emit_json({"ok": not problems, "checked": checked, "problems": found})
    elif fmt is Format.human:
        summary = (
            f"{checked['blocks']} block files, {checked['manifests']} manifests in {checked['folders']} model folders"
        )
        if problems:
            table(("file", "kind", "problem"), [(_rel(p.path, root), p.kind, p.reason) for p in problems])
            _stdout().print(Text.assemble((plural(len(problems), "problem"), "red"), f" in {summary}"))
        else:
            _stdout().print(Text.assemble(("all good", "green"), f": {summary}"))


def prune(
    root: Path, planned: list[tuple[str, str, str, int]], freed: int, dry_run: bool, max_age: float | None, fmt: Format
) -> None:
    """planned: (folder, kind, name, bytes) of every item."""
    if fmt is Format.json:
        removed = [{"folder": f, "kind": kind, "name": name, "bytes": size} for f, kind, name, size in planned]
        emit_json({"dry_run": dry_run, "older_than_s": max_age, "removed": removed, "freed_bytes": freed})
    elif fmt is Format.human:
        if planned:

            def what(kind: str, name: str) -> str:
                if kind in ("temp", "quarantine"):
                    return _rel(Path(name), root)
                return name[:16] if kind == "block" else name

            rows = [(folder, kind, what(kind, name), human_bytes(size)) for folder, kind, name, size in planned]
            table(("model", "kind", "what", "size"), rows, right=("size",))
        verb = "would free" if dry_run else "freed"
        say(f"{plural(len(planned), 'item')}, {verb} {human_bytes(freed)}{' (dry run)' * dry_run}")


def removal(doc: dict, fmt: Format) -> None:
    """`rm`: what was removed (or, with --dry-run, would be), from the document `--format json` prints."""
    if fmt is Format.json:
        emit_json(doc)
    elif fmt is Format.quiet:
        return
    elif doc["dry_run"]:
        rows = [
            (a["id"], a["folder"], str(len(a["removed_blocks"])), human_bytes(a["freed_bytes"])) for a in doc["agents"]
        ]
        table(("id", "model", "block_files", "frees"), rows, right=("block_files", "frees"))
        agents, blocks = plural(len(doc["agents"]), "agent"), plural(len(doc["removed_blocks"]), "block file")
        say(
            f"would remove {agents} and {blocks}, free {human_bytes(doc['freed_bytes'])}; "
            f"keep {plural(doc['kept_shared_blocks'], 'block file')} other agents use (dry run)"
        )
    else:
        for a in doc["agents"]:
            blocks = plural(len(a["removed_blocks"]), "block file")
            say(
                f"removed agent {shown_id(a['id'])} from {a['folder']}"
                + (f" through the server at {a['server']}" if a["server"] else "")
                + f": its manifest and {blocks}, freed {human_bytes(a['freed_bytes'])}"
            )
        total = f"removed {plural(len(doc['agents']), 'agent')}, freed {human_bytes(doc['freed_bytes'])}; " * (
            len(doc["agents"]) > 1
        )
        say(f"{total}kept {plural(doc['kept_shared_blocks'], 'block file')} other agents use")


def stats(root: Path, rows: list[FolderStats], total: FolderStats, fmt: Format) -> None:
    if fmt is Format.json:
        numbers = {k: v for k, v in asdict(total).items() if k not in ("model", "folder")}
        emit_json({"cache_dir": str(root), "models": [asdict(r) for r in rows], "total": numbers})
    elif fmt is Format.human:
        columns = ("agents", "responses", "blocks", "size", "cold", "orphans", "quarantined", "temp")
        table(
            ("model", *columns),
            [
                (
                    r.folder or r.model,
                    str(r.agents),
                    str(r.stored_responses),
                    str(r.block_files),
                    human_bytes(r.bytes),
                    str(r.cold_blocks),
                    str(r.orphan_blocks),
                    f"{r.quarantined_files} ({human_bytes(r.quarantined_bytes)})" if r.quarantined_files else "0",
                    str(r.temp_files),
                )
                for r in [*rows, total]
            ],
            right=columns,
        )

"""What the `cache` commands print: human tables on stdout, one JSON document, or nothing
(quiet); sizes, ages and durations for people. Ids and names found on disk never reach the
terminal as markup or escape codes."""

from __future__ import annotations

import json
import os
import re
import time
from collections.abc import Iterable
from dataclasses import asdict
from enum import Enum
from pathlib import Path
from typing import TYPE_CHECKING

import typer
from rich.console import Console
from rich.table import Table
from rich.text import Text

if TYPE_CHECKING:
    from agent_memory.cli.cache.operations import Problem
    from agent_memory.cli.cache.scan import AgentRow, FolderStats, ModelFolder


class Format(str, Enum):
    human = "human"
    json = "json"
    quiet = "quiet"


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


def printable(text: str) -> str:
    """Agent ids (and names found on disk) on one line, without escape codes: ids are opaque
    and may hold anything; such ones are shown JSON-quoted."""
    return text if text.isprintable() else json.dumps(text)


def plural(n: int, word: str) -> str:
    return f"{n} {word}{'s' * (n != 1)}"


def _cell(text: str, style: str = "") -> Text:
    return Text(printable(text), style=style)  # Text: never read as rich markup


def _stdout() -> Console:
    console = Console(highlight=False)
    if not console.is_terminal and "COLUMNS" not in os.environ:
        console.width = 200  # piped: do not squeeze tables into 80 columns
    return console


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


def _table(*columns: str, right: Iterable[str] = ()) -> Table:
    table = Table(box=None, header_style="bold", pad_edge=False)
    for column in columns:
        table.add_column(column, justify="right" if column in right else "left", overflow="fold")
    return table


def ls(root: Path, rows: list[AgentRow], folders: list[ModelFolder], fmt: Format) -> None:
    if fmt is Format.json:
        emit_json({"cache_dir": str(root), "agents": [asdict(r) for r in rows]})
    elif fmt is Format.quiet:
        for row in rows:
            typer.echo(printable(row.id))
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
            f.bytes_of(h for m in f.files.manifests if (f.folder, m.agent) in shown for h in m.blocks) for f in folders
        )
        console.print(f"{plural(len(rows), 'agent')}, {human_bytes(unique)} of blocks on disk")


def show(doc: dict, folder_path: Path) -> None:
    """`show` for people, from the document `--format json` prints."""
    console = _stdout()
    console.print(Text.assemble(("agent     ", "bold"), printable(doc["id"])))
    console.print(Text.assemble(("model     ", "bold"), printable(f"{doc['model']} ({folder_path})")))
    console.print(Text.assemble(("manifest  ", "bold"), doc["manifest"]))
    age = human_age(doc["last_used"], time.time())
    console.print(Text.assemble(("tokens    ", "bold"), f"{doc['tokens']}, last used {age}"))
    columns = ("#", "block", "start", "tokens", "where", "size", "shared with")
    table = _table(*columns, right=("#", "start", "tokens", "size", "shared with"))
    for i, b in enumerate(doc["blocks"]):
        shared = plural(b["shared_with"], "agent") if b["shared_with"] else "-"
        size = human_bytes(b["bytes"]) if b["on_disk"] else "-"
        where = "disk" if b["on_disk"] else "cold"
        table.add_row(str(i), b["hash"][:16], str(b["start"]), str(b["tokens"]), where, size, shared)
    console.print(table)
    totals = doc["totals"]
    console.print(
        f"{totals['blocks']} blocks: {totals['on_disk']} on disk ({human_bytes(totals['bytes'])}), "
        f"{totals['cold']} cold; removing this agent frees {human_bytes(totals['private_bytes'])}"
    )


def verify(root: Path, checked: dict[str, int], problems: list[Problem], fmt: Format) -> None:
    if fmt is Format.json:
        found = [{"path": str(p.path), "kind": p.kind, "reason": p.reason} for p in problems]
        emit_json({"ok": not problems, "checked": checked, "problems": found})
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
            console.print(f"[red]{plural(len(problems), 'problem')}[/red] in {summary}")
        else:
            console.print(f"[green]all good[/green]: {summary}")


def prune(
    root: Path, planned: list[tuple[str, str, str, int]], freed: int, dry_run: bool, max_age: float | None, fmt: Format
) -> None:
    """planned: (folder, kind, name, bytes) of every item."""
    if fmt is Format.json:
        removed = [{"folder": f, "kind": kind, "name": name, "bytes": size} for f, kind, name, size in planned]
        emit_json({"dry_run": dry_run, "older_than_s": max_age, "removed": removed, "freed_bytes": freed})
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
        console.print(f"{plural(len(planned), 'item')}, {verb} {human_bytes(freed)}{' (dry run)' * dry_run}")


def stats(root: Path, rows: list[FolderStats], total: FolderStats, fmt: Format) -> None:
    if fmt is Format.json:
        numbers = {k: v for k, v in asdict(total).items() if k not in ("model", "folder")}
        emit_json({"cache_dir": str(root), "models": [asdict(r) for r in rows], "total": numbers})
    elif fmt is Format.human:
        columns = ("agents", "blocks", "size", "cold", "orphans", "quarantined", "temp")
        table = _table("model", *columns, right=columns)
        for r in [*rows, total]:
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
        _stdout().print(table)

"""Which agents `cache ls` shows, and in which order: `--filter` and `--sort` expressions in
`hf cache ls`'s dialect (`--filter "last_used>7d"`, `--filter "size>10MB"`, `--sort size:asc`).

A filter is KEY OP VALUE with OP one of = == != > >= < <=. Times are ages: `last_used>7d`
keeps agents unused for more than seven days (as `hf cache ls --filter "accessed>7d"`). Sizes
take decimal units like hf's (10MB = 10,000,000 bytes) and binary ones (10MiB); text keys
compare with = or != and take shell wildcards (`id=planner-*`)."""

from __future__ import annotations

import fnmatch
import operator
import re
from collections.abc import Callable

import typer

from agent_memory.cli.cache.render import parse_duration
from agent_memory.cli.cache.rows import AgentRow
from agent_memory.memory.warm.folder.paths import model_names

_OPS: dict[str, Callable[[object, object], bool]] = {
    "=": operator.eq,
    "==": operator.eq,
    "!=": operator.ne,
    ">": operator.gt,
    ">=": operator.ge,
    "<": operator.lt,
    "<=": operator.le,
}
_FILTER_RE = re.compile(r"\s*(?P<key>[A-Za-z_-]+)\s*(?P<op>==|!=|>=|<=|=|>|<)\s*(?P<value>.*?)\s*")
_SIZE_RE = re.compile(r"(?P<n>\d+(?:\.\d+)?)\s*(?P<unit>[a-z]*)", re.IGNORECASE)
_SIZE_UNITS = {"": 1, "b": 1, "k": 10**3, "kb": 10**3, "m": 10**6, "mb": 10**6, "g": 10**9, "gb": 10**9}
_SIZE_UNITS |= {"t": 10**12, "tb": 10**12, "kib": 1 << 10, "mib": 1 << 20, "gib": 1 << 30, "tib": 1 << 40}

FILTER, SORT = "'--filter'", "'--sort'"
# key -> (value of a row, default order is descending). Ages sort as times: newest first.
SORT_KEYS: dict[str, tuple[Callable[[AgentRow], object], bool]] = {
    "last_used": (lambda r: r.last_used, True),
    "size": (lambda r: r.bytes, True),
    "tokens": (lambda r: r.tokens, True),
    "blocks": (lambda r: r.blocks, True),
    "id": (lambda r: r.id, False),
    "model": (lambda r: r.model, False),
}
NUMBER_KEYS = {"last_used", "size", "tokens", "blocks", "cold"}
TEXT_KEYS = {"id", "model", "tenant", "kind"}
ALIASES = {"accessed": "last_used", "last-used": "last_used", "bytes": "size", "name": "id"}
SORT_HELP = (
    "Sort by last_used, size, tokens, blocks (largest/newest first), id or model (A to Z); "
    "append :asc or :desc to choose (size:asc)."
)
FILTER_HELP = (
    'Keep agents matching KEY OP VALUE, e.g. "last_used>7d" (unused for over 7 days), "size>10MB", '
    '"tokens<=2000", "cold>0", "id=planner-*", "model=tiny", "kind=unnamed"; repeat to combine. Ops: = != > >= < <=.'
)


def parse_size(text: str) -> int:
    """Bytes in '500', '10MB', '1.5GB', '64KiB' (decimal units as hf's, binary with 'i')."""
    m = _SIZE_RE.fullmatch(text.strip())
    if not m or m["unit"].lower() not in _SIZE_UNITS:
        raise ValueError(f"{text!r} is not a size like 500, 64kB, 10MB, 1.5GB or 10MiB")
    return int(float(m["n"]) * _SIZE_UNITS[m["unit"].lower()])


def _key(name: str, allowed: set[str], option: str) -> str:
    key = ALIASES.get(name.lower(), name.lower())
    if key not in allowed:
        raise typer.BadParameter(f"unknown key {name!r}; one of {', '.join(sorted(allowed))}", param_hint=option)
    return key


def compile_filter(expr: str, now: float) -> Callable[[AgentRow], bool]:
    m = _FILTER_RE.fullmatch(expr)
    if not m or not m["value"]:
        raise typer.BadParameter(f"{expr!r} is not KEY OP VALUE, e.g. last_used>7d or size>10MB", param_hint=FILTER)
    key, op, value = _key(m["key"], NUMBER_KEYS | TEXT_KEYS, FILTER), m["op"], m["value"]
    compare = _OPS[op]
    if key in TEXT_KEYS:
        if op not in ("=", "==", "!="):
            raise typer.BadParameter(f"{key} takes = or != (with wildcards), not {op}", param_hint=FILTER)
        want = op != "!="

        def text(row: AgentRow) -> bool:
            values = model_names(row.folder, row.model) if key == "model" else [getattr(row, key)]
            return any(fnmatch.fnmatchcase(v, value) for v in values) == want

        return text
    try:
        if key == "last_used":
            limit = parse_duration(value)
            return lambda row: compare(now - row.last_used, limit)
        if key == "size":
            limit = parse_size(value)
            return lambda row: compare(row.bytes, limit)
        if not value.isdigit():
            raise ValueError(f"{value!r} is not a whole number")
        limit = int(value)
    except (ValueError, typer.BadParameter) as e:
        raise typer.BadParameter(f"{expr!r}: {getattr(e, 'message', e)}", param_hint=FILTER) from e
    return lambda row: compare(getattr(row, key), limit)


def parse_sort(expr: str) -> tuple[Callable[[AgentRow], object], bool]:
    """(key function, descending) of 'size', 'size:asc', 'last_used:desc', ..."""
    name, _, order = expr.strip().partition(":")
    key, descending = SORT_KEYS[_key(name, set(SORT_KEYS), SORT)]
    if order not in ("", "asc", "desc"):
        raise typer.BadParameter(f"{expr!r}: the order is :asc or :desc", param_hint=SORT)
    return key, (order == "desc") if order else descending


def select(rows: list[AgentRow], filters: list[str], sort: str, reverse: bool, now: float) -> list[AgentRow]:
    """The rows every filter keeps, in the order asked (ties by id, then folder)."""
    tests = [compile_filter(f, now) for f in filters]
    key, descending = parse_sort(sort)
    kept = sorted((r for r in rows if all(t(r) for t in tests)), key=lambda r: (r.id, r.folder))
    kept.sort(key=key, reverse=descending != reverse)  # stable: ties stay in id order
    return kept

"""The user's own config files, changed only with `--write-config`: each change is the file's
new text made from its current one (its other settings kept), shown as a diff, written
atomically (files.py) after a timestamped `.bak` copy of the old file. The merge helpers
keep a file's syntax: JSON objects updated, TOML tables and YAML keys replaced as text."""

from __future__ import annotations

import difflib
import json
import re
import stat
import time
import tomllib
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import yaml

from agent_memory.files import write_atomic


class ConfigFileError(Exception):
    """A user's file this command cannot read safely; the message names it and why."""


@dataclass(frozen=True)
class UserFile:
    path: Path
    fragment: str  # what is added, in the file's own syntax (what --print shows)
    merge: Callable[[str | None], str]  # the file's new text from its current one (None: no file yet)


@dataclass(frozen=True)
class Written:
    path: Path
    diff: str  # empty when the file already held it
    backup: Path | None


def write_user_file(file: UserFile) -> Written:
    path = file.path.expanduser().resolve()  # a dotfile linked from elsewhere stays a link
    old = path.read_text() if path.exists() else None
    new = file.merge(old)
    if new == old:
        return Written(path, "", None)
    diff = "".join(
        difflib.unified_diff(
            (old or "").splitlines(keepends=True), new.splitlines(keepends=True), str(path), str(path)
        )
    )
    path.parent.mkdir(parents=True, exist_ok=True)
    backup = None
    mode = stat.S_IMODE(path.stat().st_mode) if old is not None else 0o600
    if old is not None:
        backup = path.with_name(f"{path.name}.{time.strftime('%Y%m%d-%H%M%S')}.bak")
        write_atomic(backup, [old.encode()], follow_parent=True)
        backup.chmod(mode)
    write_atomic(path, [new.encode()], follow_parent=True)
    path.chmod(mode)
    return Written(path, diff, backup)


def json_merge(path: Path, update: Callable[[dict], None]) -> Callable[[str | None], str]:
    """A JSON object file with `update` applied (a file with comments, JSONC, is refused)."""

    def merge(old: str | None) -> str:
        try:
            data = json.loads(old) if old and old.strip() else {}
        except ValueError as e:
            raise ConfigFileError(f"{path} is not plain JSON ({e}); add the settings --print shows by hand") from None
        if not isinstance(data, dict):
            raise ConfigFileError(f"{path} does not hold a JSON object")
        update(data)
        return json.dumps(data, indent=2) + "\n"

    return merge


def toml_value(value: object) -> str:
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, int):
        return str(value)
    return json.dumps(str(value))  # a TOML basic string


def toml_tables(tables: dict[str, dict[str, object]]) -> str:
    return "\n".join(
        f"[{name}]\n" + "".join(f"{key} = {toml_value(v)}\n" for key, v in values.items())
        for name, values in tables.items()
    )


def toml_merge(path: Path, tables: dict[str, dict[str, object]]) -> Callable[[str | None], str]:
    """The TOML file with each of `tables` replaced whole (or added at its end), the rest as it was."""
    headers = {f"[{name}]" for name in tables}

    def merge(old: str | None) -> str:
        kept, skipping = [], False
        for line in (old or "").splitlines(keepends=True):
            if re.match(r"\s*\[", line):
                skipping = line.split("#")[0].strip().replace(" ", "") in headers
            if not skipping:
                kept.append(line)
        text = "".join(kept).rstrip("\n")
        new = (text + "\n\n" if text else "") + toml_tables(tables)
        try:
            tomllib.loads(new)
        except tomllib.TOMLDecodeError as e:
            raise ConfigFileError(f"{path} would not be valid TOML after the change ({e}); add the tables by hand")
        return new

    return merge


def yaml_keys_merge(path: Path, values: dict[str, object]) -> Callable[[str | None], str]:
    """A flat YAML file (aider's .aider.conf.yml) with these top-level keys set, the rest as it was."""

    def merge(old: str | None) -> str:
        keys = tuple(f"{key}:" for key in values)
        kept = [line for line in (old or "").splitlines(keepends=True) if not line.startswith(keys)]
        text = "".join(kept).rstrip("\n")
        added = "".join(f"{key}: {json.dumps(v)}\n" for key, v in values.items())
        new = (text + "\n" if text else "") + added
        _check_yaml(path, new)
        return new

    return merge


def yaml_list_merge(path: Path, entry: dict, key: str) -> Callable[[str | None], str]:
    """A YAML list of objects (llm's extra-openai-models.yaml) with `entry` in it: added at the
    end as text, or in place of the one with the same `key` (the list written anew)."""

    def merge(old: str | None) -> str:
        entries = _check_yaml(path, old or "") or []
        if not isinstance(entries, list):
            raise ConfigFileError(f"{path} does not hold a YAML list")
        if entry in entries:
            return old or ""
        if any(isinstance(e, dict) and e.get(key) == entry[key] for e in entries):
            entries = [entry if isinstance(e, dict) and e.get(key) == entry[key] else e for e in entries]
            return yaml.safe_dump(entries, sort_keys=False)
        text = (old or "").rstrip("\n")
        return (text + "\n" if text else "") + yaml.safe_dump([entry], sort_keys=False)

    return merge


def _check_yaml(path: Path, text: str) -> object:
    try:
        return yaml.safe_load(text)
    except yaml.YAMLError as e:
        raise ConfigFileError(f"{path} is not valid YAML ({e})") from None

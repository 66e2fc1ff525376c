"""The --api-keys-file: one `name key` per line, each key a tenant with its own agents and cached
blocks (config.py's Settings reads it; a tenant's name never holds a NUL, which agent_key.py's
record names rely on); and whether a host is loopback (keys are required off it)."""

from __future__ import annotations

import ipaddress
import re
from pathlib import Path

TENANT_NAME = re.compile(r"^[A-Za-z0-9._-]{1,64}$")


class KeysFileError(ValueError):
    """The keys file cannot be read or a line of it is wrong; the message names the line."""


def read_api_keys(path: Path) -> dict[str, str]:
    """An --api-keys-file: one `name key` per line (blank lines and # comments skipped)."""
    try:
        lines = path.expanduser().read_text().splitlines()
    except (OSError, UnicodeError) as e:
        raise KeysFileError(f"cannot read --api-keys-file {path}: {e}") from e
    keys: dict[str, str] = {}
    for number, line in enumerate(lines, 1):
        line = line.strip()
        if not line or line.startswith("#"):
            continue
        parts = line.split()
        if len(parts) != 2 or not TENANT_NAME.match(parts[0]):
            raise KeysFileError(f"{path}:{number}: expected 'name key' (name: letters, digits, . _ -)")
        name, key = parts
        if key in keys:
            raise KeysFileError(f"{path}:{number}: this key is already given to '{keys[key]}'")
        keys[key] = name
    if not keys:
        raise KeysFileError(f"{path}: no keys")
    return keys


def is_loopback(host: str) -> bool:
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host.strip("[]")).is_loopback
    except ValueError:
        return False

"""Lines a server says once rather than on every request that would repeat them (a tool schema
loosened, a hosted tool left out, a call off its schema): the keys said since this server
started. `build_app` (cli/serve.py) starts each server afresh, so a server started again in the
same process (as the tests do) says them again."""

from __future__ import annotations

from collections.abc import Hashable

_said: set[Hashable] = set()


def first_time(key: Hashable) -> bool:
    """Whether `key` is said now for the first time since the server started (and remember it)."""
    if key in _said:
        return False
    _said.add(key)
    return True


def start_afresh() -> None:
    """A server starts: nothing said yet."""
    _said.clear()

"""The value types settings share (config.py): a choice among a few values, a KV precision, and a
setting that may be given more than once."""

from __future__ import annotations

from typing import Annotated

from pydantic import AfterValidator, BeforeValidator
from pydantic_settings import NoDecode


def one_of(*allowed) -> AfterValidator:
    def check(v):
        if isinstance(v, str):
            v = v.lower()
        if v not in allowed:
            raise ValueError(f"takes {', '.join(map(str, allowed[:-1]))} or {allowed[-1]}, not {v}")
        return v

    return AfterValidator(check)


KVBits = Annotated[int, one_of(4, 8, 16)]


def _listed(v):
    """A list setting given as one string (the environment, or a TOML string): comma-separated."""
    return [part.strip() for part in v.split(",") if part.strip()] if isinstance(v, str) else v


# A setting that may be given more than once: a repeated flag, a TOML list, or "a,b" in the
# environment (read as is, not as JSON).
Repeated = Annotated[list[str], NoDecode, BeforeValidator(_listed)]

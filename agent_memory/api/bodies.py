"""What every wire format's request body shares: unknown fields are accepted and ignored, every
string must be valid Unicode, and tools are named alike."""

from __future__ import annotations

import re
from collections.abc import Callable
from typing import Any, ClassVar

from pydantic import BaseModel, ConfigDict, model_validator
from pydantic_core import PydanticCustomError

LONE_SURROGATE = re.compile("[\ud800-\udfff]")


def escape_surrogates(text: str) -> str:
    """`text` with each lone surrogate written as its escape (\\ud800): what an error may
    quote of a request, since a surrogate cannot be encoded as UTF-8 into a reply or a log."""
    return text.encode("utf-8", "backslashreplace").decode("utf-8")


def field_error(param: str, why: str) -> PydanticCustomError:
    """A 400 naming `param` (a dotted path: messages.2.content), raised from a validator that
    sees more than the one field: a body's, or a message's."""
    return PydanticCustomError("invalid_field", "{param}: {why}", {"param": param, "why": why})


def invalid_text_path(value: Any, path: tuple = ()) -> tuple | None:
    """The path of the first string (key or value) that is not valid Unicode: JSON lets a
    client send a lone surrogate escape ("\\ud800"), which no tokenizer or file name takes."""
    if isinstance(value, str):
        return path if LONE_SURROGATE.search(value) else None
    if isinstance(value, dict):
        for key, item in value.items():
            if isinstance(key, str) and LONE_SURROGATE.search(key):
                return (*path, key)
            if (found := invalid_text_path(item, (*path, key))) is not None:
                return found
    if isinstance(value, list):
        for i, item in enumerate(value):
            if (found := invalid_text_path(item, (*path, i))) is not None:
                return found
    return None


class RequestBody(BaseModel):
    """A request body: unknown fields allowed, every string valid Unicode, and the published
    fields this server cannot honour (`UNSUPPORTED`) a 400 naming them, where their value asks
    for what it cannot do (docs/usage.md, "Supported request fields", lists every field)."""

    model_config = ConfigDict(extra="allow")
    # field -> (whether a value asks for what this server cannot do, what to do instead)
    UNSUPPORTED: ClassVar[dict[str, tuple[Callable[[Any], bool], str]]] = {}

    @model_validator(mode="before")
    @classmethod
    def valid_unicode(cls, data: Any) -> Any:
        path = invalid_text_path(data)
        if path is not None:
            param = escape_surrogates(".".join(str(p) for p in path))  # a key may be the surrogate
            raise PydanticCustomError("invalid_unicode", "{param}: not valid Unicode text", {"param": param})
        return data

    @model_validator(mode="before")
    @classmethod
    def supported_fields(cls, data: Any) -> Any:
        if isinstance(data, dict):
            for name, (refused, why) in cls.UNSUPPORTED.items():
                if data.get(name) is not None and refused(data[name]):
                    raise PydanticCustomError("unsupported_field", "{param}: " + why, {"param": name})
        return data


TOOL_NAME = r"^[a-zA-Z0-9_-]{1,64}$"
PROMPT_CACHE_KEY = 64  # the longest prompt_cache_key OpenAI takes (an agent id sent otherwise: 256)

"""Keeping a quiet stream alive: clients with idle timeouts wait through a long prefill or a
queue when the stream sends something (a ping, a comment) every so often."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator
from typing import TypeVar

T = TypeVar("T")


async def with_keepalive(source: AsyncIterator[T], seconds: float) -> AsyncIterator[T | None]:
    """`source`'s items, and None each time `seconds` pass without one: a stream's cue to send
    something (a ping, a comment) so that clients with idle timeouts wait through a long
    prefill or a queue. Waiting never cancels `source`; leaving early closes it."""
    items = aiter(source)
    pending: asyncio.Future | None = None
    try:
        while True:
            if pending is None:
                pending = asyncio.ensure_future(anext(items))
            done, _ = await asyncio.wait({pending}, timeout=seconds)
            if not done:
                yield None
                continue
            finished, pending = pending, None
            try:
                item = finished.result()
            except StopAsyncIteration:
                return
            yield item
    finally:
        if pending is not None:
            pending.cancel()
            with contextlib.suppress(BaseException):
                await pending
        if hasattr(items, "aclose"):
            await items.aclose()

"""The reply side of the Anthropic Messages wire format (messages.py): the engine's events as
Anthropic's content blocks, the SSE events a stream sends and the Message a JSON reply is, with
its stop reason and usage; and Anthropic's error shape. One `Reply` builds both, so a stream
and a JSON reply cannot differ.

Usage: every prompt token a request computes is committed to the cache when it ends, so
`cache_creation_input_tokens` is the prompt less what was read from the cache, and
`input_tokens` (the part never cached) is 0.
"""

from __future__ import annotations

import json
import math
import sys
import uuid
from collections.abc import Callable

from agent_memory.cache_miss import usage_field
from agent_memory.chat.conversation import Message, ToolCall
from agent_memory.chat.events import CallCutOff, CallStart, ContentDelta, OutputEvent, ReasoningDelta
from agent_memory.engine.requests import Finished, TextDelta, Usage


def usage_dict(usage: Usage, output_tokens: int) -> dict:
    """The prompt is input_tokens + cache_read_input_tokens + cache_creation_input_tokens.
    Read: the KV that came from the cache (hot: memory, warm: disk, also given apart). Created:
    every other prompt token, computed now and committed to the cache when the request ends (an
    agent's turn as its memory, an anonymous request's blocks for prefix sharing), kept as
    long as the memory and disk budgets allow. None is left out of the cache: input_tokens 0.
    `cache_miss`: why the rest was not reused (docs/usage.md, "Why a request missed")."""
    read = usage.cached_tokens
    return {
        "input_tokens": 0,
        "cache_creation_input_tokens": usage.prompt_tokens - read,
        "cache_read_input_tokens": read,
        "output_tokens": output_tokens,
        "cache_read_hot_input_tokens": usage.hot_tokens,
        "cache_read_warm_input_tokens": usage.warm_tokens,
        **usage_field(usage.miss),
    }


def _finite(text: str) -> float:
    """A JSON number as a float: one past a float's range (`1e999`, valid JSON that a model may
    write) as the largest float of its sign, since JSON replies cannot hold infinity."""
    value = float(text)
    return value if math.isfinite(value) else math.copysign(sys.float_info.max, value)


def _input(arguments: str) -> dict:
    """A tool_use block's input from its arguments text ({} if they are not an object)."""
    try:
        value = json.loads(arguments, parse_float=_finite)
    except ValueError:
        return {}
    return value if isinstance(value, dict) else {}


class Reply:
    """One reply, built from the engine's events: the SSE events a stream sends and the Message
    a JSON reply is come from here, so they cannot differ. Blocks are numbered 0, 1, … in
    order, each started (a tool_use with `input: {}`) before its deltas and stopped before the
    next starts. Reasoning is a `thinking` block, its signature its text sealed by `sign`
    (api/sealing.py): a block sent back is the turn's reasoning once its signature opens to it."""

    def __init__(self, model: str, reader, clamped: bool, prewarm: bool, sign: Callable[[str], str]) -> None:
        self.id = "msg_" + uuid.uuid4().hex[:24]
        self.model = model
        self.reader = reader  # chat/reader.py's ReplyReader, or harmony's
        self.clamped = clamped  # max_tokens was more than the context had room for
        self.prewarm = prewarm  # max_tokens 0: the prompt is computed and cached, nothing written
        self.sign = sign  # a thinking block's text -> its signature
        self.content: list[dict] = []
        self.open: dict | None = None  # the block being written
        self.arguments = ""  # the open tool_use block's input so far, as JSON text
        self.whole = False  # its Finished read: every block is closed

    def feed(self, event: TextDelta | Finished) -> list[tuple[str, dict]]:
        """The SSE events (name, data) for one engine event; after Finished, the reply is whole."""
        if isinstance(event, TextDelta) and self.prewarm:
            return []
        outs = self.reader.read(event.text if isinstance(event, TextDelta) else None)
        frames = [frame for out in outs for frame in self._write(out)]
        if isinstance(event, Finished):
            self.whole = True
            frames += self._stop()
            usage = self.message(event)["usage"]
            delta = {"stop_reason": self.stop_reason(event), "stop_sequence": self.stop_sequence(event)}
            frames.append(("message_delta", {"type": "message_delta", "delta": delta, "usage": usage}))
            frames.append(("message_stop", {"type": "message_stop"}))
        return frames

    def message(self, finished: Finished | None) -> dict:
        """The Message: whole once finished; before, as message_start sends it (no content,
        usage all 0: message_delta's cumulative usage overwrites it, with the SDKs and Claude
        Code alike, once the cache's part is known)."""
        if finished is None:
            usage = {"input_tokens": 0, "cache_creation_input_tokens": 0, "cache_read_input_tokens": 0, "output_tokens": 0}
            stop_reason = stop_sequence = None
        else:
            usage = usage_dict(finished.usage, 0 if self.prewarm else finished.usage.completion_tokens)
            stop_reason, stop_sequence = self.stop_reason(finished), self.stop_sequence(finished)
        return {
            "id": self.id,
            "type": "message",
            "role": "assistant",
            "model": self.model,
            "content": self.content if finished is not None else [],
            "stop_reason": stop_reason,
            "stop_sequence": stop_sequence,
            "usage": usage,
        }

    def returned(self) -> Message | None:
        """The turn as its client sends it back, once whole, read as conversation.py reads an
        assistant message: texts joined by newlines, thinking as its reasoning, each tool_use's
        input as json.dumps writes it. None for a prewarm (no turn)."""
        if not self.whole or self.prewarm:
            return None
        blocks = self.content
        text = "\n".join(b["text"] for b in blocks if b["type"] == "text")
        reasoning = "".join(b["thinking"] for b in blocks if b["type"] == "thinking")
        uses = [b for b in blocks if b["type"] == "tool_use"]
        calls = [ToolCall(b["id"], b["name"], json.dumps(b["input"], ensure_ascii=False)) for b in uses]
        return Message("assistant", text, calls, reasoning=reasoning)

    def stop_reason(self, finished: Finished) -> str:
        if finished.reason == "length":
            return "model_context_window_exceeded" if self.clamped else "max_tokens"
        if self.reader.calls:
            return "tool_use"
        return "stop_sequence" if finished.stop_sequence is not None else "end_turn"

    def stop_sequence(self, finished: Finished) -> str | None:
        return finished.stop_sequence if self.stop_reason(finished) == "stop_sequence" else None

    def _write(self, out: OutputEvent) -> list[tuple[str, dict]]:
        if isinstance(out, ReasoningDelta):
            fresh = self.open is None or self.open["type"] != "thinking"
            frames = self._start({"type": "thinking", "thinking": "", "signature": ""}) if fresh else []
            self.open["thinking"] += out.text
            return frames + [self._delta({"type": "thinking_delta", "thinking": out.text})]
        if isinstance(out, ContentDelta):
            if not out.text:
                return []
            frames = [] if self.open is not None and self.open["type"] == "text" else self._start({"type": "text", "text": ""})
            self.open["text"] += out.text
            return frames + [self._delta({"type": "text_delta", "text": out.text})]
        if isinstance(out, CallStart):
            call_id = "toolu_" + out.id.removeprefix("call_")
            return self._start({"type": "tool_use", "id": call_id, "name": out.name, "input": {}})
        if isinstance(out, CallCutOff):
            self.arguments = out.arguments
            return []
        self.arguments += out.text
        return [self._delta({"type": "input_json_delta", "partial_json": out.text})]

    def _start(self, block: dict) -> list[tuple[str, dict]]:
        frames = self._stop()
        start = {"type": "content_block_start", "index": len(self.content), "content_block": dict(block)}
        self.content.append(block)
        self.open, self.arguments = block, ""
        return frames + [("content_block_start", start)]

    def _delta(self, delta: dict) -> tuple[str, dict]:
        return "content_block_delta", {"type": "content_block_delta", "index": len(self.content) - 1, "delta": delta}

    def _stop(self) -> list[tuple[str, dict]]:
        if self.open is None:
            return []
        frames = []
        if self.open["type"] == "tool_use":
            self.open["input"] = _input(self.arguments)
        elif self.open["type"] == "thinking":
            self.open["signature"] = self.sign(self.open["thinking"])
            frames.append(self._delta({"type": "signature_delta", "signature": self.open["signature"]}))
        self.open = None
        return frames + [("content_block_stop", {"type": "content_block_stop", "index": len(self.content) - 1})]


# -- errors ------------------------------------------------------------------------------

ERROR_TYPES = {
    400: "invalid_request_error",
    401: "authentication_error",
    403: "permission_error",
    404: "not_found_error",
    413: "request_too_large",
    429: "rate_limit_error",
    500: "api_error",
    529: "overloaded_error",
}


def error_shape(status: int, message: str, param: str | None = None, code: str | None = None) -> tuple[int, dict]:
    """Anthropic's error: {"type": "error", "error": {type, message}}. A 503 (a full queue, a
    model still loading, a shutdown) is Anthropic's 529 overloaded_error, which its clients retry;
    a model that cannot be loaded stays a 500 api_error, its `x-should-retry: false` header kept
    (api/errors.py `failure`), which its clients do not retry."""
    if status == 503:
        status = 529
    kind = ERROR_TYPES.get(status) or ("api_error" if status >= 500 else "invalid_request_error")
    return status, {"type": "error", "error": {"type": kind, "message": message}}


def sse(name: str, data: dict) -> str:
    """An SSE event with its `event:` line (Anthropic's clients skip events without one)."""
    return f"event: {name}\ndata: {json.dumps(data, ensure_ascii=False)}\n\n"

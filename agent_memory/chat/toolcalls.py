"""Generated text back into content and tool calls, as it streams.

In the built-in JSON format (render.py) a call streams as it is written: its name as soon as
it is known, then its arguments in fragments, so a client sees OpenAI-style deltas whose
concatenation is exactly the finished call's `arguments`. A call is over when its arguments
object closes (tracked by depth and string state, so braces inside strings do not count).
Other formats (chat/formats/) are collected whole and parsed at their end marker, or at the
reply's end where the format has none (Mistral's). Text that could still begin a call marker
is held back, like a stop string.
"""

from __future__ import annotations

import json
from collections.abc import Callable

from agent_memory.chat.conversation import ToolCall, new_call_id
from agent_memory.chat.events import (
    CallArguments,
    CallCutOff,
    CallStart,
    ContentDelta,
    OutputEvent,
    StateReader,
    held_back,
)
from agent_memory.chat.render import ARGUMENTS_KEY, CALL_END, CALL_PREFIX, CALL_START


class JsonDepth:
    """Where a JSON value that starts with `{` ends, fed piece by piece."""

    def __init__(self) -> None:
        self.depth = 0
        self.in_string = False
        self.escaped = False

    def feed(self, text: str) -> int | None:
        """Index in `text` just past the value's end, or None if it has not ended."""
        for i, ch in enumerate(text):
            if self.in_string:
                if self.escaped:
                    self.escaped = False
                elif ch == "\\":
                    self.escaped = True
                elif ch == '"':
                    self.in_string = False
            elif ch == '"':
                self.in_string = True
            elif ch in "{[":
                self.depth += 1
            elif ch in "}]":
                self.depth -= 1
                if self.depth == 0:
                    return i + 1
        return None


class ToolCallParser(StateReader):
    """Feed generated text; get content and tool-call events. `parse_whole`: for formats other
    than the built-in JSON one, (the text between `start` and `end`) -> [{"name", "arguments"}].
    `lead`: what the template writes between a turn's text and its first call (Qwen3's "\n"):
    left out of the content, since the template writes it back itself."""

    def __init__(
        self,
        start: str = CALL_START,
        end: str = CALL_END,
        parse_whole: Callable[[str], list[dict]] | None = None,
        lead: str = "",
    ):
        self.start, self.end, self.parse_whole, self.lead = start, end, parse_whole, lead
        self.buf = ""
        self.state = "text"  # text | head | arguments | suffix | tail | whole
        self.calls: list[ToolCall] = []
        self.wrote = False  # content has been written
        self._name = ""
        self._id = ""
        self._args: list[str] = []
        self._depth: JsonDepth | None = None

    def finish(self) -> list[OutputEvent]:
        """Events for what is left at the end. A call cut off before its name was whole never
        started: its text is content. One cut off in its arguments has started (a stream has
        sent its name): it is cut off, not turned into text."""
        out: list[OutputEvent] = []
        if self.state == "text":
            if self.buf:
                out.append(ContentDelta(self.buf))
        elif self.state == "tail":
            if self.buf.strip():
                out.append(ContentDelta(self.buf))
        elif self.state == "suffix":
            self._close_call()  # its arguments are whole; only the end marker is missing
        elif self.state == "arguments":
            out.append(CallCutOff(len(self.calls)))
        elif self.state == "whole" and not self.end:  # calls run to the reply's end
            self._parse(self.buf[len(self.start) :], out)
        else:  # head, whole: no call started
            out.append(ContentDelta(self.buf))
        self.buf = ""
        return out

    # -- states ----------------------------------------------------------------------------

    def _text(self, out: list[OutputEvent]) -> None:
        at = self.buf.find(self.start)
        if at < 0:
            keep = max(held_back(self.buf, self.start), held_back(self.buf, self.lead + self.start))
            if len(self.buf) > keep:
                out.append(ContentDelta(self.buf[: len(self.buf) - keep]))
                self.buf = self.buf[len(self.buf) - keep :]
                self.wrote = True
            return
        text = self.buf[:at]
        if self.lead and text.endswith(self.lead) and (text[: -len(self.lead)] or self.wrote or self.calls):
            text = text[: -len(self.lead)]  # the template's, after text (none where the turn has no text)
        if text:
            out.append(ContentDelta(text))
        self.buf = self.buf[at:]
        self.state = "head" if self.parse_whole is None else "whole"

    def _head(self, out: list[OutputEvent]) -> None:
        """`<tool_call>\\n{"name": "…", "arguments": ` — then the arguments stream."""
        if not self.buf.startswith(CALL_PREFIX[: len(self.buf)]):
            self.state = "whole"  # not the canonical layout: parse the call when it ends
            return
        if len(self.buf) <= len(CALL_PREFIX):
            return
        try:
            name, end = json.JSONDecoder().raw_decode(self.buf, len(CALL_PREFIX))
        except ValueError:
            return  # the name is still being written
        rest = self.buf[end:]
        if not isinstance(name, str) or not ARGUMENTS_KEY.startswith(rest[: len(ARGUMENTS_KEY)]):
            self.state = "whole"
            return
        if len(rest) < len(ARGUMENTS_KEY):
            return
        self._name, self._id, self._args = name, new_call_id(), []
        self._depth = JsonDepth()
        out.append(CallStart(len(self.calls), self._id, name))
        head = len(self.buf) - len(rest) + len(ARGUMENTS_KEY)
        self.buf = self.buf[head:]
        self.state = "arguments"

    def _arguments(self, out: list[OutputEvent]) -> None:
        if not self.buf:
            return
        end = self._depth.feed(self.buf)
        piece = self.buf if end is None else self.buf[:end]
        if piece:
            self._args.append(piece)
            out.append(CallArguments(len(self.calls), piece))
        self.buf = "" if end is None else self.buf[end:]
        if end is not None:
            self.state = "suffix"

    def _suffix(self, out: list[OutputEvent]) -> None:
        """The arguments have closed: the call is whole at its end marker (`}\n</tool_call>`
        when constrained; an unconstrained model may space it otherwise)."""
        at = self.buf.find(self.end)
        if at < 0:
            return
        self._close_call()
        self.buf = self.buf[at + len(self.end) :]
        self.state = "tail"

    def _close_call(self) -> None:
        self.calls.append(ToolCall(self._id, self._name, "".join(self._args)))

    def _tail(self, out: list[OutputEvent]) -> None:
        """After a call: whitespace and more calls (constrained output has nothing else)."""
        stripped = self.buf.lstrip()
        if stripped.startswith(self.start):
            self.buf = stripped
            self.state = "text"
        elif stripped and not self.start.startswith(stripped[: len(self.start)]):
            self.state = "text"  # text after the calls (an unconstrained model): content

    def _whole(self, out: list[OutputEvent]) -> None:
        """A call in another layout: wait for its end marker, then parse it in one piece."""
        at = self.buf.find(self.end) if self.end else -1
        if at < 0:
            return
        body = self.buf[len(self.start) : at]
        self.buf = self.buf[at + len(self.end) :]
        self.state = "tail"
        self._parse(body, out)

    def _parse(self, body: str, out: list[OutputEvent]) -> None:
        try:
            parsed = self.parse_whole(body) if self.parse_whole else [json.loads(body)]
            found = [(str(p["name"]), p.get("arguments", {})) for p in parsed]
        except (ValueError, KeyError, TypeError):
            out.append(ContentDelta(self.start + body + self.end))  # malformed: it is text
            return
        for name, arguments in found:
            text = arguments if isinstance(arguments, str) else json.dumps(arguments, ensure_ascii=False)
            call = ToolCall(new_call_id(), name, text)
            out.append(CallStart(len(self.calls), call.id, call.name))
            out.append(CallArguments(len(self.calls), text))
            self.calls.append(call)



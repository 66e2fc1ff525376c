"""gpt-oss's harmony format. After the prompt's `<|start|>assistant` the model writes channels:
`<|channel|>analysis<|message|>…<|end|><|start|>assistant` (reasoning), then either
`<|channel|>final<|message|>…` (the answer) or ` to=functions.f<|channel|>commentary
json<|message|>{…}` (a call; `<|call|>` ends the turn). The grammar makes the model write
exactly the layout its template writes back (one call per turn, as the template assumes), and
the reader turns channels into reasoning, content and calls. The markers are special tokens:
the engine shows them in the reply's text (engine/tokens/detokenizer.py) so that they can be read.
"""

from __future__ import annotations

import json
import re

from agent_memory.chat.conversation import ToolCall, new_call_id
from agent_memory.chat.events import (
    CallArguments,
    CallCutOff,
    CallStart,
    ContentDelta,
    OutputEvent,
    ReasoningDelta,
    StateReader,
    held_back,
)
from agent_memory.chat.formats.calls import Wanted, json_rule
from agent_memory.chat.formats.markup import Markup

CHANNEL, MESSAGE, END, START = "<|channel|>", "<|message|>", "<|end|>", "<|start|>"
ANALYSIS = f"{CHANNEL}analysis{MESSAGE}"
FINAL = f"{CHANNEL}final{MESSAGE}"
NEXT = f"{END}{START}assistant"
CALL_HEAD = " to=functions."
CALL_CHANNEL = f"{CHANNEL}commentary json{MESSAGE}"
MARKERS = (CHANNEL, MESSAGE, END, START, "<|constrain|>")
TO = re.compile(r"to=functions\.([^\s<]+)")


class HarmonyReply:
    name = "harmony"
    native = True
    constrained = True
    describe = None
    history_key = "thinking"  # where its template reads an earlier turn's reasoning
    closers = (END,)
    markers = MARKERS
    opener = CALL_HEAD

    def lark(self, wanted: Wanted, m: Markup) -> str | None:
        """The grammar, or None where the output is free (no tools, no JSON answer)."""
        tools, mode, answer = wanted.calls, wanted.mode, wanted.answer
        if not tools and answer is None:
            return None
        rules = [
            f"analysis: {m.lit(ANALYSIS)} THOUGHT {m.lit(NEXT)}",
            "THOUGHT: /(?s:.*)/",
            f"final: {m.lit(FINAL)} TEXT",
            "TEXT: /(?s:.*)/",
        ]
        answers = []
        if answer is not None and mode in ("auto", "none"):
            rules += [f"final_json: {m.lit(FINAL)} answer", json_rule("answer", answer)]
            answers.append("final_json")
        elif mode in ("auto", "none"):
            answers.append("final")
        if tools:
            names = " | ".join(f"tool_{i}" for i in range(len(tools)))
            rules.append(f"call: {m.lit(CALL_HEAD)} ({names})")
            for i, tool in enumerate(tools):
                rules.append(f"tool_{i}: {m.lit(tool.name + CALL_CHANNEL)} args_{i}")
                rules.append(json_rule(f"args_{i}", tool.parameters))
            answers.append("call")
        return f"start: analysis? ({' | '.join(answers)})\n" + "\n".join(rules)

    def reader(self, tools, started: bool | None) -> HarmonyReader:
        return HarmonyReader()

    def started_by(self, prompt_text: str) -> bool | None:
        return None


class HarmonyReader(StateReader):
    """Feed reply text (its markers shown); get reasoning, content and call events."""

    def __init__(self) -> None:
        self.buf = ""
        self.state = "header"  # header | body | between
        self.kind = "content"  # the open message's: reasoning | content | call
        self.calls: list[ToolCall] = []
        self._call: ToolCall | None = None

    def read(self, text: str | None) -> list[OutputEvent]:
        return self.feed(text) if text is not None else self._finish([])

    def _header(self, out: list[OutputEvent]) -> None:
        at = self.buf.find(MESSAGE)
        if at < 0:
            if self.buf and not any(m.startswith(self.buf[: len(m)]) for m in (CHANNEL, CALL_HEAD, " to=")):
                self.kind, self.state = "content", "body"  # no header at all: plain text
            return
        header, self.buf = self.buf[:at], self.buf[at + len(MESSAGE) :]
        self.state = "body"
        if name := TO.search(header):
            self._call = ToolCall(new_call_id(), name.group(1), "")
            self.kind = "call"
            out.append(CallStart(len(self.calls), self._call.id, self._call.name))
        else:
            self.kind = "reasoning" if f"{CHANNEL}analysis" in header else "content"

    def _body(self, out: list[OutputEvent]) -> None:
        at = self.buf.find(END)
        piece = self.buf if at < 0 else self.buf[:at]
        keep = 0 if at >= 0 else held_back(piece, END)
        self._emit(piece[: len(piece) - keep], out)
        self.buf = self.buf[len(piece) - keep :] if at < 0 else self.buf[at + len(END) :]
        if at >= 0:
            self._close()
            self.state = "between"

    def _between(self, out: list[OutputEvent]) -> None:
        """`<|start|>assistant` before the next message's header."""
        if self.buf.startswith(START):
            rest = self.buf[len(START) :]
            cut = min((i for i in (rest.find(CHANNEL), rest.find(" to=")) if i >= 0), default=-1)
            if cut >= 0:
                self.buf, self.state = rest[cut:], "header"
        elif self.buf and not START.startswith(self.buf[: len(START)]):
            self.state = "header"

    def _emit(self, text: str, out: list[OutputEvent]) -> None:
        if not text:
            return
        if self.kind == "call":
            self._call = ToolCall(self._call.id, self._call.name, self._call.arguments + text)
            out.append(CallArguments(len(self.calls), text))
        else:
            out.append(ReasoningDelta(text) if self.kind == "reasoning" else ContentDelta(text))

    def _close(self) -> None:
        if self._call is not None:
            self.calls.append(self._call)
            self._call = None

    def _finish(self, out: list[OutputEvent]) -> list[OutputEvent]:
        if self.state == "body":
            self._emit(self.buf, out)
        elif self.state == "header" and self.buf and not self.buf.startswith((CHANNEL, " to=")):
            out.append(ContentDelta(self.buf))
        self.buf = ""
        if self._call is not None:
            try:
                whole = isinstance(json.loads(self._call.arguments), dict)
            except ValueError:
                whole = False
            if whole:
                self._close()
            else:
                out.append(CallCutOff(len(self.calls)))
                self._call = None
        return out

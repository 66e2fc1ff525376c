"""What a reply's generated text is, read piece by piece: text for the client, reasoning, and
tool calls (a call's start, fragments of its arguments, or a call cut off). Every wire format
turns these same events into its own shapes."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class ContentDelta:
    text: str


@dataclass(frozen=True)
class ReasoningDelta:
    """Thinking text (`<think>…</think>`, harmony's analysis channel), never content."""

    text: str


@dataclass(frozen=True)
class CallStart:
    index: int
    id: str
    name: str


@dataclass(frozen=True)
class CallArguments:
    index: int
    text: str


@dataclass(frozen=True)
class CallCutOff:
    """The reply ended inside this call's arguments (max_tokens, a stop string): it stays a
    call, since a stream has sent its start, but what was written of its arguments is not JSON,
    so the call is whole with `arguments` instead."""

    index: int
    arguments: str = "{}"


OutputEvent = ContentDelta | ReasoningDelta | CallStart | CallArguments | CallCutOff


class StateReader:
    """A reader of text driven by its state: `_<state>(out)` takes what it can of `buf` and may
    change the state; it runs until neither the state nor `buf` changes."""

    state = ""
    buf = ""

    def feed(self, text: str) -> list[OutputEvent]:
        self.buf += text
        out: list[OutputEvent] = []
        while True:
            before = (self.state, len(self.buf))
            getattr(self, f"_{self.state}")(out)
            if (self.state, len(self.buf)) == before:
                return out


def held_back(buf: str, marker: str) -> int:
    """Length of the longest end of `buf` that begins `marker`: text a reader holds back, like
    a stop string, since it may yet be the marker."""
    for n in range(min(len(buf), len(marker) - 1), 0, -1):
        if buf.endswith(marker[:n]):
            return n
    return 0

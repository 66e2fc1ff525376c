"""A reply's generated text read into events (events.py): reasoning split off first where the
model thinks in tags, then calls found in the rest. The one way every wire format's reply,
streamed or not, reads generated text, so a reply ends alike everywhere (a call cut off in its
arguments: a call with `{}` arguments, never its raw markup as content). Harmony (gpt-oss)
has its own reader with the same methods (formats/harmony.py)."""

from __future__ import annotations

from agent_memory.chat.conversation import ToolCall
from agent_memory.chat.events import ContentDelta, OutputEvent
from agent_memory.chat.formats.thinking import ThinkSplitter
from agent_memory.chat.toolcalls import ToolCallParser


class ReplyReader:
    def __init__(self, thinking: ThinkSplitter | None, calls: ToolCallParser | None) -> None:
        self.thinking = thinking
        self.parser = calls

    @property
    def calls(self) -> list[ToolCall]:
        """The calls read whole so far."""
        return self.parser.calls if self.parser else []

    def read(self, text: str | None) -> list[OutputEvent]:
        """Events for more generated text, or for the reply's end (`text` None)."""
        split = self.thinking.feed(text) if text is not None and self.thinking else None
        if split is None:
            split = [ContentDelta(text)] if text is not None else (self.thinking.finish() if self.thinking else [])
        out: list[OutputEvent] = []
        for event in split:
            if isinstance(event, ContentDelta) and self.parser is not None:
                out += self.parser.feed(event.text)
            else:
                out.append(event)
        if text is None and self.parser is not None:
            out += self.parser.finish()
        return out

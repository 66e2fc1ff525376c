"""Reasoning written between tags (`<think>…</think>` for Qwen3, DeepSeek-R1, GLM; Gemma 4's
`<|channel>thought…<channel|>`; Mistral's `[THINK]…[/THINK]`): the tags a model uses, and the
splitter that reads its reply into reasoning and the rest.

Templates write an earlier turn back as `<think>\\n` + reasoning.strip("\\n") + `\\n</think>\\n\\n`
+ content.lstrip("\\n"), so reasoning is returned without the newlines that frame it and content
without those that lead it: what the client sends back renders as the model wrote it.
"""

from __future__ import annotations

from dataclasses import dataclass

from agent_memory.chat.events import ContentDelta, OutputEvent, ReasoningDelta, StateReader, held_back

# Pairs mlx-lm does not find by itself (its TokenizerWrapper.think_start knows the others).
MORE_TAGS = [("[THINK]", "[/THINK]")]


@dataclass(frozen=True)
class ThinkTags:
    start: str
    end: str

    @classmethod
    def of(cls, tokenizer) -> ThinkTags | None:
        """The model's reasoning tags, if its vocabulary has them."""
        if tokenizer.think_start and tokenizer.think_end:
            return cls(tokenizer.think_start, tokenizer.think_end)
        vocab = tokenizer._tokenizer.get_added_vocab()
        return next((cls(s, e) for s, e in MORE_TAGS if s in vocab and e in vocab), None)

    def started_by(self, prompt_text: str) -> bool | None:
        """True where the prompt opens the reasoning for the model (Qwen3.5, DeepSeek-R1), False
        where it closes it (thinking off: `<think>\n\n</think>`), None where the model may open it."""
        tail = prompt_text.rstrip()
        return True if tail.endswith(self.start) else False if tail.endswith(self.end) else None


class ThinkSplitter(StateReader):
    """Feed reply text; get reasoning and content events (content still to be read for calls)."""

    def __init__(self, tags: ThinkTags, inside: bool) -> None:
        self.tags = tags
        self.state = "lead" if inside else "before"  # before | lead | reasoning | after | content
        self.buf = ""

    def finish(self) -> list[OutputEvent]:
        out: list[OutputEvent] = []
        if self.state in ("lead", "reasoning") and self.buf.rstrip("\n"):
            out.append(ReasoningDelta(self.buf.rstrip("\n")))
        elif self.state in ("before", "content") and self.buf:
            out.append(ContentDelta(self.buf))
        self.buf = ""
        return out

    def _before(self, out: list[OutputEvent]) -> None:
        """Reasoning comes first or not at all: wait until the reply shows which."""
        head = self.buf.lstrip()
        if head.startswith(self.tags.start):
            self.buf = head[len(self.tags.start) :]
            self.state = "lead"
        elif head and not self.tags.start.startswith(head):
            self.state = "content"

    def _lead(self, out: list[OutputEvent]) -> None:
        stripped = self.buf.lstrip("\n")
        if stripped:
            self.buf = stripped
            self.state = "reasoning"

    def _reasoning(self, out: list[OutputEvent]) -> None:
        at = self.buf.find(self.tags.end)
        if at >= 0:
            if text := self.buf[:at].rstrip("\n"):
                out.append(ReasoningDelta(text))
            self.buf = self.buf[at + len(self.tags.end) :]
            self.state = "after"
            return
        partial = held_back(self.buf, self.tags.end)  # and the newlines before it: they frame the end
        body = self.buf[: len(self.buf) - partial]
        held = partial + len(body) - len(body.rstrip("\n"))
        if len(self.buf) > held:
            out.append(ReasoningDelta(self.buf[: len(self.buf) - held]))
            self.buf = self.buf[len(self.buf) - held :]

    def _after(self, out: list[OutputEvent]) -> None:
        stripped = self.buf.lstrip("\n")
        if stripped:
            self.buf = stripped
            self.state = "content"

    def _content(self, out: list[OutputEvent]) -> None:
        if self.buf:
            out.append(ContentDelta(self.buf))
            self.buf = ""

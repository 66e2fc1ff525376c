"""A model's reply format, found from its tokenizer and chat template: how it writes tool calls
(calls.py, tagged_params.py, mistral.py) and reasoning (thinking.py), or gpt-oss's harmony
channels (harmony.py). It gives the grammar that constrains a reply, the reader that turns a
reply into reasoning, content and calls, and the markers the engine must show in the text.

Templates that do not know tools get the built-in format (render.py: Hermes JSON described in
the system turn). A native template's format is the one mlx-lm's tokenizer loader infers
(`tool_parser_type`); those this server has no grammar for are parsed by mlx-lm's parser after
the fact and not constrained (their `required` or named `tool_choice` is a 400).
"""

from __future__ import annotations

from agent_memory.chat.conversation import Tool
from agent_memory.chat.formats.calls import CallSyntax, HermesJson, Wanted, json_rule
from agent_memory.chat.formats.frames import ThinkFrame, call_lead, think_frame
from agent_memory.chat.formats.harmony import HarmonyReply
from agent_memory.chat.formats.markup import Markup, regex, without
from agent_memory.chat.formats.llama import LlamaJson
from agent_memory.chat.formats.mistral import Mistral
from agent_memory.chat.formats.sections import DeepSeek, Kimi
from agent_memory.chat.formats.tagged_params import Glm, Qwen3Coder
from agent_memory.chat.formats.thinking import ThinkSplitter, ThinkTags
from agent_memory.chat.reader import ReplyReader
from agent_memory.chat.render import tool_json
from agent_memory.chat.toolcalls import ToolCallParser

# mlx-lm's tool parser for the template -> the syntax this server constrains calls in.
SYNTAXES: dict[str, type[CallSyntax]] = {
    "json_tools": HermesJson,
    "qwen3_coder": Qwen3Coder,
    "glm47": Glm,
    "mistral": Mistral,
    "kimi_k2": Kimi,
}
# Templates mlx-lm has no parser for, known by what they write.
WRITTEN: list[tuple[str, type[CallSyntax]]] = [("<｜tool▁calls▁begin｜>", DeepSeek), ('"parameters": ', LlamaJson)]
MAX_INDEXED = 8  # the most calls in one turn where each call's text holds its index


class MlxParsed(CallSyntax):
    """A layout mlx-lm parses but this server does not constrain (Kimi, Gemma 4, MiniMax, …)."""

    streams = False

    def __init__(self, tokenizer) -> None:
        self.name = tokenizer.tool_parser.__module__.rsplit(".", 1)[-1]
        self.opener, self.end = tokenizer.tool_call_start, tokenizer.tool_call_end or ""
        self._parse = tokenizer.tool_parser

    def parse(self, body: str, tools: list[Tool]) -> list[dict]:
        parsed = self._parse(body, [tool_json(t) for t in tools])
        return parsed if isinstance(parsed, list) else [parsed]


class TaggedReply:
    """Calls in a family's tags (or none), after reasoning in its think tags (or none)."""

    history_key = "reasoning_content"  # where templates read an earlier turn's reasoning

    def __init__(
        self,
        calls: CallSyntax,
        think: ThinkTags | None,
        native: bool,
        frame: ThinkFrame | None = None,
        describe=None,
        lead: str = "",
    ) -> None:
        """native: the template writes calls (else the built-in format does); describe: where
        it writes calls but not the tools, what describes them in the system turn; lead: what
        it writes between a turn's text and its first call (frames.call_lead)."""
        self.calls, self.think, self.native, self.frame, self.describe = calls, think, native, frame, describe
        self.lead = lead
        self.name = calls.name
        self.opener = calls.opener

    @property
    def constrained(self) -> bool:
        return not isinstance(self.calls, MlxParsed)

    @property
    def markers(self) -> tuple[str, ...]:
        pieces = [self.calls.opener, self.calls.next_opener or "", self.calls.end, *self.calls.inner]
        pieces += [self.think.start, self.think.end] if self.think else []
        return tuple(p for p in pieces if p)

    @property
    def closers(self) -> tuple[str, ...]:
        """Text that ends a free-text part of the grammar (finish.py closes one with it)."""
        ends = (self.think.end,) if self.think else ()
        if self.frame is not None:
            ends = (self.frame.close, *ends)
        return ends + self.calls.closers

    def started_by(self, prompt_text: str) -> bool | None:
        """Whether the prompt opened the reasoning (True), closed it (False) or left it to the model."""
        return self.think.started_by(prompt_text) if self.think else False

    def reader(self, tools: list[Tool], started: bool | None) -> ReplyReader:
        thinking = ThinkSplitter(self.think, started is True) if self.think else None
        calls = None
        if tools:
            syntax = self.calls
            parse = None if syntax.streams else (lambda body: syntax.parse(body, tools))
            calls = ToolCallParser(syntax.opener, syntax.end, parse, self.lead)
        return ReplyReader(thinking, calls)

    def lark(self, wanted: Wanted, m: Markup) -> str | None:
        """The grammar, or None where the output is free (no tools, no JSON answer)."""
        if not wanted.calls and wanted.answer is None:
            return None
        rules: list[str] = []
        body = self._body(wanted.calls, wanted.mode, wanted.parallel, wanted.answer, m, rules)
        if self.think is None or wanted.thinking is False or wanted.started is False:
            return f"start: {body}\n" + "\n".join(rules)
        return f"start: {self._think(m, wanted.started is True, rules)} {body}\n" + "\n".join(rules)

    def _think(self, m: Markup, inside: bool, rules: list[str]) -> str:
        """The reasoning before the answer: in its template's frame (frames.py), without the
        whitespace around it that the template would strip; else between its tags."""
        frame, think = self.frame, self.think
        if frame is None:
            more, thought = m.until("thought", "(?s:.*)", think.end)
            rules += more
            if inside:
                return thought
            rules.append(f"think: {m.lit(think.start)} {thought}")
            return "think?"
        more, thought = m.until("thought", "\\S((?s:.*)\\S)?", frame.close)
        rules += more
        if frame.open:
            thought = f"{m.lit(frame.open)} {thought}"
        if not frame.empty:
            return f"({thought})?"
        rules.append(f"think: {thought} | {m.lit(frame.empty)}")
        return "think"

    def _body(self, tools: list[Tool], mode: str, parallel: bool, answer: dict | None, m: Markup, rules: list) -> str:
        if answer is not None:
            rules.append(json_rule("answer", answer))
        if not tools:
            return "answer"
        rules.append(f"calls: {m.lit(self.calls.opener)} {self._calls(tools, mode, parallel, m, rules)}")
        if mode != "auto":
            return "calls"
        if answer is not None:
            return "(answer | calls)"
        opener = self.calls.opener
        if self.calls.alone:  # a reply is text or calls, never both
            rules.append(f"FREE: /(?s:.*)/ & ~/{regex(opener)}(?s:.*)/")
            return "(FREE | calls)"
        if m.token(opener) is not None:  # one token (llguidance never spells it): it opens the calls
            rules += ["FREE: /(?s:.*)/", "with_calls: FREE calls"]
        else:  # free text never holds the opener but as the opening of the calls
            rules += [
                f"FREE: {without(opener)}",
                f"opener[lazy]: /(?s:.*){regex(opener)}/",
                "with_calls: opener calls_rest",
            ]
        return "(FREE | with_calls)"

    def _calls(self, tools: list[Tool], mode: str, parallel: bool, m: Markup, rules: list) -> str:
        """`calls_rest`, the calls after their opener, as a rule; its name."""
        syntax = self.calls
        count = 1 if not parallel or mode == "named" or syntax.single else MAX_INDEXED if syntax.indexed else None
        nth = [m.lit(syntax.separator), m.lit(syntax.opener if syntax.next_opener is None else syntax.next_opener)]
        if syntax.indexed:  # the k-th call's own rules: its text holds k
            for k in range(count):
                rules.append(f"call_{k}: " + " | ".join(f"tool_{i}_{k}" for i in range(len(tools))))
                for i, tool in enumerate(tools):
                    rules += syntax.rules(f"tool_{i}_{k}", tool, m, k)
            rest = ""
            for k in range(count - 1, 0, -1):
                rest = f"({' '.join(nth)} call_{k} {rest})?"
            calls = f"call_0 {rest}"
        else:
            rules.append("call: " + " | ".join(f"tool_{i}" for i in range(len(tools))))
            for i, tool in enumerate(tools):
                rules += syntax.rules(f"tool_{i}", tool, m)
            calls = "call" if count == 1 else f"call ({' '.join(nth)} call)*"
        rules.append(f"calls_rest: {calls} {m.lit(syntax.closer)}")
        return "calls_rest"


def reply_format(tokenizer) -> TaggedReply | HarmonyReply:
    """The reply format of a model with this tokenizer (mlx-lm's TokenizerWrapper)."""
    template = getattr(tokenizer, "chat_template", None)
    template = template if isinstance(template, str) else ""
    vocab = tokenizer._tokenizer.get_added_vocab()
    if all(t in vocab for t in ("<|channel|>", "<|message|>", "<|start|>")) and "<|channel|>" in template:
        return HarmonyReply()
    native, describe = "tools" in template, None
    syntax: CallSyntax = HermesJson()
    if native and tokenizer.has_tool_calling:
        name = tokenizer.tool_parser.__module__.rsplit(".", 1)[-1]
        syntax = SYNTAXES[name]() if name in SYNTAXES else MlxParsed(tokenizer)
    elif native or "tool_calls" in template:
        written = next((kind() for text, kind in WRITTEN if text in template), None)
        if written is not None and (native or written.describe([]) is not None):
            syntax, describe = written, None if native else written.describe
            native = True
    think = ThinkTags.of(tokenizer)
    frame = think_frame(tokenizer, TaggedReply.history_key) if think is not None else None
    lead = call_lead(tokenizer, syntax.opener) if native else ""
    return TaggedReply(syntax, think, native, frame, describe, lead)

"""The grammar a conversation's output must follow, for constrained decoding with llguidance.

Built and checked per request off the engine thread (~3 ms); the engine only advances it and
applies its token mask (engine/constraint.py). Tool calls follow the built-in JSON format of
render.py exactly, and JSON is written with json.dumps' separators and no free whitespace, so
what the model writes is what the next turn renders. Why llguidance and not xgrammar: it
compiles a request's grammar in 2-3 ms where xgrammar took 0.1-2.3 s on the demo model's
vocabulary, at equal per-token cost (docs/benchmarks.md, "Constrained decoding").
"""

from __future__ import annotations

import json
import logging
from dataclasses import replace

import jsonschema
import llguidance
import llguidance.hf

from agent_memory.chat.conversation import Conversation, Tool
from agent_memory.chat.finish import ConstrainedOutput, Finisher
from agent_memory.chat.loosen import loosen
from agent_memory.chat.render import ARGUMENTS_KEY, CALL_PREFIX, CALL_SEPARATOR, CALL_START, CALL_SUFFIX

# How JSON is written: as json.dumps writes it, so clients and the next turn see the same text.
JSON_STYLE = {"item_separator": ", ", "key_separator": ": ", "whitespace_flexible": False}
ANY_OBJECT = {"type": "object"}
log = logging.getLogger(__name__)
_LOOSENED: set[tuple[str, tuple[str, ...]]] = set()  # (tool, keywords dropped) already logged


class GrammarError(ValueError):
    """The request asks for output no grammar can promise: a 400 naming `param`."""

    def __init__(self, message: str, param: str) -> None:
        super().__init__(message)
        self.param = param


def check_schema(schema: object, param: str) -> dict:
    """A JSON schema the request gave, checked against its metaschema."""
    if not isinstance(schema, dict):
        raise GrammarError(f"{param} must be a JSON schema object", param)
    try:
        jsonschema.validators.validator_for(schema).check_schema(schema)
    except jsonschema.SchemaError as e:
        where = ".".join(str(p) for p in e.path)
        raise GrammarError(f"{param} is not a valid JSON schema: {e.message}" + (f" (at {where})" if where else ""), param) from e
    return schema


def _lit(text: str) -> str:
    return json.dumps(text)  # a Lark string literal: JSON's quoting and escapes


def _call_rules(tools: list[Tool]) -> str:
    """`call_rest`: a call after its `<tool_call>`, for any of `tools`, arguments by schema."""
    names = " | ".join(f"tool_{i}" for i in range(len(tools)))
    rules = [f"call_rest: {_lit(CALL_PREFIX[len(CALL_START):])} ({names}) {_lit(CALL_SUFFIX)}"]
    for i, tool in enumerate(tools):
        schema = {**(tool.parameters or ANY_OBJECT), "x-guidance": JSON_STYLE}
        rules.append(f"tool_{i}: {_lit(json.dumps(tool.name, ensure_ascii=False) + ARGUMENTS_KEY)} args_{i}")
        rules.append(f"args_{i}: %json {json.dumps(schema)}")
    return "\n".join(rules)


def tool_calls_lark(tools: list[Tool], parallel: bool, mode: str, answer: dict | None) -> str:
    """Calls only (tool_choice required or named); or, for auto, free text that may end in
    calls (the text never holds `<tool_call>` but as the opening of a call) or, when the
    answer must be JSON (`answer`: its schema), either that JSON or calls."""
    # A named tool_choice is exactly one call of that tool, parallel calls or not.
    more = f" ({_lit(CALL_SEPARATOR)} {_lit(CALL_START)} call_rest)*" if parallel and mode != "named" else ""
    calls = f"{_lit(CALL_START)} call_rest{more}"
    if mode != "auto":
        head = f"start: {calls}\n"
    elif answer is not None:
        head = f"start: answer | {calls}\nanswer: %json {json.dumps({**answer, 'x-guidance': JSON_STYLE})}\n"
    else:
        head = (
            "start: free_text | with_calls\n"
            "free_text: FREE\n"
            f"FREE: /(?s:.*)/ & ~/(?s:.*){CALL_START}(?s:.*)/\n"
            f"with_calls: opener call_rest{more}\n"
            f"opener[lazy]: /(?s:.*){CALL_START}/\n"
        )
    return head + _call_rules(tools)


def _cause(message: str) -> str:
    """llguidance's reason, as a sentence about the schema: its first line, keywords named."""
    first = message.strip().splitlines()[0] if message.strip() else "unknown reason"
    if first.startswith("Unimplemented keys: "):
        keys = json.loads(first.removeprefix("Unimplemented keys: "))
        return f"it uses {', '.join(keys)}, which this server cannot enforce"
    if first.startswith("Unknown format: "):
        return f"it uses the string format '{first.removeprefix('Unknown format: ')}', which this server does not know"
    return first


class GrammarCompiler:
    """Per model: llguidance's view of the tokenizer (~1 s to build, once)."""

    def __init__(self, tokenizer, vocab_size: int) -> None:
        """tokenizer: mlx-lm's TokenizerWrapper; vocab_size: the model's logits width."""
        self.tokenizer = llguidance.hf.from_tokenizer(
            tokenizer._tokenizer, n_vocab=vocab_size, eos_token=sorted(tokenizer.eos_token_ids)
        )
        self.finisher = Finisher(self.tokenizer)

    def grammar(self, conversation: Conversation, tools_param: str, format_param: str) -> str | None:
        """The grammar the output must follow, or None for free text. Raises GrammarError."""
        choice, output = conversation.tool_choice, conversation.output
        answer = None
        if output.kind == "json_object":
            answer = ANY_OBJECT
        elif output.kind == "json_schema":
            answer = check_schema(output.schema, format_param)
        if conversation.calls_tools:
            tools = [
                self._constrainable(tool, f"{tools_param}.{i}.parameters", loosen_ok=choice.mode == "auto")
                for i, tool in enumerate(conversation.tools)
            ]
            if choice.mode == "named":
                tools = [t for t in tools if t.name == choice.name]
            if answer is not None:
                self._enforceable(answer, format_param)
            lark = tool_calls_lark(tools, conversation.parallel_tool_calls, choice.mode, answer)
            return self._checked(llguidance.LLMatcher.grammar_from_lark(lark), tools_param)
        if answer is not None:
            self._enforceable(answer, format_param)
            return self._checked(llguidance.LLMatcher.grammar_from_json_schema(answer, defaults=JSON_STYLE), format_param)
        return None

    def _constrainable(self, tool: Tool, param: str, loosen_ok: bool) -> Tool:
        """The tool as its calls are constrained: as given when its schema can be enforced;
        under `auto`, else, with the nearest looser schema (loosen.py), said once per tool and
        keywords; else a GrammarError naming it (a call the client requires must be exact)."""
        schema = check_schema(tool.parameters or ANY_OBJECT, param)
        loosened = loosen(schema, self._refusal) if loosen_ok else None
        if loosened is None:
            self._enforceable(schema, param)
            return tool
        fitted, dropped = loosened
        if dropped and (tool.name, tuple(dropped)) not in _LOOSENED:
            _LOOSENED.add((tool.name, tuple(dropped)))
            dropped_text = ", ".join(dropped)
            log.info("tool %r: its calls are constrained without %s, which cannot be enforced", tool.name, dropped_text)
        return replace(tool, parameters=fitted) if dropped else tool

    def _refusal(self, schema: dict) -> str | None:
        grammar = llguidance.LLMatcher.grammar_from_json_schema(schema, defaults=JSON_STYLE)
        is_error, messages = llguidance.LLMatcher.validate_grammar_with_warnings(grammar, self.tokenizer)
        return (messages[0] if messages else "refused") if is_error else None

    def _enforceable(self, schema: dict, param: str) -> None:
        """Compile one schema alone, so that a refusal names the schema at fault and says in a
        sentence what in it cannot be enforced (never the compiled grammar)."""
        if (reason := self._refusal(schema)) is not None:
            raise GrammarError(f"{param} cannot be enforced by constrained decoding: {_cause(reason)}", param)

    def _checked(self, grammar: str, param: str) -> str:
        is_error, messages = llguidance.LLMatcher.validate_grammar_with_warnings(grammar, self.tokenizer)
        if is_error:
            raise GrammarError(f"{param} cannot be enforced by constrained decoding: {_cause(messages[0])}", param)
        return grammar

    def output(self, grammar: str) -> ConstrainedOutput:
        """A sequence's constrained output: a fresh matcher, and how to finish it in time."""
        return ConstrainedOutput.of(self.matcher(grammar), self.finisher)

    def matcher(self, grammar: str) -> llguidance.LLMatcher:
        """A fresh matcher for one sequence (made off the engine thread: it compiles)."""
        matcher = llguidance.LLMatcher(self.tokenizer, grammar, log_level=0)
        if matcher.is_error():
            raise GrammarError(matcher.get_error(), "grammar")
        return matcher

"""The grammar a conversation's output must follow, for constrained decoding with llguidance.

Built and checked per request off the engine thread (~3 ms); the engine only advances it and
applies its token mask (engine/tokens/constraint.py). The model's reply format (formats/reply.py)
writes the grammar's shape: reasoning, then text, calls or a JSON answer, each call exactly as
the model's template writes it back, and JSON with json.dumps' separators and no free
whitespace, so what the model writes is what the next turn renders. Why llguidance and not xgrammar: it
compiles a request's grammar in 2-3 ms where xgrammar took 0.1-2.3 s on the demo model's
vocabulary, at equal per-token cost (docs/benchmarks.md, "Constrained decoding").
"""

from __future__ import annotations

import json
import logging
import re
from dataclasses import replace

import jsonschema
import llguidance
import llguidance.hf

from agent_memory.chat.conversation import Conversation, Tool
from agent_memory.chat.finish import ConstrainedOutput, Finisher
from agent_memory.chat.formats.calls import ANY_OBJECT, JSON_STYLE, Wanted
from agent_memory.chat.formats.markup import Markup
from agent_memory.chat.formats.reply import reply_format
from agent_memory.chat.loosen import AS_ANY_OF, ONE_OF, loosen
from agent_memory.log_once import first_time

log = logging.getLogger(__name__)


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


def _cause(message: str) -> str:
    """llguidance's reason, as a sentence about the schema: its first line, keywords named."""
    first = message.strip().splitlines()[0] if message.strip() else "unknown reason"
    if first.startswith("Unimplemented keys: "):
        keys = json.loads(first.removeprefix("Unimplemented keys: "))
        return f"it uses {', '.join(keys)}, which this server cannot enforce"
    if first.startswith("Unknown format: "):
        return f"it uses the string format '{first.removeprefix('Unknown format: ')}', which this server does not know"
    if first.startswith(ONE_OF):  # never the engine's option names: nothing a client can set
        return (
            "it uses oneOf with alternatives a value might match more than one of, and this server can "
            "enforce 'at least one' (anyOf) but not 'exactly one'"
        )
    if found := re.match(r"Pointer '(.*)' does not exist", first):
        return f"its $ref '#{found[1]}' points to nothing in the schema"
    if found := re.match(r"Resource '(.*)' is not present in a registry", first):
        ref = found[1].removeprefix("json-schema:///")  # llguidance's base for a relative one
        return f"its $ref '{ref}' is outside the schema, and this server fetches no schema (put it under $defs)"
    return first


def endless(root: dict) -> str | None:
    """Why no finite JSON value fits `root`, or None when one does (as far as can be told). The
    case llguidance compiles but can never finish: a required property or item that must hold,
    through `$ref`, a value of its own kind, with nothing to end it ({"properties": {"a":
    {"$ref": "#"}}, "required": ["a"]}). Contradictions (minLength > maxLength) llguidance refuses."""
    finite: dict[str, bool] = {}  # $ref -> whether a finite value fits it (a least fixed point)

    def target(ref: str):
        node = root
        for key in ref.removeprefix("#").strip("/").split("/") if ref != "#" else []:
            key = key.replace("~1", "/").replace("~0", "~")
            node = node.get(key) if isinstance(node, dict) else None
        return node if ref.startswith("#") and node is not None else True  # elsewhere: not judged

    def fits(s) -> bool:
        if not isinstance(s, dict):
            return s is not False
        if "$ref" in s and not finite.setdefault(s["$ref"], False):
            return False
        if not all(fits(x) for x in s.get("allOf", [])):
            return False
        if any(key in s and not any(fits(x) for x in s[key]) for key in ("anyOf", "oneOf")):
            return False
        types = [s["type"]] if isinstance(s.get("type"), str) else s.get("type")
        if types is None or set(types) - {"object", "array"}:
            return True  # a scalar fits
        return ("object" in types and _object_fits(s, fits)) or ("array" in types and _array_fits(s, fits))

    while True:
        before = dict(finite)
        fits(root)  # the refs it reaches
        for ref in before:
            finite[ref] = fits(target(ref))
        if finite == before:
            break
    if fits(root):
        return None
    loops = ", ".join(f"'{ref}'" for ref, ok in finite.items() if not ok)
    if not loops:
        return "no value fits it"
    return f"{loops} must hold itself again through required properties or items, without end"


def _object_fits(s: dict, fits) -> bool:
    """An object fits where each required property's schema is fitted by some finite value."""
    props, extra = s.get("properties", {}), s.get("additionalProperties", True)
    return all(
        fits(props[name]) if name in props else ("patternProperties" in s or fits(extra))
        for name in s.get("required", [])
    )


def _array_fits(s: dict, fits) -> bool:
    """An array fits where its first minItems items each can be a finite value."""
    prefix = s.get("prefixItems") or (s.get("items") if isinstance(s.get("items"), list) else [])
    rest = s.get("items") if isinstance(s.get("items"), (dict, bool)) else s.get("additionalItems", True)
    need = s.get("minItems", 0) if isinstance(s.get("minItems"), int) else 0
    return all(fits(x) for x in prefix[:need]) and (need <= len(prefix) or fits(rest))


class GrammarCompiler:
    """Per model: llguidance's view of the tokenizer (~1 s to build, once)."""

    def __init__(self, tokenizer, vocab_size: int, reply=None) -> None:
        """tokenizer: mlx-lm's TokenizerWrapper; vocab_size: the model's logits width; reply:
        the model's reply format (formats/reply.py; found from the tokenizer if not given)."""
        reply = reply or reply_format(tokenizer)
        self.tokenizer = llguidance.hf.from_tokenizer(
            tokenizer._tokenizer, n_vocab=vocab_size, eos_token=sorted(tokenizer.eos_token_ids)
        )
        self.reply = reply
        self.markup = Markup.of(tokenizer)
        self.finisher = Finisher(self.tokenizer, reply.opener, reply.closers, self.markup)

    def grammar(
        self, conversation: Conversation, tools_param: str, format_param: str, started: bool | None = None
    ) -> str | None:
        """The grammar the output must follow, or None for free text. `started`: whether the
        prompt opened the reply's reasoning (True), closed it (False), or left it to the model
        (None). Raises GrammarError."""
        choice, output = conversation.tool_choice, conversation.output
        answer = None
        if output.kind == "json_object":
            answer = ANY_OBJECT
        elif output.kind == "json_schema":
            answer = check_schema(output.schema, format_param)
        tools: list[Tool] = []
        if conversation.calls_tools:  # a named call constrains that tool only: the others cannot be called
            tools = [
                self._constrainable(tool, f"{tools_param}.{i}.parameters", loosen_ok=choice.mode == "auto")
                for i, tool in enumerate(conversation.tools)
                if choice.mode != "named" or tool.name == choice.name
            ]
        if answer is not None:
            self._enforceable(answer, format_param, "the answer")
        thinking = conversation.thinking.enabled
        wanted = Wanted(tools, choice.mode, conversation.parallel_tool_calls, answer, thinking, started)
        lark = self.reply.lark(wanted, self.markup)
        if lark is None:
            return None
        return self._checked(llguidance.LLMatcher.grammar_from_lark(lark), tools_param if tools else format_param)

    def _constrainable(self, tool: Tool, param: str, loosen_ok: bool) -> Tool:
        """The tool as its calls are constrained: as given when its schema can be enforced;
        under `auto`, else, with the nearest looser schema (loosen.py), said once per tool and
        keywords; else a GrammarError naming it (a call the client requires must be exact)."""
        schema = check_schema(tool.parameters or ANY_OBJECT, param)
        loosened = loosen(schema, self._refusal) if loosen_ok else None
        if loosened is None:
            self._enforceable(schema, f"{param} (tool '{tool.name}')", "a call to it", param)
            return tool
        fitted, dropped = loosened
        if dropped and first_time(("loosened", tool.name, tuple(dropped))):
            keywords = [d for d in dropped if d != AS_ANY_OF]
            how = [f"without {', '.join(keywords)}"] if keywords else []
            how += ["with oneOf as anyOf"] if AS_ANY_OF in dropped else []
            how_text = " and ".join(how)
            log.info("tool %r: its calls are constrained %s, which cannot be enforced exactly", tool.name, how_text)
        return replace(tool, parameters=fitted) if dropped else tool

    def _refusal(self, schema: dict) -> str | None:
        grammar = llguidance.LLMatcher.grammar_from_json_schema(schema, defaults=JSON_STYLE)
        is_error, messages = llguidance.LLMatcher.validate_grammar_with_warnings(grammar, self.tokenizer)
        return (messages[0] if messages else "refused") if is_error else None

    def _enforceable(self, schema: dict, subject: str, output: str, param: str | None = None) -> None:
        """Compile one schema alone, so that a refusal names the schema at fault (`subject`:
        its param, and its tool) and says in a sentence what in it cannot be enforced (never
        the compiled grammar), or why `output`, which it shapes, could never end."""
        param = param or subject
        if (reason := self._refusal(schema)) is not None:
            raise GrammarError(f"{subject} cannot be enforced by constrained decoding: {_cause(reason)}", param)
        if (reason := endless(schema)) is not None:
            raise GrammarError(f"{subject} has no finite instance, so {output} could never end: {reason}", param)

    def _checked(self, grammar: str, param: str) -> str:
        is_error, messages = llguidance.LLMatcher.validate_grammar_with_warnings(grammar, self.tokenizer)
        if is_error:
            raise GrammarError(f"{param} cannot be enforced by constrained decoding: {_cause(messages[0])}", param)
        return grammar

    def output(self, grammar: str, calls: bool = False) -> ConstrainedOutput:
        """A sequence's constrained output: a fresh matcher, and how to finish it in time.
        `calls`: the grammar holds tool calls."""
        return ConstrainedOutput.of(self.matcher(grammar), self.finisher, calls)

    def matcher(self, grammar: str) -> llguidance.LLMatcher:
        """A fresh matcher for one sequence (made off the engine thread: it compiles)."""
        matcher = llguidance.LLMatcher(self.tokenizer, grammar, log_level=0)
        if matcher.is_error():
            raise GrammarError(matcher.get_error(), "grammar")
        return matcher

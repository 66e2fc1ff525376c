"""A Lark grammar without recursion as one regular expression, so that a freeform tool's grammar
(Codex's `apply_patch`) can constrain a JSON string: as a JSON schema `pattern`, llguidance
matches it against the string's decoded text, whatever escapes the model writes. Rules and
terminals are inlined; strings, /regexes/ (flags i, s, m, x), groups, [optional], ?, * and +,
`|` and `-> alias` are taken; `%import common.X` for the usual terminals. A grammar that
recurses, or uses `%ignore`, `~` or another import, is not regular here: None."""

from __future__ import annotations

import ast
import re

from agent_memory.chat.formats.markup import regex

COMMON = {  # lark's common.lark terminals, as regexes
    "LF": r"\n",
    "CR": r"\r",
    "NEWLINE": r"(?:\r?\n)+",
    "WS": r"[ \t\f\r\n]+",
    "WS_INLINE": r"[ \t]+",
    "DIGIT": r"[0-9]",
    "HEXDIGIT": r"[a-fA-F0-9]",
    "INT": r"[0-9]+",
    "SIGNED_INT": r"[+-]?[0-9]+",
    "LETTER": r"[a-zA-Z]",
    "WORD": r"[a-zA-Z]+",
    "CNAME": r"[a-zA-Z_][a-zA-Z0-9_]*",
    "ESCAPED_STRING": r'"(?:[^"\\]|\\.)*"',
}
TOKEN = re.compile(
    r"""\s*(?:(?P<string>"(?:[^"\\\n]|\\.)*"i?)|(?P<regex>/(?:[^/\\\n]|\\.)+/[imsx]*)|(?P<arrow>->)"""
    r"""|(?P<name>[A-Za-z_][A-Za-z_0-9]*)|(?P<op>[?*+|()\[\]]))"""
)
DEFINITION = re.compile(r"^([?!]?)([A-Za-z_][A-Za-z_0-9]*)(?:\.-?\d+)?\s*:(.*)$")


class NotRegular(ValueError):
    """The grammar is not one this module turns into a regex."""


def lark_regex(grammar: str, start: str = "start") -> str | None:
    """The regex matching exactly the texts `grammar` derives from `start`, or None."""
    try:
        definitions = _definitions(grammar)
        return _Inliner(definitions).expand(start)
    except (SyntaxError, ValueError):  # NotRegular is a ValueError
        return None


def _definitions(grammar: str) -> dict[str, str]:
    """name -> its expansion text, continuation lines joined; %import common.X added."""
    out: dict[str, str] = {}
    current = None
    for raw in grammar.splitlines():
        line = re.sub(r"(^|\s)//.*$", "", raw).rstrip()
        if not line.strip():
            continue
        if line.startswith("%import"):
            out.update(_imports(line))
            continue
        if line.startswith("%"):
            raise NotRegular(line.split()[0])
        if (m := DEFINITION.match(line)) and not raw[0].isspace():
            current = m.group(2)
            out[current] = m.group(3)
        elif current is not None:
            out[current] += " " + line.strip()
        else:
            raise NotRegular(line)
    return out


def _imports(line: str) -> dict[str, str]:
    m = re.fullmatch(r"%import\s+common\s*(?:\.\s*(\w+)|\(\s*([\w\s,]+)\))\s*(?:->\s*(\w+))?", line.strip())
    if not m:
        raise NotRegular(line)
    names = [m.group(1)] if m.group(1) else [n.strip() for n in m.group(2).split(",") if n.strip()]
    if any(n not in COMMON for n in names):
        raise NotRegular(line)
    if m.group(3) and len(names) == 1:  # `%import common.X -> Y`
        return {m.group(3): f"/{COMMON[names[0]]}/"}
    return {n: f"/{COMMON[n]}/" for n in names}


class _Inliner:
    def __init__(self, definitions: dict[str, str]) -> None:
        self.definitions = definitions
        self.done: dict[str, str] = {}
        self.open: set[str] = set()

    def expand(self, name: str) -> str:
        if name in self.done:
            return self.done[name]
        if name in self.open or name not in self.definitions:
            raise NotRegular(name)  # recursion, or an undefined name
        self.open.add(name)
        tokens = [(m.lastgroup, m.group(m.lastgroup)) for m in TOKEN.finditer(self.definitions[name])]
        if "".join(t for _, t in tokens).replace(" ", "") != self.definitions[name].replace(" ", ""):
            raise NotRegular(name)  # something the tokenizer does not know (~, {…})
        regex, rest = self._alternatives(tokens)
        if rest:
            raise NotRegular(name)
        self.open.discard(name)
        self.done[name] = regex
        return regex

    def _alternatives(self, tokens):
        options = []
        while True:
            sequence, tokens = self._sequence(tokens)
            options.append(sequence)
            if not tokens or tokens[0] != ("op", "|"):
                return (options[0] if len(options) == 1 else "(?:" + "|".join(options) + ")"), tokens
            tokens = tokens[1:]

    def _sequence(self, tokens):
        parts = []
        while tokens and tokens[0] not in (("op", "|"), ("op", ")"), ("op", "]")):
            if tokens[0][0] == "arrow":  # `-> alias`: a parse-tree name, nothing to match
                tokens = tokens[2:]
                continue
            atom, tokens = self._atom(tokens)
            if tokens and tokens[0] in (("op", "?"), ("op", "*"), ("op", "+")):
                atom, tokens = f"(?:{atom}){tokens[0][1]}", tokens[1:]
            parts.append(atom)
        return "".join(parts), tokens

    def _atom(self, tokens):
        (kind, text), rest = tokens[0], tokens[1:]
        if kind == "string":
            value = ast.literal_eval(text.removesuffix("i") if text.endswith('"i') else text)
            escaped = regex(value)
            return (f"(?i:{escaped})" if text.endswith('"i') else f"(?:{escaped})"), rest
        if kind == "regex":
            body, flags = text[1:].rsplit("/", 1)
            return (f"(?{flags}:{body})" if flags else f"(?:{body})"), rest
        if kind == "name":
            return f"(?:{self.expand(text)})", rest
        if text in "([":
            inner, rest = self._alternatives(rest)
            close = ")" if text == "(" else "]"
            if not rest or rest[0] != ("op", close):
                raise NotRegular(f"unclosed {text}")
            return (f"(?:{inner})" if text == "(" else f"(?:{inner})?"), rest[1:]
        raise NotRegular(text)

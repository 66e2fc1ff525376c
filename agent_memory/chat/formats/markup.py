"""Fixed text in a grammar, as the model must write it.

A marker the vocabulary holds as one added token (`<think>`, `<|channel|>`, `[TOOL_CALLS]`) is
written in the grammar as that token (`<[id]>`): llguidance matches an added token only as
itself, and the next turn's prompt holds that token there. Other text is a literal, which the
model may write in any tokens.
"""

from __future__ import annotations

import json
import re


class Markup:
    def __init__(self, added: dict[str, int]) -> None:
        """added: the tokenizer's added tokens (text -> id), special or not: llguidance takes
        each only as itself, never spelled out in bytes."""
        self.added = added
        names = sorted((t for t in added if t), key=len, reverse=True)
        self._split = re.compile("(" + "|".join(map(re.escape, names)) + ")") if names else None

    @classmethod
    def of(cls, tokenizer) -> Markup:
        """tokenizer: mlx-lm's TokenizerWrapper (its transformers tokenizer's added vocabulary)."""
        return cls({t.content: i for i, t in tokenizer._tokenizer.added_tokens_decoder.items()})

    def pieces(self, text: str) -> list[str]:
        """`text` cut into its added tokens and the text between them."""
        return [p for p in (self._split.split(text) if self._split else [text]) if p]

    def lit(self, text: str) -> str:
        """A Lark expression matching exactly `text` (empty text: an empty literal)."""
        out = [f"<[{self.added[p]}]>" if p in self.added else json.dumps(p) for p in self.pieces(text)]
        return " ".join(out) or '""'

    def until(self, name: str, body: str, close: str) -> tuple[list[str], str]:
        """Free text (the regex `body`) ended by `close`: (its rules, its Lark expression).
        llguidance lexes greedily and cannot give back what a lexeme took, so the text part of
        `close` before its first added token ends the lexeme itself: where a token follows, the
        lexeme ends when the token comes; where none does, at the first `close` (lazily)."""
        pieces = self.pieces(close)
        cut = next((i for i, p in enumerate(pieces) if p in self.added), len(pieces))
        text, rest = "".join(pieces[:cut]), "".join(pieces[cut:])
        if rest:
            return [f"{name.upper()}: /{body}{regex(text)}/"], f"{name.upper()} {self.lit(rest)}"
        return [f"{name.lower()}[lazy]: /{body}{regex(text)}/"], name.lower()

    def token(self, text: str) -> int | None:
        """The one token `text` is, if it is an added one."""
        return self.added.get(text)


def regex(text: str) -> str:
    """`text` as a piece of a Lark regex (between slashes): escaped, line breaks as `\\n`."""
    escaped = re.escape(text).replace("/", "\\/")
    return escaped.replace("\\\n", "\\n").replace("\n", "\\n").replace("\\\t", "\\t").replace("\t", "\\t")


def without(text: str) -> str:
    """A Lark regex for any text that does not contain `text`."""
    return f"/(?s:.*)/ & ~/(?s:.*){regex(text)}(?s:.*)/"

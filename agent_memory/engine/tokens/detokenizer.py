"""Incremental detokenization whose text is exactly `tokenizer.decode(generated tokens)`.

The client sends our reply back on the next turn; if the text differed from the tokens' true
decoding (mlx-lm's streaming detokenizer drops a reply's leading space, for one), its tokens
would no longer match the cached ones. Each step decodes a short window of tokens with one
token of context before it (for tokenizers whose decoding depends on a neighbour) and emits
the new text once it does not end in an incomplete UTF-8 character. Special tokens are left
out but for the markers of the model's reply format (engine/loading/loader.hidden_tokens).
"""

from __future__ import annotations

from tokenizers import Tokenizer

INCOMPLETE = "\ufffd"


class Detokenizer:
    def __init__(self, tokenizer: Tokenizer, hidden: frozenset[int] = frozenset()) -> None:
        """hidden: special tokens whose text is left out (the others are a format's markers)."""
        self.tokenizer = tokenizer
        self.hidden = hidden
        self.ids: list[int] = []
        self.prefix = 0  # window start: one token of context before the unread ones
        self.read = 0  # tokens whose text has been emitted

    def _decode(self, start: int, end: int | None = None) -> str:
        ids = [t for t in self.ids[start:end] if t not in self.hidden]
        return self.tokenizer.decode(ids, skip_special_tokens=False)

    def add(self, token: int) -> str:
        """Take one generated token; return the text it completes (maybe empty)."""
        self.ids.append(token)
        before = self._decode(self.prefix, self.read)
        after = self._decode(self.prefix)
        if len(after) <= len(before) or after.endswith(INCOMPLETE):
            return ""
        self.prefix, self.read = self.read, len(self.ids)
        return after[len(before) :]

    def flush(self) -> str:
        """The text still held back (an incomplete character at the very end)."""
        text = self._decode(self.prefix)[len(self._decode(self.prefix, self.read)) :]
        self.prefix = self.read = len(self.ids)
        return text

"""Constrained output that always ends well within max_tokens: a short way to finish what a
grammar has started (`Finisher.plan`), for the engine to force when the tokens left run short
(engine/tokens/constraint.py), and for a request whose shortest valid output cannot fit at all to be
refused before it runs (`ConstrainedOutput.min_tokens`). Under tool_choice auto, free text
may open a call (`<tool_call>`, the format's opener) only while the shortest call still fits
(`call_tokens`, `Finisher.openers`): one opened later could only be cut off.

llguidance has no shortest-completion query, so the plan is greedy on a copy of the matcher:
whatever the grammar forces, else the format's closer of a free-text part (`</think>`, a
parameter's end) where it ends that part, else the first allowed of a few closing tokens (a
quote, a brace, a bracket, a zero, ...), else the lowest allowed token id (a single byte in a
byte-level vocabulary). For JSON that writes each missing required field at a minimal value and closes
every open string, array and object; a schema it cannot close within the limit gets no plan.
No MLX here: it runs on the tokenizer worker (min_tokens) and in the engine's logits processor.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np

# Tried in this order where the grammar allows them: what closes a string, an object, an
# array, the smallest values, then separators.
CLOSING = ['"', "}", "]", ",", ":", "0", "false", "null", "a", " "]
PLAN_LIMIT = 512  # the most tokens a finish is searched for (a longer one is not planned)
FIND_SLACK = 16  # found token by token, a finish may be this much longer before it is rewritten


class Finisher:
    """Per model: its closing tokens, found once in its vocabulary."""

    def __init__(self, tokenizer, opener: str, closers: tuple[str, ...], markup) -> None:
        """tokenizer: llguidance's view of the model's tokenizer; opener: what opens a call in
        the model's format; closers: what ends a free-text part of it; markup: formats/markup.py."""
        self.tokenizer = tokenizer
        self.closing = [ids[0] for text in CLOSING if len(ids := tokenizer.tokenize_str(text)) == 1]
        self.eos = list(tokenizer.eos_tokens)
        self.opener = opener.encode()
        self.opener_tokens = self._tokens(opener, markup)
        self.closers = [self._tokens(text, markup) for text in closers]
        self._completing = self._opener_completions()

    def _tokens(self, text: str, markup) -> list[int]:
        """`text` as the grammar has the model write it: its added tokens as themselves."""
        out: list[int] = []
        for piece in markup.pieces(text):
            token = markup.token(piece)
            out += [token] if token is not None else self.tokenizer.tokenize_str(piece)
        return out

    def _opener_completions(self) -> list[np.ndarray]:
        """For each j, the tokens that complete the opener after text ending in its first j
        bytes (a token holding all of it completes it after any text)."""
        opener = self.opener
        ends: list[list[int]] = [[] for _ in opener]
        for token in range(self.tokenizer.vocab_size):
            piece = self.tokenizer.decode_bytes([token])
            if opener[-1:] not in piece:
                continue
            for j in range(len(opener)):
                if opener in opener[:j] + piece:
                    ends[j].append(token)
        return [np.array(e, dtype=np.int64) for e in ends]

    def openers(self, tail: bytes) -> np.ndarray:
        """The tokens that would open a call after text ending in `tail`."""
        opener = self.opener
        j = next(k for k in range(len(opener) - 1, -1, -1) if tail.endswith(opener[:k]))
        return self._completing[j]

    def plan(self, matcher, limit: int) -> list[int] | None:
        """Tokens that take `matcher` (left unchanged) to where it may end, at most `limit` of
        them; [] if it may end now, None if no plan is found within the limit. The finish is
        found token by token, then written as the tokenizer writes its text (fewer tokens, and
        the ones the next turn's prompt will hold), where the grammar takes that."""
        tokens = self._greedy(matcher, limit + FIND_SLACK)
        if tokens is None:
            return None
        canonical = self.tokenizer.tokenize_bytes(self.tokenizer.decode_bytes(tokens))
        if len(canonical) < len(tokens) and matcher.deep_copy().consume_tokens(canonical):
            tokens = canonical
        return tokens if len(tokens) <= limit else None

    def _greedy(self, matcher, limit: int) -> list[int] | None:
        m = matcher.deep_copy()
        tokens: list[int] = []
        while not m.is_accepting():
            if len(tokens) >= limit or m.is_error() or m.is_stopped():
                return None
            forced = m.compute_ff_tokens() or self._closer(m)
            if forced:
                if not m.consume_tokens(forced):
                    return None
                tokens += forced
                continue
            allowed = np.unpackbits(np.frombuffer(m.compute_bitmask(), dtype=np.uint8), bitorder="little")
            token = next((t for t in self.closing if t < allowed.size and allowed[t]), None)
            if token is None:
                ids = np.flatnonzero(allowed)
                ids = ids[~np.isin(ids, self.eos)]
                if not ids.size:
                    return None
                token = int(ids[0])
            if not m.consume_token(token):
                return None
            tokens.append(token)
        return tokens


    def _closer(self, m) -> list[int]:
        """A closer that ends the free-text part `m` is in: one the grammar takes now and not
        again right after (inside a JSON string `</think>` is text and would be taken forever)."""
        for closer in self.closers:
            after = m.deep_copy()
            if closer and after.consume_tokens(closer) and not after.deep_copy().consume_tokens(closer):
                return closer
        return []


@dataclass
class ConstrainedOutput:
    """What a request's output must follow: its matcher, how to finish it, the fewest tokens a
    valid output takes (the shortest finish found from the start, and its end) and, where the
    output may hold calls, the fewest a call takes from its opening on: free text may open one,
    and a call may be followed by another, only while that many tokens are left."""

    matcher: Any  # an llguidance LLMatcher
    finisher: Finisher
    min_tokens: int | None  # None: no finish found within PLAN_LIMIT
    call_tokens: int | None = None  # None: the output holds no calls

    @classmethod
    def of(cls, matcher, finisher: Finisher, calls: bool = False) -> ConstrainedOutput:
        plan = finisher.plan(matcher, PLAN_LIMIT)
        out = cls(matcher, finisher, None if plan is None else len(plan) + 1)
        if calls:  # how long is the shortest call? (from the start where reasoning comes first)
            opener = finisher.opener_tokens
            opened = matcher.deep_copy()
            call = finisher.plan(opened, PLAN_LIMIT) if opened.consume_tokens(opener) else None
            out.call_tokens = len(opener) + len(call) + 1 if call is not None else out.min_tokens
        return out

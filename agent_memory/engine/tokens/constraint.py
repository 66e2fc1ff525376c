"""A sequence's grammar, applied inside the batch as an mlx-lm logits processor.

Each decode step: advance the matcher with the token the sequence was just fed, let it write
the next token's bitmask (llguidance, ~10-80 µs, without the GIL while MLX computes the forward
pass started just before), and set every disallowed logit to -inf. Where the grammar forces
the text, only the first token of that text's canonical tokenization is allowed. Sequences without a grammar
have no processor and pay nothing. A token the matcher refuses (it cannot happen with its own
mask, short of a bug) ends the sequence with an end-of-sequence token rather than failing the
whole batch.

Within the last FINISH_LOOKAHEAD tokens of max_tokens (plus the shortest output's length),
while the output could not end where it is (a call or a JSON value open), each step asks for
the way to finish it (chat/finish.py); once that takes all the tokens left but a margin, the
rest of the output is forced along it and then ended: a call or a JSON answer is closed,
valid, rather than cut off.
"""

from __future__ import annotations

import logging

import agent_memory.blas  # noqa: F401
import mlx.core as mx
import numpy as np
from mlx_lm.sample_utils import make_logits_processors

from agent_memory.chat.finish import ConstrainedOutput
from agent_memory.engine.requests import GenerationRequest
from agent_memory.engine.tokens.penalties import penalties

log = logging.getLogger(__name__)

FINISH_LOOKAHEAD = 64  # tokens before max_tokens, besides the shortest output's, from which a finish is planned
FINISH_MARGIN = 16  # tokens kept in hand: a token the model writes may lengthen the finish (a new object)


def apply_bitmask(words: mx.array, logits: mx.array) -> mx.array:
    """logits (1, V) with the ids whose bit is 0 in `words` (1, ceil(V/32) packed int32) at -inf."""
    # Made here, not at import: MLX arrays belong to the stream of the thread that made them.
    shifts = mx.arange(32, dtype=mx.uint32)
    bits = ((words.astype(mx.uint32)[..., None] >> shifts) & 1).reshape(1, -1)
    return mx.where(bits[:, : logits.shape[-1]].astype(mx.bool_), logits, mx.array(-mx.inf, logits.dtype))


class GrammarProcessor:
    def __init__(self, output: ConstrainedOutput, vocab_size: int, eos_token_ids: list[int], max_tokens: int) -> None:
        self.matcher = output.matcher
        self.finisher = output.finisher
        self.call_tokens = output.call_tokens
        # Planning starts this many tokens before the end: earlier where the shortest output is long.
        self.lookahead = FINISH_LOOKAHEAD + (output.min_tokens or 0)
        self.tail = b""  # the end of the text so far, as long as a call's opener
        self.calling = False  # a call was opened: once one ends, only more calls or the end follow
        self.left = max_tokens  # tokens still to sample, this step's included
        self.finish: list[int] | None = None  # once forced: the tokens that close the output
        words = (vocab_size + 31) // 32
        self.bitmask = np.zeros((1, words), dtype=np.int32)
        flat = np.zeros(words * 32, dtype=np.uint8)
        flat[eos_token_ids] = 1
        self.eos_only = np.packbits(flat, bitorder="little").view(np.int32).reshape(1, -1)
        self.first = True
        self.error: str | None = None
        self.consumed = 0  # tokens the matcher recorded: how far to roll it back to a saved state

    def __call__(self, context: mx.array, logits: mx.array) -> mx.array:
        mx.async_eval(logits)  # the forward pass runs while the mask is computed
        if self.first:
            self.first = False  # the context is the prompt: nothing generated to consume yet
        elif self.error is None:
            token = context[-1].item()
            # A matcher the grammar's end stopped takes the end token without recording it:
            # only what it records is rolled back.
            stopped = self.matcher.is_stopped()
            if self.matcher.consume_token(token):
                self.consumed += not stopped
            else:
                self.error = self.matcher.get_error() or f"token {token} rejected"
                log.error("grammar refused a token its own mask allowed: %s", self.error)
            if self.call_tokens is not None:
                self.tail = (self.tail + self.finisher.tokenizer.decode_bytes([token]))[-len(self.finisher.opener) :]
                self.calling = self.calling or self.tail == self.finisher.opener
        if self.error is None and self.finish is None and self.left <= self.lookahead:
            self._plan_finish()
        self.left -= 1
        if self.error is not None or self.finish == []:
            self.bitmask[:] = self.eos_only
        elif self.finish:
            self._only(self.finish.pop(0))
        elif forced := self.matcher.compute_ff_tokens():
            self._only(forced[0])
        else:
            self.matcher.unsafe_compute_mask_ptr(self.bitmask.ctypes.data, self.bitmask.nbytes)
            if self.call_tokens is not None and self.left + 1 < self.call_tokens and self.matcher.is_accepting():
                if self.calling:  # another call could not end: the reply ends here
                    self.bitmask[:] = self.eos_only
                else:
                    self._disallow(self.finisher.openers(self.tail))  # a call opened now could not end
        return apply_bitmask(mx.array(self.bitmask), logits)

    def allows(self, fed: int, proposed: list[int]) -> int:
        """How many of the proposed tokens the grammar accepts after `fed`, the token the next
        call consumes (speculation checks proposals before verifying them); none while the
        output is being finished."""
        if self.error is not None or self.finish is not None or not proposed:
            return 0
        ahead = [] if self.first else [fed]
        return max(0, self.matcher.validate_tokens(ahead + proposed) - len(ahead))

    def save(self) -> tuple:
        """Where the processor is, to come back to once the proposals it saw are refused."""
        finish = None if self.finish is None else list(self.finish)
        return self.first, self.error, self.tail, self.calling, self.left, finish, self.consumed

    def restore(self, saved: tuple) -> None:
        self.first, self.error, self.tail, self.calling, self.left, finish, consumed = saved
        self.finish = None if finish is None else list(finish)
        if self.consumed > consumed:
            self.matcher.rollback(self.consumed - consumed)
        self.consumed = consumed

    def _disallow(self, tokens: np.ndarray) -> None:
        bits = self.bitmask.view(np.uint32)
        np.bitwise_and.at(bits[0], tokens // 32, ~(np.uint32(1) << (tokens % 32).astype(np.uint32)))

    def _plan_finish(self) -> None:
        """Force the finish once it needs all the tokens left (one kept for the end token) but
        FINISH_MARGIN."""
        if self.matcher.is_accepting():
            return
        plan = self.finisher.plan(self.matcher, self.left - 1)
        if plan is not None and len(plan) >= self.left - 1 - FINISH_MARGIN:
            self.finish = plan

    def _only(self, token: int) -> None:
        """Text the grammar forces (`<tool_call>\n{"name": `, a key, a closing brace) goes in
        as the tokenizer would write it, so the next turn, which renders and tokenizes that
        text again, finds these very tokens in the cache."""
        self.bitmask[:] = 0
        self.bitmask[0, token // 32] = np.int32(np.uint32(1 << (token % 32)).view(np.int32))


def logits_processors(request: GenerationRequest, vocab_size: int, eos_token_ids) -> list:
    """A sequence's mlx-lm logits processors: its logit bias, its penalties, then its grammar's
    mask (what the grammar rules out stays out, whatever the penalties did)."""
    params = request.params
    out = make_logits_processors(params.logit_bias) if params.logit_bias else []
    out += penalties(
        request.prompt, vocab_size, params.frequency_penalty, params.presence_penalty, params.repetition_penalty
    )
    if request.grammar is not None:
        out.append(GrammarProcessor(request.grammar, vocab_size, sorted(eos_token_ids), params.max_tokens))
    return out

"""Token logprobs (engine/tokens/logprobs.py) in the wire formats' shapes: chat completions' and the
Responses output_text's (`token`, `logprob`, `bytes`, `top_logprobs`), and text completions'
legacy one (`tokens`, `token_logprobs`, `top_logprobs` as {token: logprob}, `text_offset`).
A token's text is its own decoding (special tokens written out); `bytes` its UTF-8."""

from __future__ import annotations

from tokenizers import Tokenizer

from agent_memory.engine.requests import TokenLogprob


class LogprobWriter:
    def __init__(self, tokenizer: Tokenizer) -> None:
        self.tokenizer = tokenizer
        self.offset = 0  # characters of the completion's text before the next token (legacy shape)

    def text(self, token: int) -> str:
        return self.tokenizer.decode([token], skip_special_tokens=False)

    def _one(self, token: int, logprob: float) -> dict:
        text = self.text(token)
        return {"token": text, "logprob": logprob, "bytes": list(text.encode("utf-8"))}

    def entries(self, logprobs: list[TokenLogprob]) -> list[dict]:
        """Chat's `logprobs.content` and the Responses output_text's `logprobs`."""
        return [
            {**self._one(lp.token, lp.logprob), "top_logprobs": [self._one(t, v) for t, v in lp.top]} for lp in logprobs
        ]

    def legacy(self, logprobs: list[TokenLogprob]) -> dict:
        """Text completions' `logprobs`, its `text_offset` counted on from earlier calls."""
        tokens = [self.text(lp.token) for lp in logprobs]
        offsets = []
        for text in tokens:
            offsets.append(self.offset)
            self.offset += len(text)
        return {
            "tokens": tokens,
            "token_logprobs": [lp.logprob for lp in logprobs],
            "top_logprobs": [{self.text(t): v for t, v in lp.top} for lp in logprobs],
            "text_offset": offsets,
        }

"""The output side of a running request: its tokens become text (exactly as the tokenizer
decodes them), stop strings are enforced on that text, and events go to the request's sink.
Scheduling never looks here; the commit reads back the text the client was sent."""

from __future__ import annotations

from agent_memory.engine.requests import Failed, Finished, Sink, TextDelta, TokenLogprob, Usage
from agent_memory.engine.tokens.detokenizer import Detokenizer
from agent_memory.engine.tokens.stops import StopMatcher


class Output:
    def __init__(self, sink: Sink, detokenizer: Detokenizer, stops: list[str], index: int = 0) -> None:
        self.sink = sink
        self.detokenizer = detokenizer
        self.stops = StopMatcher(stops)
        self.index = index  # which of the request's samples
        self.emitted: list[str] = []  # the text the client was sent
        # Logprobs of the tokens whose text is held back, sent with the next text (an
        # end-of-sequence token has none; a stop string's go with the text before it).
        self.logprobs: list[TokenLogprob] = []

    @property
    def text(self) -> str:
        return "".join(self.emitted)

    def take(self, token: int, finish: str | None, logprob: TokenLogprob | None = None) -> bool:
        """Stream a generated token's text (held back while it could begin a stop string);
        True when a stop string was reached. `finish` "stop" means the token is an
        end-of-sequence token: no text of its own."""
        if logprob is not None and finish != "stop":
            self.logprobs.append(logprob)
        text = self.detokenizer.add(token) if finish != "stop" else ""
        if finish is not None:
            text += self.detokenizer.flush()
        safe, hit = self.stops.feed(text)
        if not hit and finish is not None:
            safe += self.stops.flush()
        if safe:
            self.emitted.append(safe)
            logprobs, self.logprobs = self.logprobs, []
            self.sink(TextDelta(safe, logprobs or None, self.index))
        return hit

    def finish(self, reason: str, usage: Usage) -> None:
        self.sink(Finished(reason, usage, self.stops.matched, self.index))

    def fail(self, error: Failed) -> None:
        self.sink(error)

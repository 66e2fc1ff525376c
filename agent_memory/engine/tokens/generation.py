"""A sequence's request side, which scheduling never reads (the Sequence holds it whole in one
field, as nano-vllm's Sequence holds only what scheduling needs): how its tokens are chosen (the
sampler, and logits processors for logit_bias, penalties and the grammar's mask), what it has
counted (`Usage`), and its `Output` (tokens to text, stop strings, events to its client)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from agent_memory.engine.loading.loader import LoadedModel
from agent_memory.engine.requests import GenerationRequest, Sink, TokenLogprob, Usage
from agent_memory.engine.tokens.constraint import logits_processors
from agent_memory.engine.tokens.detokenizer import Detokenizer
from agent_memory.engine.tokens.output import Output
from agent_memory.engine.tokens.sampling import make_sampler


@dataclass(eq=False)
class Generation:
    sampler: Any
    processors: list  # mlx-lm logits processors (logit_bias, penalties, the grammar's mask)
    usage: Usage
    output: Output
    last_token: float = 0.0  # perf_counter() of its latest token

    def take(self, token: int, finish: str | None, logprob: TokenLogprob | None) -> bool:
        """A generated token: counted, and its text on to the client; True at a stop string."""
        self.usage.completion_tokens += 1
        return self.output.take(token, finish, logprob)


def new_generation(request: GenerationRequest, sink: Sink, loaded: LoadedModel, index: int = 0) -> Generation:
    """The request side of `request`'s sample `index` (its own seed, processors and grammar matcher)."""
    params = request.params
    return Generation(
        sampler=make_sampler(params.temperature, params.top_p, params.seed, params.top_k),
        processors=logits_processors(request, loaded.vocab_size, loaded.tokenizer.eos_token_ids),
        usage=Usage(prompt_tokens=len(request.prompt)),
        output=Output(sink, Detokenizer(loaded.decoder, loaded.hidden_tokens), params.stop, index),
    )

"""DecodeBatch: the one place that touches mlx-lm's batch internals.

Every running sequence decodes one token per step together in mlx-lm's `GenerationBatch`,
each layer's cache batched as its kind says (engine/kinds/registry.py: mostly its class's own
`merge`, `KVCache` into `BatchKVCache`; Q4/Q8 KV into our `BatchQuantizedKVCache`). A sequence
whose layers include a kind that cannot share a forward pass with other rows (Llama 4's chunked
attention) decodes in a batch of its own (batch/alone.py), stepped beside the shared one. A sequence joins with
its own prefilled single-sequence cache and leaves with exactly its own rows and length. A
sequence after images that take 3-D positions decodes at its index + its delta: around each model
call the batch's rows' deltas are set (vision/positions.py). When mlx-lm changes its batching API,
this file is where to look.
"""

from __future__ import annotations

from contextlib import AbstractContextManager, nullcontext
from dataclasses import dataclass
from typing import Any

import agent_memory.blas  # noqa: F401
import mlx.core as mx
from mlx_lm.generate import GenerationBatch, StopSequences
from mlx_lm.sample_utils import greedy_sampler

from agent_memory.engine.kinds import registry
from agent_memory.engine.tokens.logprobs import token_logprobs
from agent_memory.engine.requests import TokenLogprob
from agent_memory.vision.positions import Positions


@dataclass
class Token:
    seq_id: int
    token: int
    # "stop": an end-of-sequence token (not part of the text); "length": max tokens reached.
    finish: str | None
    cache: list | None  # when finished: the sequence's single-sequence caches, one per layer
    tokens: list[int] | None  # when finished: the tokens that cache holds
    logprob: TokenLogprob | None = None  # where the request asked for logprobs


class DecodeBatch:
    verified: tuple = ()  # it proposes no tokens (speculative_batch.py does)

    def __init__(self, model: Any, eos_token_ids: list[int], positions: Positions | None = None) -> None:
        self.model = model
        self.positions = positions  # a model whose image tokens take 3-D positions; None: plain
        self._deltas: dict[int, int] = {}  # seq id -> its delta, for those decoding after images
        self._eos = StopSequences([(t,) for t in eos_token_ids])
        self._batch = GenerationBatch.empty(model, greedy_sampler)
        self._alone: list[GenerationBatch] = []  # one per sequence whose caches cannot join others'
        self._tops: dict[int, int] = {}  # seq id -> its top_logprobs, for those that asked for logprobs

    def __len__(self) -> int:
        return len(self._batch) + len(self._alone)

    @property
    def seq_ids(self) -> list[int]:
        return [uid for batch in (self._batch, *self._alone) for uid in batch.uids]

    def add(
        self,
        seq_id: int,
        prompt: list[int],
        cache: list,
        sampler,
        processors: list,
        max_tokens: int,
        logprobs=None,
        delta: int = 0,
    ) -> None:
        """Join the batch with a prefilled cache holding every prompt token but the last,
        which is fed as the first decode step's input (the cache is read, not changed: n
        samples join from one). `logprobs`: None, or how many alternatives each token reports;
        `delta`: what its positions add to its index (Sequence.delta)."""
        if logprobs is not None:
            self._tops[seq_id] = logprobs
        if delta:
            self._deltas[seq_id] = delta
        caches, joins = registry.batched(cache)
        with self._placed([seq_id]):  # its constructor runs the first step
            joining = GenerationBatch(
                self.model,
                [seq_id],
                mx.array(prompt[-1:]),
                caches,
                [list(prompt[:-1])],
                [sampler],
                greedy_sampler,
                [processors],
                [self._eos],
                [max_tokens],
            )
        if joins:
            self._batch.extend(joining)
        else:
            self._alone.append(joining)

    def step(self, waiting: bool = False) -> list[Token]:
        """One token for every sequence; finished ones leave the batch with their KV. (A plain
        step is as short as a step gets, whoever `waiting` for a first token: see
        SpeculativeBatch's.)"""
        responses = []
        for batch in (self._batch, *self._alone):
            with self._placed(batch.uids):  # its model call is first, over exactly these rows
                responses.extend(batch.next())
        self._alone = [batch for batch in self._alone if len(batch)]
        out = [Token(r.uid, r.token, r.finish_reason, r.prompt_cache, r.all_tokens) for r in responses]
        asked = [i for i, r in enumerate(responses) if r.uid in self._tops]
        if asked:  # from the distribution each was sampled from (logprobs.py), in one evaluation
            rows = mx.stack([responses[i].logprobs for i in asked])
            tops = [self._tops[responses[i].uid] for i in asked]
            for i, lp in zip(asked, token_logprobs(rows, [responses[i].token for i in asked], tops)):
                out[i].logprob = lp
        for t in out:
            if t.finish is not None:
                self._tops.pop(t.seq_id, None)
                self._deltas.pop(t.seq_id, None)
        return out

    def _placed(self, seq_ids: list[int]) -> AbstractContextManager:
        """The rows' deltas set for a model call over `seq_ids`, where any is not 0."""
        if not any(self._deltas.get(s) for s in seq_ids):
            return nullcontext()
        return self.positions.rows(deltas=[self._deltas.get(s, 0) for s in seq_ids])

    def remove(self, seq_ids: list[int]) -> dict[int, tuple[list, list[int]]]:
        """Take sequences out before they finish: seq id -> (its caches, the tokens they hold)."""
        taken = {}
        for batch in (self._batch, *self._alone):
            index = {seq_id: batch.uids.index(seq_id) for seq_id in seq_ids if seq_id in batch.uids}
            if index:
                taken.update({seq_id: (batch.extract_cache(i), list(batch.tokens[i])) for seq_id, i in index.items()})
                batch.filter([i for i in range(len(batch.uids)) if i not in index.values()])
        self._alone = [batch for batch in self._alone if len(batch)]
        for seq_id in seq_ids:
            self._tops.pop(seq_id, None)
            self._deltas.pop(seq_id, None)
        return taken

    def reset(self) -> None:
        """Start over empty (after a failed step left the batch in an unknown state)."""
        self._batch = GenerationBatch.empty(self.model, greedy_sampler)
        self._alone = []
        self._tops = {}
        self._deltas = {}

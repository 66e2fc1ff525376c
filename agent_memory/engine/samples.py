"""n > 1: a request's other samples, made once its prompt is prefilled.

Sample 0 is the request's own sequence; samples 1..n-1 are sequences that join the decode batch
from the same prefilled cache (the batch copies it when each joins), so the prompt is computed
once. Each has its own output (its events carry its `index`), sampler, logits processors (its
own copy of the grammar's matcher) and usage; only sample 0 speaks for the agent, the others'
KV is kept for nobody. With a seed, sample i samples with seed + i: each is reproducible, and
sample 0 is what the request gives with n = 1.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import replace

from agent_memory.engine.loading.loader import LoadedModel
from agent_memory.engine.sequence import Sequence, Status
from agent_memory.engine.tokens.generation import new_generation


def samples(seq: Sequence, ids: Iterator[int], loaded: LoadedModel) -> list[Sequence]:
    """Samples 1..n-1 of `seq`'s request, ready to decode (their cache: the batch's copy of `seq`'s)."""
    params = seq.request.params
    out = []
    for index in range(1, params.n):
        seed = params.seed + index if params.seed is not None and params.seed >= 0 else None
        grammar = seq.request.grammar
        if grammar is not None:  # its own matcher, at the start as sample 0's is
            grammar = replace(grammar, matcher=grammar.matcher.deep_copy())
        request = replace(seq.request, params=replace(params, seed=seed, n=1), agent=None, grammar=grammar)
        generation = new_generation(request, seq.generation.output.sink, loaded, index)
        generation.usage = replace(seq.generation.usage, completion_tokens=0)  # the prompt's, from one prefill
        sample = Sequence(
            id=next(ids),
            request=request,
            generation=generation,
            submitted=seq.submitted,
            cache=None,
            agent=None,
            root=seq.root,
            status=Status.DECODING,
            parent=seq.id,
        )
        out.append(sample)
    return out

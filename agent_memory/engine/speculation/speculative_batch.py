"""SpeculativeBatch: the decode batch with speculation (--speculation lookup or draft).

Each step, every running sequence feeds the token it sampled last and the tokens its proposer
proposes after it (lookup.py: its own history; draft.py: a smaller model; a constrained
sequence only those its grammar accepts), right-padded to a common width (verify_width.py: as
many as pay on this machine): one forward pass of the batch verifies them all. Each sequence
keeps the proposals its model accepts (sampling.verify: exact at temperature 0, the rejection
rule otherwise) and samples the token after them; its rejected positions leave its KV
(ragged_kv.py), so the KV a sequence leaves with holds exactly its tokens. A token is emitted
as soon as it is sampled, not once it is fed (a request's first token a whole step sooner);
the KV a sequence leaves with holds what was fed. It keeps mlx-lm's `GenerationBatch`'s
interface (`DecodeBatch`): a step gives each sequence its list of new tokens instead of one.

Only for models whose every layer keeps a plain `KVCache` (parts.py), the draft's too: a window
or recurrent layer cannot drop rejected positions without a snapshot per proposal.
"""

from __future__ import annotations

import time
from contextlib import nullcontext
from dataclasses import dataclass
from typing import Any

import agent_memory.blas  # noqa: F401
import mlx.core as mx

from agent_memory.engine.tokens.constraint import GrammarProcessor
from agent_memory.engine.batch.decode_batch import Token
from agent_memory.engine.speculation.draft import Draft
from agent_memory.engine.tokens.logprobs import token_logprobs
from agent_memory.engine.requests import TokenLogprob
from agent_memory.engine.speculation.lookup import Lookups, Settled
from agent_memory.engine.tokens.penalties import Penalties
from agent_memory.engine.batch.ragged_kv import drop, join
from agent_memory.engine.tokens.sampling import SeededSampler, accept_greedy, verify
from agent_memory.engine.speculation.verify_width import VerifyWidth
from agent_memory.vision.positions import Positions


@dataclass(eq=False)
class Row:
    seq_id: int
    tokens: list[int]  # the tokens its KV holds
    fed: int  # the token the next step feeds: the prompt's last, then each one sampled (emitted)
    sampler: Any
    processors: list
    max_tokens: int
    tops: int | None = None  # None: no logprobs; k: each token's and its k likeliest (tokens/logprobs.py)
    emitted: int = 0
    delta: int = 0  # what its positions add to its index, after images that take 3-D positions

    @property
    def grammar(self) -> GrammarProcessor | None:
        return next((p for p in self.processors if isinstance(p, GrammarProcessor)), None)

    @property
    def stateful(self) -> list:
        """The processors that follow the tokens fed (the grammar, penalties): saved after each
        verified position, restored to the last accepted one."""
        return [p for p in self.processors if isinstance(p, (GrammarProcessor, Penalties))]


@dataclass
class Verified:
    """One sequence's proposals in a step: how many, and how many the model accepted."""

    seq_id: int
    proposed: int
    accepted: int


class SpeculativeBatch:
    def __init__(
        self, model: Any, eos_token_ids: list[int], draft: Any = None, positions: Positions | None = None
    ) -> None:
        """`draft`: the draft model's weights (--speculation draft), else prompt lookup;
        `positions`: a model whose image tokens take 3-D positions (vision/positions.py)."""
        self.model = model
        self.positions = positions
        self.eos = set(eos_token_ids)
        self.proposer = Draft(draft) if draft is not None else Lookups()
        self.rows: list[Row] = []
        self.cache: list = []  # one batched cache per layer, its rows in `rows`' order
        self.verified: list[Verified] = []  # the last step's proposals
        self.width = VerifyWidth()

    def __len__(self) -> int:
        return len(self.rows)

    @property
    def seq_ids(self) -> list[int]:
        return [r.seq_id for r in self.rows]

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
        """Join with a prefilled cache holding every prompt token but the last (fed first); the
        cache is read, not changed (n samples join from one). The draft (a text model) proposes
        at plain positions: the model verifies at the sequence's own (`delta`)."""
        self.cache = join(self.cache, cache)
        self.proposer.add(seq_id, prompt)
        row = Row(seq_id, list(prompt[:-1]), prompt[-1], sampler, processors, max_tokens, logprobs, delta=delta)
        self.rows.append(row)

    def step(self, waiting: bool = False) -> list[Token]:
        """Verify every sequence's proposals in one forward pass; each sequence's new tokens, in
        order (finished ones leave the batch with their KV).

        Returning agents first: while a client waits for its first token — a prompt `waiting`
        for its prefill, or a row that has not emitted yet — nothing is proposed and
        the step is a plain one. Verifying proposals never brings a waiting prompt's prefill
        closer (one chunk runs per step, whatever the steps' widths), it only lengthens the
        step it waits through; the decoding sequences speculate again once nobody waits."""
        t0 = time.perf_counter()
        hold = waiting or not all(r.emitted for r in self.rows)
        proposed = self.proposer.propose([(r.seq_id, r.fed, 0 if hold else self._left(r)) for r in self.rows])
        proposals = [self._allowed(r, p) for r, p in zip(self.rows, proposed)]
        rates = [self.proposer.rate(r.seq_id) for r in self.rows]
        width = self.width.choose([len(p) for p in proposals], rates)
        proposals = [p[: width - 1] for p in proposals]
        inputs = [[r.fed, *p] + [r.fed] * (width - 1 - len(p)) for r, p in zip(self.rows, proposals)]
        placed = any(r.delta for r in self.rows)
        with self.positions.rows(deltas=[r.delta for r in self.rows]) if placed else nullcontext():
            logits = self.model(mx.array(inputs), cache=self.cache)
        saved = [self._constrain(r, inputs[i][: len(proposals[i]) + 1], logits, i) for i, r in enumerate(self.rows)]
        logprobs = logits - mx.logsumexp(logits, axis=-1, keepdims=True)
        plain = [not r.processors and not isinstance(r.sampler, SeededSampler) for r in self.rows]
        best = mx.argmax(logprobs, axis=-1).tolist() if any(plain) else None  # one evaluation for them all

        outs = [
            accept_greedy(best[i], p) if plain[i] else verify(r.sampler, logprobs[i, : len(p) + 1], p)
            for i, (r, p) in enumerate(zip(self.rows, proposals))
        ]
        picked = self._logprobs(logprobs, outs)

        tokens: list[Token] = []
        kept, finished, settled = [], [], []
        for i, (r, p, out) in enumerate(zip(self.rows, proposals, outs)):
            a = len(out) - 1
            if saved[i] is not None and a < len(p):
                for processor, state in zip(r.stateful, saved[i][a]):
                    processor.restore(state)
            # Emitted as sampled: the accepted proposals and the token sampled after them, each
            # with its logprob from this pass; the KV keeps the positions fed up to the last.
            news, finish = self._emit(r, out)
            lps = picked[i] if picked[i] is not None else [None] * len(out)
            tokens.extend(Token(r.seq_id, t, None, None, None, lps[k]) for k, t in enumerate(news))
            n = a + 1 if finish is None else min(a + 1, len(news) + 1)
            kept.append(n)
            r.tokens.extend(inputs[i][:n])
            settled.append(Settled(r.seq_id, r.fed, p, a, None if finish is not None else out[-1]))
            if finish is not None:
                tokens[-1].finish = finish
                finished.append((i, tokens[-1]))
            else:
                r.fed = out[-1]
        self.proposer.settle(settled)
        self.verified = [Verified(s.seq_id, len(s.proposed), s.accepted) for s in settled if s.proposed]
        drop(self.cache, [width - n for n in kept])  # positions past each row's kept ones
        self.width.observe(width * len(self.rows), time.perf_counter() - t0)
        for i, token in finished:
            token.cache, token.tokens = self._extract(i), self.rows[i].tokens
        if finished:
            self._keep([i for i in range(len(self.rows)) if i not in {i for i, _ in finished}])
        return tokens

    def _logprobs(self, logprobs: mx.array, outs: list[list[int]]) -> list[list[TokenLogprob] | None]:
        """Each row's logprobs of its verified positions' tokens (None: it asked for none), read
        from this forward pass's distributions — the ones each was sampled or accepted from —
        in one evaluation."""
        asked = [(i, j) for i, r in enumerate(self.rows) if r.tops is not None for j in range(len(outs[i]))]
        picked: list[list[TokenLogprob] | None] = [None if r.tops is None else [] for r in self.rows]
        if asked:
            rows = logprobs[mx.array([i for i, _ in asked]), mx.array([j for _, j in asked])]
            tops = [self.rows[i].tops for i, _ in asked]
            for (i, _), lp in zip(asked, token_logprobs(rows, [outs[i][j] for i, j in asked], tops)):
                picked[i].append(lp)
        return picked

    def _left(self, r: Row) -> int:
        """How many tokens it may be proposed: as many as it may emit besides the one sampled
        after them."""
        return r.max_tokens - r.emitted - 1

    def _allowed(self, r: Row, proposed: list[int]) -> list[int]:
        """The proposal up to what its grammar accepts."""
        grammar = r.grammar
        if grammar is not None and proposed:
            return proposed[: grammar.allows(r.fed, proposed)]
        return proposed

    def _constrain(self, r: Row, fed: list[int], logits: mx.array, i: int) -> list[list] | None:
        """Run a sequence's logits processors over its fed positions in order, in place in
        `logits`, each seeing the tokens fed before its position; the stateful processors'
        states after each position, to go back to (None: none of them)."""
        if not r.processors:
            return None
        stateful, saved = r.stateful, []
        for j, token in enumerate(fed):
            row = logits[i : i + 1, j]
            for processor in r.processors:
                row = processor(mx.array([token]), row)
            logits[i, j] = row[0]
            if stateful:
                saved.append([p.save() for p in stateful])
        return saved if stateful else None

    def _emit(self, r: Row, out: list[int]) -> tuple[list[int], str | None]:
        """The step's output tokens up to the first that ends the sequence (an end-of-sequence
        token or max_tokens), and why it ended."""
        news = []
        for token in out:
            news.append(token)
            r.emitted += 1
            if token in self.eos:
                return news, "stop"
            if r.emitted >= r.max_tokens:
                return news, "length"
        return news, None

    def _extract(self, i: int) -> list:
        return [c.extract(i) for c in self.cache]

    def _keep(self, keep: list[int]) -> None:
        self.rows = [self.rows[i] for i in keep]
        self.proposer.keep(self.seq_ids)
        if not keep:
            self.cache = []
            return
        for c in self.cache:
            c.filter(keep)

    def remove(self, seq_ids: list[int]) -> dict[int, tuple[list, list[int]]]:
        """Take sequences out before they finish: seq id -> (its caches, the tokens they hold)."""
        index = {r.seq_id: i for i, r in enumerate(self.rows)}
        taken = {s: (self._extract(index[s]), list(self.rows[index[s]].tokens)) for s in seq_ids}
        self._keep([i for i, r in enumerate(self.rows) if r.seq_id not in taken])
        return taken

    def reset(self) -> None:
        """Start over empty (after a failed step left the batch in an unknown state)."""
        self.rows, self.cache = [], []
        self.proposer.reset()

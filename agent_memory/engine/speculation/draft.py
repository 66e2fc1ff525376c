"""Draft: the batch's proposer for --speculation draft, a smaller model with the same tokenizer.

Where output repeats nothing (chat, free writing), a sequence's own history proposes little
(lookup.py); a small model of the same family guesses the next tokens instead. The draft keeps
its own KV for every running sequence, batched like the model's (rows in `ids` order). Each step
it feeds every sequence the tokens its draft KV lacks (the token the step feeds, and the last
draft when the model accepted them all) and drafts `length` tokens greedily, one forward pass of
the draft for all sequences per token; once the model has verified them, each draft KV keeps
what the model's KV kept. A sequence that joins prefills its prompt into the draft first, CHUNK
tokens a step for all joining ones together, and proposes once it has caught up. `length` adapts
to what the batch accepts, and drafting pauses after steps that accepted nothing (lookup.Backoff,
as each sequence's lookup does).
"""

from __future__ import annotations

from typing import Any

import agent_memory.blas  # noqa: F401
import mlx.core as mx
from mlx_lm.models.cache import make_prompt_cache

from agent_memory.engine.speculation.lookup import Backoff, Settled
from agent_memory.engine.batch.ragged_kv import drop, join
from agent_memory.engine.speculation.verify_width import Acceptance

CHUNK = 512  # prompt tokens prefilled into the draft per step, for all joining sequences
FIRST = 3  # tokens drafted at first (mlx-lm's default)
MOST = 8  # tokens drafted at most


class Draft:
    def __init__(self, model: Any) -> None:
        self.model = model
        self.cache: list = []  # one batched cache per layer, its rows in `ids` order
        self.ids: list[int] = []  # the sequences caught up with (proposing)
        self.joining: dict[int, list] = {}  # a sequence's own draft caches, while its prompt prefills
        self.behind: dict[int, list[int]] = {}  # tokens a sequence's KV holds and its draft KV lacks
        self.acceptance: dict[int, Acceptance] = {}
        self.drafted: dict[int, list[int]] = {}  # this step's drafts
        self.length = FIRST
        self.backoff = Backoff()  # drafting pauses after steps that accepted nothing

    def add(self, seq_id: int, prompt: list[int]) -> None:
        """A sequence joins: its KV holds every prompt token but the last (fed first)."""
        self.joining[seq_id] = make_prompt_cache(self.model)
        self.behind[seq_id] = list(prompt[:-1])
        self.acceptance[seq_id] = Acceptance()

    def rate(self, seq_id: int) -> float:
        return self.acceptance[seq_id].rate

    def propose(self, rows: list[tuple[int, int, int]]) -> list[list[int]]:
        """For each (seq id, token it feeds, most tokens it may take): its draft (none while it
        catches up, or while drafting pauses)."""
        self._catch_up()
        self.drafted = {}
        if self.ids and not self.backoff.paused() and any(limit > 0 for _, _, limit in rows):
            self.drafted = dict(zip(self.ids, self._draft({s: fed for s, fed, _ in rows})))
        return [self.drafted.get(s, [])[: max(limit, 0)] for s, _, limit in rows]

    def _draft(self, fed: dict[int, int]) -> list[list[int]]:
        """`length` greedy tokens for every caught-up sequence, after its lagging tokens and the
        token it feeds (right-padded to a common width, the padding then dropped)."""
        inputs = [[*self.behind[s], fed[s]] for s in self.ids]
        width = max(map(len, inputs))
        logits = self.model(mx.array([x + [x[-1]] * (width - len(x)) for x in inputs]), cache=self.cache)
        ends = mx.array([len(x) - 1 for x in inputs])
        token = mx.argmax(logits[mx.arange(len(inputs)), ends], axis=-1)
        drop(self.cache, [width - len(x) for x in inputs])
        drafts = [token]
        for _ in range(self.length - 1):
            token = mx.argmax(self.model(token[:, None], cache=self.cache)[:, -1], axis=-1)
            drafts.append(token)
        for s in self.ids:
            self.behind[s] = []
        return mx.stack(drafts, axis=1).tolist()

    def _catch_up(self) -> None:
        """Prefill joining sequences' prompts into their draft caches, CHUNK tokens a step in
        all; one caught up joins the batched draft cache."""
        budget = CHUNK
        for s, cache in list(self.joining.items()):
            todo = self.behind[s]
            n = min(len(todo), budget)
            if n:
                self.model(mx.array([todo[:n]]), cache=cache)
                mx.eval([c.state for c in cache])
                self.behind[s], budget = todo[n:], budget - n
            if self.behind[s] or cache[0].offset == 0:
                continue
            self.cache = join(self.cache, cache)
            self.ids.append(s)
            del self.joining[s]

    def settle(self, steps: list[Settled]) -> None:
        """Each draft KV keeps what the model's KV kept: the fed token and the accepted drafts.
        A sequence not drafted for (joining, or drafting paused) lags by the token it fed."""
        extra = {}
        for step in steps:
            drafted = self.drafted.get(step.seq_id)
            if drafted is None:
                self.behind[step.seq_id].append(step.fed)
                continue
            # Its draft KV gained the fed token and all drafts but the last.
            k, a = len(drafted), step.accepted
            extra[step.seq_id] = k - min(a + 1, k)
            self.behind[step.seq_id] = drafted[k - 1 :] if a == k else []
            self.acceptance[step.seq_id].verified(len(step.proposed), a)
        if extra:
            drop(self.cache, [extra.get(s, 0) for s in self.ids])
        self._adapt([(len(s.proposed), s.accepted) for s in steps if s.seq_id in self.drafted and s.proposed])

    def _adapt(self, verified: list[tuple[int, int]]) -> None:
        """Draft more while whole drafts are accepted, as many as were accepted otherwise;
        pause after steps that accepted nothing."""
        if not verified:
            return
        accepted = [a for _, a in verified]
        if all(a == p for p, a in verified):
            self.length = min(2 * self.length, MOST)
        else:
            self.length = max(accepted) + 1
        self.backoff.verified(any(accepted))

    def keep(self, seq_ids: list[int]) -> None:
        """Only these sequences stay (the others left the batch)."""
        kept = set(seq_ids)
        rows = [i for i, s in enumerate(self.ids) if s in kept]
        if len(rows) < len(self.ids):
            if rows:
                for c in self.cache:
                    c.filter(rows)
            else:
                self.cache = []
            self.ids = [self.ids[i] for i in rows]
        self.joining = {s: c for s, c in self.joining.items() if s in kept}
        self.behind = {s: t for s, t in self.behind.items() if s in kept}
        self.acceptance = {s: a for s, a in self.acceptance.items() if s in kept}

    def reset(self) -> None:
        self.__init__(self.model)

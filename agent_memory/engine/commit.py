"""The commit path, in one place: a sequence's KV cut into blocks at the store's request (exact,
as computed; runs it restored keep their stored bits, see kv.cut_at), made hot in the store,
and what the store says is new turned into numpy at the disk's precision once and queued for
the disk tier's writer."""

from __future__ import annotations

import logging
import time

import agent_memory.blas  # noqa: F401
import mlx.core as mx

from agent_memory.agent_key import AgentKey
from agent_memory.engine import kv
from agent_memory.engine.sequence import Sequence, canonical_reply
from agent_memory.engine.trace import NoTrace
from agent_memory.memory.index.store import AgentCacheStore
from agent_memory.memory.warm.tier import WarmTier
from agent_memory.precision import Precisions

log = logging.getLogger(__name__)


class Committer:
    def __init__(
        self, store: AgentCacheStore, warm: WarmTier | None, precisions: Precisions, decoder, trace: NoTrace
    ) -> None:
        self.store = store
        self.warm = warm
        self.precisions = precisions
        self.decoder = decoder  # a tokenizers.Tokenizer: the reply's canonical tokens
        self.trace = trace

    def commit_turn(self, seq: Sequence, reason: str, cache: list, tokens: list[int]) -> list[int] | None:
        """Commit a finished sequence's KV for its agent, as far as it is what the agent's next
        turn will send; return the canonical sequence still to compute, if any (see
        sequence.canonical_reply)."""
        follow_up = None
        if seq.agent is not None and reason in ("stop", "length"):
            reply = self.decoder.encode(seq.output.text, add_special_tokens=False).ids
            keep, follow_up = canonical_reply(seq.prompt, tokens, reply)
            tokens = tokens[:keep]
        self.commit(seq, seq.agent, cache, tokens)
        return follow_up

    def commit(self, seq: Sequence, agent: AgentKey | None, cache: list, tokens: list[int]) -> None:
        """Store tokens' KV (for `agent`, or anonymously); a failure costs only reuse."""
        p = self.precisions
        payloads = []

        def cut(start: int, end: int):
            block = kv.cut_at(cache, start, end, seq.stored, p.working)
            payloads.append(block.arrays)
            return block, block.nbytes, block.precision != p.hot

        try:
            t0 = time.perf_counter()
            persist = self.store.commit(agent, tokens, cut, seq.root)
            mx.eval(payloads)
            if self.warm is not None:
                persist.write(self.warm, lambda block: kv.to_numpy(block.at(p.disk)))
                written = persist.manifest.key.id if persist.manifest is not None else None
                self.trace.committed([record.hash for record, _ in persist.blocks], written, t0)
        except Exception:
            log.exception("could not cache the KV of request %s", seq.request.request_id)

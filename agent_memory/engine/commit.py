"""The commit path, in one place: a sequence's KV cut into blocks at the store's request (exact,
as computed; runs it restored keep their stored bits, see attention.cut_at) and, for a model
with window or recurrent layers, a snapshot of those where the committed tokens end; made hot in
the store, and what the store says is new turned into numpy at the disk's precision once and
queued for the warm tier's writer."""

from __future__ import annotations

import logging
import time

import agent_memory.blas  # noqa: F401
import mlx.core as mx

from agent_memory.agent_key import AgentKey
from agent_memory.engine.distributed.plan import END
from agent_memory.engine.distributed.recorder import NO_RECORDER
from agent_memory.engine.kinds.layers import ModelLayers
from agent_memory.engine.observability.trace import NoTrace
from agent_memory.engine.requests import Retention
from agent_memory.engine.sequence import Sequence, canonical_reply
from agent_memory.memory.index import keep, snapshots
from agent_memory.memory.index.store import AgentCacheStore
from agent_memory.memory.index.store_records import Persist
from agent_memory.memory.warm.format.records import BLOCK_TOKENS
from agent_memory.memory.warm.tier import WarmTier
from agent_memory.precision import Precisions

log = logging.getLogger(__name__)


class Committer:
    def __init__(
        self,
        store: AgentCacheStore,
        warm: WarmTier | None,
        layers: ModelLayers,
        precisions: Precisions,
        decoder,
        trace: NoTrace,
    ) -> None:
        self.store = store
        self.warm = warm
        self.layers = layers
        self.precisions = precisions
        self.decoder = decoder  # a tokenizers.Tokenizer: the reply's canonical tokens
        self.trace = trace
        self.recorder = NO_RECORDER  # distributed: rank 0's (recorder.py), told what it cuts

    def commit_turn(self, seq: Sequence, reason: str, cache: list, tokens: list[int]) -> list[int] | None:
        """Commit a finished sequence's KV for its agent, as far as it is what the agent's next
        turn will send; return the canonical sequence still to compute, if any (see
        sequence.canonical_reply). A turn the API settles is committed as fed: the settle,
        queued before its client reads the reply's end, computes the rest from where they
        differ. `cache` holds exactly `tokens`."""
        follow_up = None
        held = len(tokens)
        if seq.agent is not None and reason in ("stop", "length") and not seq.request.settles:
            reply = self.decoder.encode(seq.generation.output.text, add_special_tokens=False).ids
            keep, follow_up = canonical_reply(seq.prompt, tokens, reply)
            tokens = tokens[:keep]
        # A state layer's cache cannot be cut back: its snapshot is taken only where it ends.
        self.commit(seq, seq.agent, cache, tokens, snapshot=len(tokens) == held)
        return follow_up

    def share_prompt(self, seq: Sequence) -> None:
        """Offer the prompt, now prefilled, for reuse at once, not when the request ends, so that
        requests arriving while this one decodes skip the prefix they share with it: an agent's
        whole prompt, its turn's start (`start_turn`); else its new whole blocks, and with state
        layers all of it and a snapshot where it ends. Then the client's breakpoints, all
        computed now, are kept with priority (memory/index/keep.py)."""
        if seq.agent is not None and seq.prefill_end:
            self.start_turn(seq)
        elif self.layers.has_state:
            if seq.prefill_end > seq.lease.end:
                self.share(seq, seq.prefill_end)
        elif (whole := (len(seq.prompt) - 1) // BLOCK_TOKENS * BLOCK_TOKENS) > seq.lease.end:
            self.commit(seq, None, seq.cache, seq.prompt[:whole])
        now = time.time()
        for point in seq.request.breakpoints:
            tokens = seq.prompt[: min(point.position, seq.prefill_end)]
            keep.keep_prefix(self.store, tokens, seq.root, seq.request.extra_keys, now + point.ttl_s)

    def start_turn(self, seq: Sequence) -> None:
        """Commit the prompt, now prefilled, for its agent before the reply is decoded (with a
        snapshot where it ends, kept as its `turn_start`): its blocks, snapshot and manifest go
        to the warm tier now, so that the same request sent again, after a disconnect or a
        crash, resumes at its last token (memory/index/snapshots.py)."""
        resumed = seq.lease.snapshot.hash if seq.lease is not None and seq.lease.snapshot is not None else None
        prompt = seq.prompt[: seq.prefill_end]
        self.commit(seq, seq.agent, seq.cache, prompt, snapshot=True, role=snapshots.TURN_START, resumed=resumed)

    def share(self, seq: Sequence, end: int) -> None:
        """Offer the first `end` prompt tokens, which the cache holds now, for reuse by requests
        that arrive meanwhile (with a snapshot there, for a model with state layers)."""
        self.commit(seq, None, seq.cache, seq.prompt[:end], snapshot=True)

    def commit(
        self,
        seq: Sequence,
        agent: AgentKey | None,
        cache: list,
        tokens: list[int],
        snapshot: bool = False,
        role: str = snapshots.TURN_END,
        resumed: str | None = None,
    ) -> Persist | None:
        """Store tokens' KV (for `agent`, or anonymously), and where they end a snapshot if the
        model has state layers and `snapshot` says the cache ends there too (its agent keeps it
        as `role`); a failure costs only reuse. A snapshot taken for no agent is the sequence's
        to let go of when it ends (core._end), mid-turn or at its end alike."""
        p = self.precisions
        payloads = []
        capture = (seq.id, seq.pos if cache is seq.cache else END)  # where a follower finds the same cache

        def cut(start: int, end: int):
            self.recorder.cutting(capture, start, end)
            block = self.layers.cut_at(cache, start, end, seq.stored, p.working)
            payloads.append(block.arrays)
            return block, block.nbytes, block.precision != p.hot

        def take():
            self.recorder.taking(capture)
            taken = self.layers.take_snapshot(cache)
            return taken, taken.nbytes

        try:
            t0 = time.perf_counter()
            take_snapshot = take if snapshot and self.layers.has_state else None
            persist = self.store.commit(
                agent, tokens, cut, seq.root, take_snapshot, seq.snapshots, seq.request.tenant, seq.request.extra_keys,
                role, resumed,
            )
            if agent is None and persist.snapshot is not None:  # pinned until core._end lets go
                seq.snapshots.append(persist.snapshot)
            if agent is not None:  # its retention (asked now or before) over its blocks, and in its manifest
                asked = seq.request.retention or Retention(0.0, False)
                until = keep.keep_agent(self.store, agent, time.time(), asked.seconds, asked.disk)
                if until and persist.manifest is not None:
                    persist.manifest.keep_until = until
            mx.eval(payloads)
            if self.warm is not None:
                persist.write(self.warm, lambda payload: payload.tensors(p.disk))
                written = persist.manifest.key.id if persist.manifest is not None else None
                self.trace.committed([record.hash for record, _ in persist.blocks], written, t0)
            return persist
        except Exception:
            log.exception("could not cache the KV of request %s", seq.request.request_id)
            return None

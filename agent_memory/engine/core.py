"""EngineCore: the engine thread's work, and only that thread's (it touches MLX).

Each `step()` reads as nano-vllm's: `_schedule` (does the batch decode, which sequence
prefills), `_decode` of the whole batch, whose tokens `_apply_decoded` sends at once, then one
`_prefill` chunk. A sequence ends through one path, `_end`: release, commit, report once.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Iterator
from concurrent.futures import Future
from dataclasses import dataclass, replace
from typing import TypeVar

from agent_memory.agent_key import HEAD, AgentKey
from agent_memory.engine.config import EngineConfig
from agent_memory.engine.batch.decode_batch import Token
from agent_memory.engine.distributed.recorder import NO_RECORDER
from agent_memory.engine.observability.metrics import Metrics
from agent_memory.engine.parts import Parts
from agent_memory.engine.planner import Planner
from agent_memory.engine.requests import Failed, GenerationRequest, SamplingParams, Sink
from agent_memory.engine.samples import samples
from agent_memory.engine.scheduler import Scheduler
from agent_memory.engine.sequence import Sequence, Status, new_sequence
from agent_memory.engine.speculation.speculative_batch import Verified
from agent_memory.engine.observability.trace import NoTrace
from agent_memory.memory.index.tier_events import StoreEvents
from agent_memory.memory.index.write_back import WriteBack

log = logging.getLogger(__name__)
T = TypeVar("T")


@dataclass
class Work:
    """One step's decision: whether the batch decodes, and which sequence prefills a chunk."""

    decode: bool
    prefill: Sequence | None
    waiting: bool  # a request's prefill has not ended: a speculative step then verifies nothing


@dataclass
class Decoded:
    """A decode step's new tokens (one a sequence, with speculation any number) and proposals."""

    tokens: list[Token]
    verified: list[Verified]


class EngineCore:
    def __init__(
        self,
        parts: Parts,
        config: EngineConfig,
        metrics: Metrics,
        trace: NoTrace,
        ids: Iterator[int],
        post: Callable[[Callable[[], None]], None],
    ) -> None:
        self.parts = parts
        self.store = parts.store
        self.scheduler = Scheduler(max_batch=config.max_batch)
        self.metrics = metrics
        self.trace = trace
        self._post = post  # queue a call for the engine thread (it wakes the loop)
        self._ids = ids  # sequence ids, shared with the requests' (BatchEngine.submit)
        self.seqs: dict[int, Sequence] = {}  # in arrival order
        self.recorder = NO_RECORDER  # distributed: what the other ranks must repeat (Recorder.attach)
        self.planner = Planner(parts.store, parts.warm, metrics, trace, post, parts.loaded.decoder)
        # What a shared tier loses or misses is written back from memory.
        shared, disk = parts.store.sync is not None, parts.precisions.disk
        self.write_back = WriteBack(parts.store, parts.warm, post, lambda p: p.tensors(disk)) if shared else None
        if parts.warm is not None:  # its writer starts now that all it tells exist
            parts.warm.start(StoreEvents(parts.store, self.write_back, trace.job))

    @property
    def decoding(self) -> int:
        return len(self.parts.batch)

    def count(self, state: str) -> int:
        """Sequences in a state: waiting, prefilling or decoding (read from any thread)."""
        return sum(1 for s in list(self.seqs.values()) if s.status.value == state)

    def busy(self) -> bool:
        """Whether a step has work: sequences decoding, or one ready to prefill."""
        return bool(self.decoding) or self._next_prefill() is not None

    # -- one step -----------------------------------------------------------------------

    def step(self) -> None:
        """The scheduler's decision, then each part run and applied in turn: decoded tokens
        reach their clients before the prefill chunk (as long as several decode steps) runs."""
        work = self._schedule()
        self.recorder.step(work, self.scheduler.chunk_tokens)  # before any forward: the same point on every rank
        if work.decode:
            self._apply_decoded(self._decode(work))
        if work.prefill is not None and self._prefill(work.prefill):
            self._guard(lambda: self._prefill_done(work.prefill), [work.prefill])

    def _schedule(self) -> Work:
        seq = self._next_prefill()
        if seq is not None and not (self.scheduler.may_prefill(self.decoding) and self._fits(seq)):
            seq = None
        return Work(self.decoding > 0, seq, self.scheduler.anyone_waiting(self.seqs.values()))

    def _decode(self, work: Work) -> Decoded:
        t0, n = time.perf_counter(), self.decoding
        self.metrics.batch_size.observe(n)
        batch = [self.seqs[i] for i in self.parts.batch.seq_ids]
        tokens = self._guard(lambda: self.parts.batch.step(work.waiting), batch) or []
        self.trace.decoded(t0, n)
        return Decoded(tokens, self.parts.batch.verified)

    def _prefill(self, seq: Sequence) -> bool:
        """One chunk of the sequence's prefill; whether its plan is all in."""
        t0, pos = time.perf_counter(), seq.pos
        done = bool(self._guard(lambda: self.parts.prefiller.run(seq, self.scheduler.chunk_tokens), [seq]))
        self.trace.prefilled(seq, t0, seq.pos - pos)
        return done

    def _apply_decoded(self, decoded: Decoded) -> None:
        for v in decoded.verified:  # speculation: what each sequence's proposals gave
            self.seqs[v.seq_id].generation.usage.speculated(v.proposed, v.accepted)
            self.metrics.speculated(v.proposed, v.accepted)
        self._apply_tokens(decoded.tokens)

    def _guard(self, work: Callable[[], T], seqs: list[Sequence]) -> T | None:
        """Run one unit of MLX work; if it fails, fail the sequences it touched, not the server."""
        try:
            return work()
        except self.recorder.survivable as e:  # split over processes, none: the group fails (faults.py)
            log.exception("engine step failed for requests %s", [s.request.request_id for s in seqs])
            if any(s.status is Status.DECODING for s in seqs):
                self.parts.batch.reset()
            for seq in seqs:
                self._end(seq, "error", error=Failed(f"generation failed: {e}"))
            return None

    # -- scheduling -----------------------------------------------------------------------

    def _fits(self, seq: Sequence) -> bool:
        """Whether the sequence's working cache fits the memory left for running requests."""
        p = self.parts
        return self.scheduler.fits(self.seqs.values(), seq, p.bytes_per_token, p.working_budget, p.state_bytes)

    def _next_prefill(self) -> Sequence | None:
        """The sequence to prefill next: one already planned whose disk reads are done, else
        the first in the scheduler's order that is ready once planned."""
        seq = self.scheduler.ready_to_prefill(self.seqs.values())
        if seq is not None:
            return seq
        for seq in self.scheduler.planning_order(self.seqs.values(), time.perf_counter()):
            self.planner.plan(seq)
            self.recorder.planned(seq)
            if seq.ready():
                return seq
        return None

    # -- applying results -------------------------------------------------------------------

    def _apply_tokens(self, tokens: list[Token]) -> None:
        stopped: dict[int, Sequence] = {}
        for t in tokens:
            seq = self.seqs[t.seq_id]
            if seq.id in stopped:  # its run went on past a stop string: the rest is not output
                continue
            hit = seq.generation.take(t.token, t.finish, t.logprob)
            if self.metrics.took_token(seq.generation, seq.submitted):
                self.trace.first_token(seq)
            if hit and t.finish is None:
                stopped[seq.id] = seq  # a stop string: it leaves the batch below
            elif hit or t.finish is not None:
                self._end(seq, "stop" if hit else t.finish, t.cache, t.tokens)
        if stopped:
            taken = self.parts.batch.remove(list(stopped))
            for seq in stopped.values():
                self._end(seq, "stop", *taken[seq.id])

    def _prefill_done(self, seq: Sequence) -> None:
        """A prefilled sequence joins the decode batch (a follow-up ends: it only computed KV)."""
        if seq.prefill_only:
            self._end(seq, "follow-up", seq.cache, seq.prompt)
            return
        if seq.request.remember:  # offered for reuse now (commit.py `share_prompt`)
            self.parts.committer.share_prompt(seq)
        params = seq.request.params
        ids = self.recorder.sample_ids(seq, self._ids)
        for sample in [seq, *samples(seq, ids, self.parts.loaded)]:  # n > 1: all from one prefill
            self.seqs[sample.id] = sample
            sampler = self.recorder.sampler(sample.id, sample.generation.sampler)
            args = (sampler, sample.generation.processors, params.max_tokens, params.logprobs)
            self.parts.batch.add(sample.id, seq.prompt, seq.cache, *args, delta=seq.delta)
            sample.status = Status.DECODING
        seq.cache = None

    def _end(
        self,
        seq: Sequence,
        reason: str,
        cache: list | None = None,
        tokens: list[int] | None = None,
        error: Failed | None = None,
    ) -> None:
        """Every sequence ends here, once: release its pins, commit its KV (unless its request
        must not be remembered), report."""
        if seq.status is Status.FINISHED:
            return
        seq.status = Status.FINISHED
        self.seqs.pop(seq.id, None)
        self.recorder.ended(seq.id)
        if seq.lease is not None:  # first, so the blocks it read from disk can become hot
            self.store.release(seq.lease)
            seq.lease = None
        if cache is not None and tokens and seq.request.remember:
            follow_up = self.parts.committer.commit_turn(seq, reason, cache, tokens)
            if follow_up is not None:
                self._follow_up(seq, follow_up)
        if seq.snapshots:  # held since taken: its agent keeps them now, or nobody does
            self.store.let_go(seq.snapshots)
        self.trace.ended(seq, reason)
        if seq.prefill_only:  # a follow-up's sink drops it, a head's computing waits for it
            return seq.generation.output.finish(reason, seq.generation.usage)
        usage, output = seq.generation.usage, seq.generation.output
        self.metrics.ended(reason, usage.prompt_tokens, usage.completion_tokens)
        if error is not None:
            output.fail(error)
            return
        self.metrics.cached_tokens.labels("hot").inc(usage.hot_tokens)
        self.metrics.cached_tokens.labels("warm").inc(usage.warm_tokens)
        self.planner.report_miss(seq)
        output.finish(reason, usage)

    def _follow_up(self, seq: Sequence, tokens: list[int]) -> None:
        """Queue the KV of `tokens` for the sequence's agent as a prefill with no decoding: done
        at the engine's leisure (after clients' requests), rather than in the agent's next turn."""
        params, agent = SamplingParams(max_tokens=0, temperature=0.0), seq.agent
        request = replace(seq.request, prompt=tokens, params=params, agent=agent, grammar=None, prefill_only=True)
        follow_up = self._new_sequence(next(self._ids), request, lambda event: None, time.perf_counter())
        self.seqs[follow_up.id] = follow_up
        self.recorder.admitted(follow_up, self._ids)

    # -- work from other threads, run here --------------------------------------------------

    def admit(self, seq_id: int, request: GenerationRequest, sink: Sink, submitted: float) -> None:
        try:
            seq = self._new_sequence(seq_id, request, sink, submitted)
        except Exception as e:
            log.exception("could not admit request %s", request.request_id)
            sink(Failed(f"the request could not be started: {e}"))
            return
        if seq.prefill_only and self._settled_already(seq):
            return self._end(seq, "follow-up")
        self.metrics.prompt_tokens.inc(0 if request.prefill_only else len(request.prompt))  # a settle: none
        self.metrics.prompt_images.inc(len(request.vision.spans) if request.vision and not request.prefill_only else 0)
        for queued in self.scheduler.superseded(self.seqs.values(), seq) if request.remember else ():
            self._end(queued, "superseded")
        self.seqs[seq_id] = seq
        self.recorder.admitted(seq, self._ids)
        if seq.discovery is not None:  # the shared warm tier's answer: adopt it, then plan the request
            seq.discovery.add_done_callback(lambda _: self._post(self.store.sync.apply))

    def _new_sequence(self, seq_id: int, request: GenerationRequest, sink: Sink, submitted: float) -> Sequence:
        p = self.parts
        return new_sequence(seq_id, request, sink, submitted, p.loaded, p.layers, p.precisions.working, self.store)

    def cancel(self, seq_id: int) -> None:
        for seq in [s for s in list(self.seqs.values()) if seq_id in (s.id, s.parent)]:  # and its samples
            if seq.discovery is not None:  # its question to the shared tier, if not asked yet, is not
                self.store.sync.drop(seq.discovery)
            if seq.status is Status.DECODING:
                self._end(seq, "cancelled", *self.parts.batch.remove([seq.id])[seq.id])
            else:  # waiting or prefilling: keep what was computed
                self._end(seq, "cancelled", seq.cache, seq.prompt[: seq.pos])

    def _settled_already(self, seq: Sequence) -> bool:
        """A turn's settle with nothing to do: its agent was deleted meanwhile (it must not come
        back), or holds every token already (a reply re-tokenized as it was fed) on a model with
        no state layers to snapshot at its end. A head's prefill makes its record."""
        if seq.agent is None or seq.agent.kind == HEAD:
            return False
        if seq.agent not in self.store.agents:
            return True
        return seq.new_tokens == 0 and not self.parts.layers.has_state

    def end_agent(self, agent: AgentKey) -> bool | Future:
        for seq in [s for s in self.seqs.values() if s.agent == agent]:
            if seq.prefill_only:  # a settle or follow-up for it alone: nothing to keep, no work
                self._end(seq, "superseded")
            else:  # its turn ends as nobody's
                seq.agent = seq.generation.usage.agent = None
        return self.store.end_agent(agent)

    def shutdown(self, error: Failed = Failed("the server is shutting down", 503, "shutting_down")) -> None:
        for seq in list(self.seqs.values()):
            self._end(seq, "shutdown", error=error)

"""BatchEngine: the one thread that touches MLX.

Each request is prefilled alone, in chunks, from its plan: cached blocks are appended as KV,
gaps and the new suffix are computed. Between chunks every running sequence decodes one token
together in mlx-lm's GenerationBatch, so a long prompt never freezes the others; a request
joins the batch when its prefill ends and leaves the moment it finishes or its client goes.
A finished sequence's KV (prompt and reply) is committed to the AgentCacheStore.
"""

from __future__ import annotations

import itertools
import logging
import queue
import threading
import time
from collections import deque
from collections.abc import Callable
from concurrent.futures import Future
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import agent_memory.blas  # noqa: F401
import mlx.core as mx
from mlx_lm.generate import GenerationBatch, StopSequences
from mlx_lm.models.cache import BatchKVCache
from mlx_lm.sample_utils import greedy_sampler, make_logits_processors

from agent_memory.engine import kv
from agent_memory.engine.detokenizer import Detokenizer
from agent_memory.engine.loader import LoadedModel, load_model
from agent_memory.engine.quantized import BatchQuantizedKVCache
from agent_memory.engine.requests import (
    Failed,
    Finished,
    GenerationRequest,
    Sink,
    TextDelta,
    Usage,
)
from agent_memory.engine.sampling import make_sampler
from agent_memory.engine.stops import StopMatcher
from agent_memory.memory.blocks import Tier
from agent_memory.memory.disk import DiskLayout, DiskTier
from agent_memory.memory.store import AgentCacheStore, Lease, Segment
from agent_memory.metrics import Metrics

log = logging.getLogger(__name__)

BLOCK_TOKENS = 64
# Tokens prefilled per step while others decode (their inter-token delay) and when alone.
PREFILL_CHUNK_SHARED = 256
PREFILL_CHUNK_ALONE = 2048
# A request waiting this long to start its prefill goes first, however long its prompt.
PREFILL_PATIENCE_S = 20.0


@dataclass
class EngineConfig:
    model_path: Path
    max_batch: int = 32
    hot_budget_bytes: int = 2 << 30
    precision: kv.KVPrecision = kv.KVPrecision()
    cache_dir: Path | None = None  # None or a zero disk budget: no warm tier
    disk_budget_bytes: int = 0
    disk_precision: kv.KVPrecision | None = None  # None: the same as `precision`
    # False: a running sequence attends to full-precision KV (its cached prefix dequantized
    # once, its own new tokens never quantized) and only blocks at rest are quantized.
    # True: it attends to quantized KV too (least memory; +10 % perplexity at Q4, slower on CPU).
    decode_quantized: bool = False


@dataclass(eq=False)
class Sequence:
    id: int
    request: GenerationRequest
    sink: Sink
    lease: Lease | None  # what the store lent it; None until its turn to prefill comes
    plan: deque[Segment]  # what is left to put into `cache` before decoding starts
    cache: list | None
    reads: dict[str, Future]  # block hash -> its tensors, being read from disk
    detokenizer: Detokenizer
    stops: StopMatcher
    sampler: Any
    processors: list  # mlx-lm logits processors (logit_bias)
    usage: Usage
    submitted: float  # perf_counter() when the request arrived
    pos: int = 0  # prompt tokens in `cache`
    new_tokens: int = 0  # prompt tokens its agent's last turn does not cover: a guess at the work
    # Runs of `cache` that came from cached blocks, as those blocks' stored payloads: a commit
    # reuses them rather than quantizing dequantized KV again (which is not exact).
    stored: list[kv.StoredRun] = field(default_factory=list)

    def ready(self) -> bool:
        return all(f.done() for f in self.reads.values())

    def emit_text(self, text: str, final: bool = False) -> bool:
        """Pass decoded text through the stop matcher; True when a stop string was reached."""
        safe, hit = self.stops.feed(text)
        if not hit and final:
            safe += self.stops.flush()
        if safe:
            self.sink(TextDelta(safe))
        return hit


class BatchEngine:
    def __init__(self, config: EngineConfig) -> None:
        self.config = config
        self.ready = threading.Event()
        self.load_error: str | None = None
        self.loaded: LoadedModel | None = None
        self.store: AgentCacheStore | None = None
        self.disk: DiskTier | None = None
        self._inbox: queue.SimpleQueue[Callable[[], None] | None] = queue.SimpleQueue()
        self._ids = itertools.count()
        self._thread = threading.Thread(target=self._run, name="engine", daemon=True)
        self._seqs: dict[int, Sequence] = {}
        self._prefilling: deque[Sequence] = deque()
        self._batch: GenerationBatch | None = None
        self.metrics = Metrics()

    # -- called from other threads ------------------------------------------------------

    def start(self) -> None:
        self._thread.start()

    def submit(self, request: GenerationRequest, sink: Sink) -> int:
        seq_id = next(self._ids)
        submitted = time.perf_counter()
        self._inbox.put(lambda: self._admit(seq_id, request, sink, submitted))
        return seq_id

    @property
    def waiting(self) -> int:
        """Sequences admitted but not yet decoding (read from any thread)."""
        return len(self._prefilling)

    @property
    def decoding(self) -> int:
        return self._decoding

    def cancel(self, seq_id: int) -> None:
        self._inbox.put(lambda: self._cancel(seq_id))

    def call(self, fn: Callable[[], Any]) -> Future:
        """Run fn on the engine thread (anything that frees or makes MLX arrays)."""
        future: Future = Future()

        def run() -> None:
            try:
                future.set_result(fn())
            except Exception as e:  # handed to the caller
                future.set_exception(e)

        self._inbox.put(run)
        return future

    def stop(self) -> None:
        self._inbox.put(None)
        self._thread.join()

    # -- the engine thread --------------------------------------------------------------

    def _run(self) -> None:
        try:
            self._load()
        except Exception as e:
            log.exception("could not load %s", self.config.model_path)
            self.load_error = str(e)
            self.ready.set()
            return
        self.ready.set()
        while self._drain(block=not (self._decoding or self._next_prefill())):
            if self._decoding:
                self._step(self._decode, list(self._batch_seqs()))
            seq = self._next_prefill()
            if seq is not None and self._decoding < self.config.max_batch:
                self._step(lambda: self._prefill(seq), [seq])
        self._shutdown()

    def _load(self) -> None:
        self.loaded = load_model(self.config.model_path)
        self.kv_shape = kv.probe_shape(self.loaded.model, self.loaded.num_layers)
        self.disk = self._open_disk()
        self.store = AgentCacheStore(
            block_tokens=BLOCK_TOKENS,
            salt=self.loaded.fingerprint,
            hot_budget_bytes=self.config.hot_budget_bytes,
            attention_tokens=self.loaded.attention_tokens,
            disk=self.disk,
            disk_budget_bytes=self.config.disk_budget_bytes,
        )
        self.metrics.watch(self)
        if self.disk is not None:
            scan = self.disk.open()
            self.store.restore(scan)
            log.info(
                "warm tier %s: %d agents, %d block files (%.1f MiB)",
                self.disk.layout.root,
                len(self.store.agents),
                len(scan.files),
                self.store.pool.disk_bytes / (1 << 20),
            )
        self._eos = StopSequences([(t,) for t in self.loaded.tokenizer.eos_token_ids])
        self._batch = GenerationBatch.empty(self.loaded.model, greedy_sampler)
        log.info(
            "loaded %s: %d layers, context %d; KV cached as %s, attended as %s",
            self.loaded.name,
            self.loaded.num_layers,
            self.loaded.context_length,
            self.config.precision.tag,
            self._working_precision.tag,
        )

    @property
    def _working_precision(self) -> kv.KVPrecision:
        """The precision of running sequences' caches: what decoding attends to."""
        return self.config.precision if self.config.decode_quantized else kv.KVPrecision()

    @property
    def _disk_precision(self) -> kv.KVPrecision:
        return self.config.disk_precision or self.config.precision

    def _open_disk(self) -> DiskTier | None:
        cfg = self.config
        if cfg.cache_dir is None or cfg.disk_budget_bytes <= 0:
            return None
        precision, shape = self._disk_precision, self.kv_shape
        folder = DiskLayout.folder_name(self.loaded.name, self.loaded.fingerprint, precision.tag)
        same_model = folder.rsplit("-", 1)[0] + "-*"
        others = sorted(p.name for p in (cfg.cache_dir / "kv").glob(same_model) if p.name != folder)
        if others:
            log.warning(
                "this model's KV is also cached at other precisions (%s); they are not used at %s: "
                "serve with their --disk-kv-bits to use them, or remove them with `agent-memory cache`",
                ", ".join(others),
                precision.tag,
            )
        return DiskTier(
            DiskLayout(cfg.cache_dir / "kv" / folder),
            fingerprint=self.loaded.fingerprint,
            meta=precision.file_meta(),
            name=self.loaded.name,
            block_tokens=BLOCK_TOKENS,
            block_layout=lambda n: kv.block_layout(n, shape, precision),
            encode=lambda payload: kv.to_numpy(kv.convert(payload, cfg.precision, precision)),
        )

    @property
    def _decoding(self) -> int:
        return len(self._batch) if self._batch is not None else 0

    def _batch_seqs(self):
        return (self._seqs[uid] for uid in self._batch.uids)

    def _drain(self, block: bool) -> bool:
        """Run queued calls; False once stop was asked."""
        try:
            item = self._inbox.get(block=block)
        except queue.Empty:
            return True
        while True:
            if item is None:
                return False
            try:
                item()
            except Exception:  # one bad piece of work must not stop the engine
                log.exception("engine call failed")
            try:
                item = self._inbox.get_nowait()
            except queue.Empty:
                return True

    def _step(self, work: Callable[[], None], seqs: list[Sequence]) -> None:
        """Run one unit of MLX work; if it fails, fail the sequences it touched, not the server."""
        try:
            work()
        except Exception as e:
            log.exception("engine step failed for requests %s", [s.request.request_id for s in seqs])
            for seq in seqs:
                self._drop(seq)
                self.metrics.finished.labels("error").inc()
                seq.sink(Failed(f"generation failed: {e}"))
            if any(s.cache is None for s in seqs):
                self._batch = GenerationBatch.empty(self.loaded.model, greedy_sampler)

    def _admit(self, seq_id: int, request: GenerationRequest, sink: Sink, submitted: float) -> None:
        try:
            self._enqueue(seq_id, request, sink, submitted)
        except Exception as e:
            log.exception("could not admit request %s", request.request_id)
            self._seqs.pop(seq_id, None)
            sink(Failed(f"the request could not be started: {e}"))

    def _enqueue(self, seq_id: int, request: GenerationRequest, sink: Sink, submitted: float) -> None:
        prompt = request.prompt
        params = request.params
        seq = Sequence(
            id=seq_id,
            request=request,
            sink=sink,
            lease=None,
            plan=deque(),
            cache=kv.new_cache(self.loaded.num_layers, self._working_precision),
            reads={},
            detokenizer=Detokenizer(self.loaded.decoder),
            stops=StopMatcher(params.stop),
            sampler=make_sampler(params.temperature, params.top_p, params.seed),
            processors=make_logits_processors(params.logit_bias) if params.logit_bias else [],
            usage=Usage(prompt_tokens=len(prompt)),
            submitted=submitted,
        )
        seq.new_tokens = len(prompt) - self.store.known_prefix(request.agent, prompt)
        self.metrics.prompt_tokens.inc(len(prompt))
        self._seqs[seq_id] = seq
        self._prefilling.append(seq)

    def _plan(self, seq: Sequence) -> None:
        """Look the prompt up when the sequence's turn to prefill comes rather than on arrival:
        agents that arrive together then reuse the shared prefix the first of them computed."""
        prompt = seq.request.prompt
        seq.lease = self.store.lookup(prompt[:-1])
        seq.plan = deque(seq.lease.segments)
        if seq.lease.end < len(prompt) - 1:
            seq.plan.append(Segment(seq.lease.end, len(prompt) - 1, None))
        for segment in seq.lease.segments:
            if segment.block is not None and segment.block.tier is Tier.WARM:
                future = self.disk.read_block(segment.block)
                future.add_done_callback(lambda _: self._inbox.put(lambda: None))  # wake the loop
                seq.reads[segment.block.hash] = future

    def _next_prefill(self) -> Sequence | None:
        """The sequence to prefill next: one already planned whose disk reads are done, else
        the waiting one with the least new work, so that a returning agent's short turn does
        not wait behind a newcomer's long prompt (unless that one has waited too long)."""
        for seq in self._prefilling:
            if seq.lease is not None and seq.ready():
                return seq
        now = time.perf_counter()
        waiting = [s for s in self._prefilling if s.lease is None]
        waiting.sort(key=lambda s: (now - s.submitted < PREFILL_PATIENCE_S, s.new_tokens))
        for seq in waiting:
            self._plan(seq)
            if seq.ready():
                return seq
        return None

    def _prefill(self, seq: Sequence) -> None:
        budget = PREFILL_CHUNK_SHARED if self._decoding else PREFILL_CHUNK_ALONE
        while seq.plan and budget > 0:
            if seq.plan[0].block is not None:
                self._append_cached(seq)
                continue
            segment = seq.plan[0]
            n = min(budget, segment.end - seq.pos)
            tokens = mx.array(seq.request.prompt[seq.pos : seq.pos + n])[None]
            self.loaded.model(tokens, cache=seq.cache)
            mx.eval([c.state for c in seq.cache])
            seq.pos += n
            budget -= n
            if seq.pos == segment.end:
                seq.plan.popleft()
        if not seq.plan:
            self._prefilling.remove(seq)
            self._share_prompt(seq)
            self._start_decoding(seq)

    def _share_prompt(self, seq: Sequence) -> None:
        """Offer the prompt's new whole blocks for reuse now, not when the request ends, so
        that requests arriving while this one decodes skip the prefix they share with it."""
        whole = (len(seq.request.prompt) - 1) // BLOCK_TOKENS * BLOCK_TOKENS
        if whole > seq.lease.end:
            self._commit(seq, None, seq.cache, seq.request.prompt[:whole])

    def _append_cached(self, seq: Sequence) -> None:
        """Append the run of cached blocks at the head of the plan to the sequence's cache.
        A block whose file cannot be read becomes a gap to recompute."""
        parts = []
        while seq.plan and seq.plan[0].block is not None:
            segment = seq.plan.popleft()
            n = segment.end - segment.start
            block = segment.block
            read = seq.reads.pop(block.hash, None)
            if read is None:
                stored = block.payload
                seq.usage.hot_tokens += n
            elif read.exception() is None:
                stored = kv.convert(kv.from_numpy(read.result(), self.kv_shape), self._disk_precision, self.config.precision)
                seq.usage.warm_tokens += n
            else:
                log.info("block %s unreadable (%s): recomputing it", block.hash[:12], read.exception())
                self.store.disk_lost(block)
                seq.plan.appendleft(Segment(segment.start, segment.end, None))
                break
            parts.append((stored, n))
            seq.stored.append(kv.StoredRun(seq.pos, seq.pos + n, stored))
            seq.pos += n
        kv.append(seq.cache, parts, self.config.precision, self._working_precision)

    def _start_decoding(self, seq: Sequence) -> None:
        prompt = seq.request.prompt
        merge = BatchQuantizedKVCache.merge if self._working_precision.quantized else BatchKVCache.merge
        joining = GenerationBatch(
            self.loaded.model,
            [seq.id],
            mx.array(prompt[-1:]),
            [merge([c]) for c in seq.cache],
            [list(prompt[:-1])],
            [seq.sampler],
            greedy_sampler,
            [seq.processors],
            [self._eos],
            [seq.request.params.max_tokens],
        )
        seq.cache = None
        self._batch.extend(joining)

    def _decode(self) -> None:
        stopped = []
        self.metrics.batch_size.observe(len(self._batch))
        for r in self._batch.next():
            seq = self._seqs[r.uid]
            seq.usage.completion_tokens += 1
            self.metrics.generated_tokens.inc()
            if seq.usage.completion_tokens == 1:
                self.metrics.ttft.observe(time.perf_counter() - seq.submitted)
            # finish_reason "stop" here means an end-of-sequence token: not part of the text.
            text = seq.detokenizer.add(r.token) if r.finish_reason != "stop" else ""
            if r.finish_reason is not None:
                text += seq.detokenizer.flush()
            if seq.emit_text(text, final=r.finish_reason is not None):
                if r.finish_reason is None:
                    stopped.append(seq)
                    continue
                self._finish(seq, "stop", r.prompt_cache, r.all_tokens)
            elif r.finish_reason is not None:
                self._finish(seq, r.finish_reason, r.prompt_cache, r.all_tokens)
        if stopped:
            self._leave_batch(stopped, "stop")

    def _leave_batch(self, seqs: list[Sequence], reason: str) -> None:
        uids = self._batch.uids
        index = {s.id: uids.index(s.id) for s in seqs}
        taken = {s.id: (self._batch.extract_cache(i), list(self._batch.tokens[i])) for s, i in zip(seqs, index.values())}
        self._batch.filter([i for i in range(len(uids)) if i not in index.values()])
        for seq in seqs:
            self._finish(seq, reason, *taken[seq.id])

    def _finish(self, seq: Sequence, reason: str, cache: list, tokens: list[int]) -> None:
        self._release(seq)  # first, so the blocks it read from disk can become hot
        self._commit(seq, seq.request.agent, cache, tokens)
        self._drop(seq)
        self.metrics.finished.labels(reason).inc()
        self.metrics.cached_tokens.labels("hot").inc(seq.usage.hot_tokens)
        self.metrics.cached_tokens.labels("warm").inc(seq.usage.warm_tokens)
        seq.sink(Finished(reason, seq.usage))

    def _commit(self, seq: Sequence, agent: str | None, cache: list, tokens: list[int]) -> None:
        """Hand the sequence's KV to the store, block by block; a failure costs only reuse."""
        if not tokens:
            return
        payloads = []

        def cut(start: int, end: int):
            payload = kv.cut_at(cache, start, end, seq.stored, self._working_precision, self.config.precision)
            payloads.append(payload)
            return payload, kv.payload_nbytes(payload)

        try:
            self.store.commit(agent, tokens, cut)
            mx.eval(payloads)
        except Exception:
            log.exception("could not cache the KV of request %d", seq.id)

    def _release(self, seq: Sequence) -> None:
        if seq.lease is not None:
            self.store.release(seq.lease)

    def _drop(self, seq: Sequence) -> None:
        self._release(seq)
        self._seqs.pop(seq.id, None)
        if seq in self._prefilling:
            self._prefilling.remove(seq)

    def _cancel(self, seq_id: int) -> None:
        seq = self._seqs.get(seq_id)
        if seq is None:
            return
        if seq.cache is not None:  # still prefilling: keep what was computed
            self._release(seq)
            self._commit(seq, seq.request.agent, seq.cache, seq.request.prompt[: seq.pos])
            self._drop(seq)
            self.metrics.finished.labels("cancelled").inc()
            seq.sink(Finished("cancelled", seq.usage))
        else:
            self._leave_batch([seq], "cancelled")

    def _shutdown(self) -> None:
        for seq in list(self._seqs.values()):
            self._drop(seq)
            seq.sink(Failed("the server is shutting down", 503, "shutting_down"))
        if self.disk is not None:
            log.info("flushing the warm tier")
            self.disk.close()
        # MLX's per-thread streams must be cleared by the thread that used them, or the
        # process can abort at exit (ml-explore/mlx#4327).
        mx.synchronize()
        mx.clear_streams()

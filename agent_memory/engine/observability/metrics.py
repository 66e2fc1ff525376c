"""Prometheus metrics: what operators watch — requests and their latency, the memory this
server exists for (bytes against budgets, blocks by tier, what cooled or left and why, disk
loads), the process — and what tests observe instead of timing.

One vocabulary for tiers everywhere: hot (memory; exact as computed, or quantized once
cooled), warm (block files on disk; the warm tier's bytes are every block file, hot blocks'
copies included), cold (tokens only, recomputed on demand). docs/grafana.json draws them.
"""

from __future__ import annotations

import time
from collections.abc import Callable

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily

from agent_memory.cache_miss import NONE, REASONS, Miss

SECONDS = (0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60)
TOKENS = (16, 64, 256, 1024, 2048, 4096, 8192, 16384, 32768)


class BlockMoves:
    """The store's count of blocks that cooled or left, as one counter family at scrape time
    (none while the model is not loaded)."""

    def __init__(self, store: Callable[[], object | None]) -> None:
        self.store = store

    def describe(self):
        return []

    def collect(self):
        family = CounterMetricFamily(
            "agent_memory_block_moves",
            "KV blocks that cooled (hot_exact -> hot_quantized) or left a tier, by reason",
            labels=["from_tier", "to_tier", "reason"],
        )
        if (store := self.store()) is not None:
            with store.lock:
                moves = dict(store.moves)
            for (src, dst, reason), n in sorted(moves.items()):
                family.add_metric([src, dst, reason], n)
        yield family


class BlockCounts:
    """KV blocks by tier, counted in one walk of the pool per scrape (under the store's lock,
    which the engine also takes: one walk, not one per tier)."""

    def __init__(self, store: Callable[[], object | None]) -> None:
        self.store = store

    def describe(self):
        return []

    def collect(self):
        family = GaugeMetricFamily("agent_memory_blocks", "KV blocks, by tier", labels=["tier"])
        store = self.store()
        totals = store.totals() if store is not None else {}
        for tier in ("hot", "warm", "cold"):
            family.add_metric([tier], totals.get(f"{tier}_blocks", 0))
        yield family


class VisionFeatures:
    """A vision model's kept image features (vision/tower.py `Features`): images found kept or
    computed, tower passes, bytes against the budget; nothing for a text model."""

    def __init__(self, features: Callable[[], object | None]) -> None:
        self.features = features

    def describe(self):
        return []

    def collect(self):
        if (f := self.features()) is None:
            return
        images = CounterMetricFamily(
            "agent_memory_vision_images",
            "Images in prefilled prompts, by where their features came from",
            labels=["source"],
        )
        images.add_metric(["kept"], f.kept_images)
        images.add_metric(["tower"], f.computed_images)
        yield images
        yield CounterMetricFamily(
            "agent_memory_vision_tower_runs", "Vision tower passes (one per prompt)", value=f.tower_runs
        )
        kept = GaugeMetricFamily(
            "agent_memory_vision_feature_bytes", "Recent images' features kept, and the budget", labels=["of"]
        )
        kept.add_metric(["kept"], f.nbytes)
        kept.add_metric(["budget"], f.budget_bytes)
        yield kept


class Metrics:
    def __init__(self) -> None:
        r = self.registry = CollectorRegistry()
        self._store = None  # the loaded model's store; None while it is not loaded
        self._count: Callable[[str], int] = lambda state: 0
        self._warm_on = False
        self._features = None  # a vision model's kept image features
        self.finished = Counter("agent_memory_requests_finished", "Requests ended, by reason", ["reason"], registry=r)
        self.prompt_tokens = Counter("agent_memory_prompt_tokens", "Prompt tokens received", registry=r)
        # however many turns ago each was sent, whether its KV was reused or computed (the dashboard's)
        self.prompt_images = Counter("agent_memory_prompt_images", "Images in prompts received", registry=r)
        self.cached_tokens = Counter(
            "agent_memory_cached_tokens", "Prompt tokens whose KV was reused, by tier", ["tier"], registry=r
        )
        self.generated_tokens = Counter("agent_memory_generated_tokens", "Tokens generated", registry=r)
        self.ttft = Histogram(
            "agent_memory_time_to_first_token_seconds", "From request to its first token", buckets=SECONDS, registry=r
        )
        self.queue_time = Histogram(
            "agent_memory_queue_time_seconds", "From request to the start of its prefill", buckets=SECONDS, registry=r
        )
        self.inter_token = Histogram(
            "agent_memory_inter_token_latency_seconds",
            "Between two tokens of one request",
            buckets=(0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5),
            registry=r,
        )
        self.prompt_length = Histogram(
            "agent_memory_prompt_length_tokens", "Prompt tokens per request", buckets=TOKENS, registry=r
        )
        self.generation_length = Histogram(
            "agent_memory_generation_length_tokens", "Tokens generated per request", buckets=TOKENS, registry=r
        )
        self.batch_size = Histogram(
            "agent_memory_decode_batch_size",
            "Sequences decoded together per step",
            buckets=(1, 2, 4, 8, 16, 32, 64),
            registry=r,
        )
        self.proposed_tokens = Counter(
            "agent_memory_speculation_proposed_tokens",
            "Tokens proposed for verification (speculative decoding)",
            registry=r,
        )
        self.accepted_tokens = Counter(
            "agent_memory_speculation_accepted_tokens",
            "Proposed tokens the model accepted: each a decode step its sequence saved",
            registry=r,
        )
        self.accepted_per_step = Histogram(
            "agent_memory_speculation_accepted_per_step",
            "Proposed tokens accepted per sequence in a step that verified proposals",
            buckets=(0, 1, 2, 4, 8, 16),
            registry=r,
        )
        self.disk_loads = Histogram(
            "agent_memory_disk_load_seconds",
            "Reading one warm block back (file read and checks), by outcome",
            ["outcome"],
            buckets=(0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 1),
            registry=r,
        )
        for outcome in ("ok", "refused"):  # exported from the start, at zero
            self.disk_loads.labels(outcome)
        self.cache_misses = Counter(
            "agent_memory_cache_misses",
            "Requests whose prompt was not reused further, by why (docs/usage.md, 'Why a request missed')",
            ["reason"],
            registry=r,
        )
        self.cache_miss_tokens = Counter(
            "agent_memory_cache_miss_lost_tokens",
            "Prompt tokens the memory held but a request did not reuse, by why",
            ["reason"],
            registry=r,
        )
        for reason in [r for r in REASONS if r != NONE]:  # exported from the start, at zero; NONE is no miss
            self.cache_misses.labels(reason)
            self.cache_miss_tokens.labels(reason)
        self.sequences = Gauge("agent_memory_sequences", "Sequences in the engine, by state", ["state"], registry=r)
        self.cache_bytes = Gauge("agent_memory_cache_bytes", "Bytes of cached KV, by tier", ["tier"], registry=r)
        self.budget_bytes = Gauge(
            "agent_memory_cache_budget_bytes", "The budget of a tier, in bytes", ["tier"], registry=r
        )
        self.agents = Gauge("agent_memory_agents", "Agents with cached KV (every tenant's)", registry=r)
        self.stored_responses = Gauge(
            "agent_memory_stored_responses", "Stored Responses-API responses with cached KV", registry=r
        )

        self.loaded = Gauge("agent_memory_model_loaded", "1 while the model's weights are loaded", registry=r)
        self.loads = Counter("agent_memory_model_loads", "Times the model was loaded", registry=r)
        self.unloads = Counter("agent_memory_model_unloads", "Times the model was unloaded to make room", registry=r)
        self._read_at_scrape()
        r.register(BlockMoves(lambda: self._store))
        r.register(BlockCounts(lambda: self._store))
        r.register(VisionFeatures(lambda: self._features))

    def took_token(self, generation, submitted: float) -> bool:
        """A generated token counted and timed (time to first token, or since the previous one);
        whether it was the sequence's first."""
        now = time.perf_counter()
        self.generated_tokens.inc()
        first = generation.usage.completion_tokens == 1
        if first:
            self.ttft.observe(now - submitted)
        else:
            self.inter_token.observe(now - generation.last_token)
        generation.last_token = now
        return first

    def ended(self, reason: str, prompt_tokens: int, completion_tokens: int) -> None:
        """A sequence that ended (not a settle or follow-up): why, and its lengths."""
        self.finished.labels(reason).inc()
        self.prompt_length.observe(prompt_tokens)
        self.generation_length.observe(completion_tokens)

    def speculated(self, proposed: int, accepted: int) -> None:
        """One sequence's proposals in one speculative step."""
        self.proposed_tokens.inc(proposed)
        self.accepted_tokens.inc(accepted)
        self.accepted_per_step.observe(accepted)

    def missed(self, miss: Miss) -> None:
        """A finished request's miss (cache_miss.py); NONE is not one."""
        if miss.reason != NONE:
            self.cache_misses.labels(miss.reason).inc()
            self.cache_miss_tokens.labels(miss.reason).inc(miss.lost)

    def watch(self, store, count: Callable[[str], int], warm_on: bool, features=None) -> None:
        """Read the engine's and the store's state at scrape time rather than tracking every
        change, from the model's store (built at its first load, kept through unloads). `count`:
        sequences in a state; the loads are counted by loading/weights.py; `features`: a vision
        model's kept image features (None: a text model)."""
        self._store, self._count, self._warm_on, self._features = store, count, warm_on, features

    def _read_at_scrape(self) -> None:
        def of_store(read: Callable[[object], int]) -> Callable[[], int]:
            return lambda: read(self._store) if self._store is not None else 0

        for state in ("waiting", "prefilling", "decoding"):
            self.sequences.labels(state).set_function(lambda state=state: self._count(state))
        self.cache_bytes.labels("hot_exact").set_function(of_store(lambda s: s.pool.exact_bytes))
        self.cache_bytes.labels("hot_quantized").set_function(
            of_store(lambda s: s.pool.hot_bytes - s.pool.exact_bytes - s.pool.snapshot_bytes)
        )
        self.cache_bytes.labels("hot_snapshots").set_function(of_store(lambda s: s.pool.snapshot_bytes))
        self.cache_bytes.labels("warm").set_function(of_store(lambda s: s.pool.disk_bytes))
        self.budget_bytes.labels("hot").set_function(of_store(lambda s: s.hot_budget_bytes))
        self.budget_bytes.labels("warm").set_function(of_store(lambda s: s.disk_budget_bytes if self._warm_on else 0))
        self.agents.set_function(of_store(lambda s: s.counts()["agents"]))
        self.stored_responses.set_function(of_store(lambda s: s.counts()["stored_responses"]))

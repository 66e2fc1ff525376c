"""Prometheus metrics: what operators watch — requests and their latency, the memory this
server exists for (bytes against budgets, blocks by tier, what cooled or left and why, disk
loads), the process — and what tests observe instead of timing.

One vocabulary for tiers everywhere: hot (memory; exact as computed, or quantized once
cooled), warm (block files on disk; the warm tier's bytes are every block file, hot blocks'
copies included), cold (tokens only, recomputed on demand). docs/grafana.json draws them.
"""

from __future__ import annotations

from collections.abc import Callable

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, ProcessCollector
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily

SECONDS = (0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60)
TOKENS = (16, 64, 256, 1024, 2048, 4096, 8192, 16384, 32768)


class BlockMoves:
    """The store's count of blocks that cooled or left, as one counter family at scrape time."""

    def __init__(self, store) -> None:
        self.store = store

    def describe(self):
        return []

    def collect(self):
        family = CounterMetricFamily(
            "agent_memory_block_moves",
            "KV blocks that cooled (hot_exact -> hot_quantized) or left a tier, by reason",
            labels=["from_tier", "to_tier", "reason"],
        )
        with self.store.lock:
            moves = dict(self.store.moves)
        for (src, dst, reason), n in sorted(moves.items()):
            family.add_metric([src, dst, reason], n)
        yield family


class BlockCounts:
    """KV blocks by tier, counted in one walk of the pool per scrape (under the store's lock,
    which the engine also takes: one walk, not one per tier)."""

    def __init__(self, store) -> None:
        self.store = store

    def describe(self):
        return []

    def collect(self):
        family = GaugeMetricFamily("agent_memory_blocks", "KV blocks, by tier", labels=["tier"])
        totals = self.store.totals()
        for tier in ("hot", "warm", "cold"):
            family.add_metric([tier], totals[f"{tier}_blocks"])
        yield family


class Metrics:
    def __init__(self) -> None:
        r = self.registry = CollectorRegistry()
        ProcessCollector(registry=r)  # process_resident_memory_bytes and friends
        self.finished = Counter("agent_memory_requests_finished", "Requests ended, by reason", ["reason"], registry=r)
        self.prompt_tokens = Counter("agent_memory_prompt_tokens", "Prompt tokens received", registry=r)
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
        self.sequences = Gauge("agent_memory_sequences", "Sequences in the engine, by state", ["state"], registry=r)
        self.cache_bytes = Gauge("agent_memory_cache_bytes", "Bytes of cached KV, by tier", ["tier"], registry=r)
        self.budget_bytes = Gauge(
            "agent_memory_cache_budget_bytes", "The budget of a tier, in bytes", ["tier"], registry=r
        )
        self.agents = Gauge("agent_memory_agents", "Agents with cached KV (every tenant's)", registry=r)
        self.stored_responses = Gauge(
            "agent_memory_stored_responses", "Stored Responses-API responses with cached KV", registry=r
        )

    def watch(self, store, count: Callable[[str], int], warm_on: bool) -> None:
        """Read the engine's and the store's state at scrape time rather than tracking every
        change. `count`: sequences in a state."""
        pool = store.pool
        for state in ("waiting", "prefilling", "decoding"):
            self.sequences.labels(state).set_function(lambda state=state: count(state))
        self.cache_bytes.labels("hot_exact").set_function(lambda: pool.exact_bytes)
        self.cache_bytes.labels("hot_quantized").set_function(
            lambda: pool.hot_bytes - pool.exact_bytes - pool.snapshot_bytes
        )
        self.cache_bytes.labels("hot_snapshots").set_function(lambda: pool.snapshot_bytes)
        self.cache_bytes.labels("warm").set_function(lambda: pool.disk_bytes)
        self.budget_bytes.labels("hot").set_function(lambda: store.hot_budget_bytes)
        self.budget_bytes.labels("warm").set_function(lambda: store.disk_budget_bytes if warm_on else 0)
        self.agents.set_function(lambda: store.counts()["agents"])
        self.stored_responses.set_function(lambda: store.counts()["stored_responses"])
        self.registry.register(BlockMoves(store))
        self.registry.register(BlockCounts(store))

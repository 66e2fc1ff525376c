"""Prometheus metrics: what operators watch (throughput, cache hits, memory) and what tests
observe instead of timing (cancellations, batch sizes)."""

from __future__ import annotations

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram


class Metrics:
    def __init__(self) -> None:
        r = self.registry = CollectorRegistry()
        self.finished = Counter(
            "agent_memory_requests_finished", "Requests ended, by reason", ["reason"], registry=r
        )
        self.prompt_tokens = Counter("agent_memory_prompt_tokens", "Prompt tokens received", registry=r)
        self.cached_tokens = Counter(
            "agent_memory_cached_tokens", "Prompt tokens whose KV was reused, by tier", ["tier"], registry=r
        )
        self.generated_tokens = Counter("agent_memory_generated_tokens", "Tokens generated", registry=r)
        self.ttft = Histogram(
            "agent_memory_time_to_first_token_seconds",
            "From request to its first token",
            buckets=(0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60),
            registry=r,
        )
        self.batch_size = Histogram(
            "agent_memory_decode_batch_size",
            "Sequences decoded together per step",
            buckets=(1, 2, 4, 8, 16, 32, 64),
            registry=r,
        )
        self.sequences = Gauge("agent_memory_sequences", "Sequences in the engine, by state", ["state"], registry=r)
        self.cache_bytes = Gauge("agent_memory_cache_bytes", "Bytes of cached KV, by tier", ["tier"], registry=r)
        self.agents = Gauge("agent_memory_agents", "Agents with cached KV", registry=r)

    def watch(self, engine) -> None:
        """Read engine and store state at scrape time rather than tracking every change."""
        self.sequences.labels("prefilling").set_function(lambda: engine.waiting)
        self.sequences.labels("decoding").set_function(lambda: engine.decoding)
        self.cache_bytes.labels("hot").set_function(lambda: engine.store.pool.hot_bytes)
        self.cache_bytes.labels("disk").set_function(lambda: engine.store.pool.disk_bytes)
        self.agents.set_function(lambda: len(engine.store.agents))

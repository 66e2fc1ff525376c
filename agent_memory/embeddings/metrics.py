"""What an embedding model exports at /metrics: its requests, inputs and tokens, their latency,
the batches it computes, and its residency (the chat engines' names for loads and unloads, so
one family holds every model's)."""

from __future__ import annotations

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram

from agent_memory.engine.observability.metrics import SECONDS


class EmbeddingMetrics:
    def __init__(self) -> None:
        r = self.registry = CollectorRegistry()
        self.requests = Counter("agent_memory_embedding_requests", "Embedding requests answered", registry=r)
        self.failed = Counter(
            "agent_memory_embedding_requests_failed",
            "Embedding requests that failed (a load or a forward pass)",
            registry=r,
        )
        self.inputs = Counter("agent_memory_embedding_inputs", "Inputs embedded (one vector each)", registry=r)
        self.tokens = Counter("agent_memory_embedding_tokens", "Input tokens embedded", registry=r)
        self.latency = Histogram(
            "agent_memory_embedding_seconds", "From an embedding request to its vectors", buckets=SECONDS, registry=r
        )
        self.batch_size = Histogram(
            "agent_memory_embedding_batch_size", "Inputs per forward pass", buckets=(1, 2, 4, 8, 16, 32, 64), registry=r
        )
        self.loaded = Gauge("agent_memory_model_loaded", "1 while the model's weights are loaded", registry=r)
        self.loads = Counter("agent_memory_model_loads", "Times the model was loaded", registry=r)
        self.unloads = Counter("agent_memory_model_unloads", "Times the model was unloaded to make room", registry=r)

    def answered(self, inputs: int, tokens: int, seconds: float) -> None:
        self.requests.inc()
        self.inputs.inc(inputs)
        self.tokens.inc(tokens)
        self.latency.observe(seconds)

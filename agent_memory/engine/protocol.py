"""The engine as the HTTP side sees it, and all it sees (as vLLM's `EngineClient`): the model's
facts, submit and cancel, the agents and heads it remembers (and pins), health and metrics. The API holds engines by
model id and depends on this interface alone, never on an engine's store, tiers or model object;
a test can serve the API from any object that honours it.

Every method may be called from any thread; none blocks on MLX work (what needs the engine
thread returns a Future)."""

from __future__ import annotations

from abc import ABC, abstractmethod
from concurrent.futures import Future
from dataclasses import dataclass, field
from typing import Any

from prometheus_client import CollectorRegistry

from agent_memory.agent_key import AgentKey
from agent_memory.models.embedding_layout import EmbeddingLayout
from agent_memory.engine.requests import GenerationRequest, Sink
from agent_memory.memory.index.pins import PinResult
from agent_memory.memory.index.store_records import AgentInfo

__all__ = ["AgentInfo", "EngineClient", "Health", "ModelFacts", "PinResult"]


@dataclass(frozen=True)
class ModelFacts:
    """What the API needs to know of the served model to render, tokenize and check requests."""

    name: str  # its id: the model folder's name
    ids: tuple[str, ...]  # every id it answers to: the name, then its aliases (`demo`)
    tokenizer: Any  # mlx-lm's TokenizerWrapper: the chat template, encode, the tool parser
    context_length: int
    vocab_size: int  # the width of the model's logits (may exceed the tokenizer's vocabulary)
    # The most characters one token stands for: n characters are at least n / this many tokens.
    max_token_chars: int
    # How the model writes calls and reasoning (chat/formats/reply.py): found once, at load.
    reply_format: Any
    # What a request that omits them samples with (temperature, top_p, top_k): the model
    # folder's generation_config.json, unless --no-model-defaults.
    sampling_defaults: dict[str, float | int] = field(default_factory=dict)
    # The most tokens a request that sends no limit generates (--default-max-tokens); None: the room left.
    default_max_tokens: int | None = None
    # An embedding model's pooling and size (models/embedding_layout.py); None: a chat model.
    embedding: EmbeddingLayout | None = None
    # A vision model's processor (vision/prompt.py: `prepare` on the tokenizer thread); None: text only.
    vision: Any = None

    @property
    def takes_images(self) -> bool:
        return self.vision is not None

    @property
    def kind(self) -> str:
        """What it serves: "chat" (chat, completions, messages, responses) or "embedding"."""
        return "chat" if self.embedding is None else "embedding"


@dataclass(frozen=True)
class Health:
    """/health's answer: `loading`, `ok`, `error` (with why), or `unavailable` (why its weights
    cannot be loaded: its requests fail, other models serve), and what is in force once ok.
    A model loaded on demand is ok before its first request, with `loaded` False."""

    status: str
    message: str | None = None
    code: str | None = None  # an `error` that refuses every request (503 with this code): it serves no more
    loaded: bool = True  # whether its weights are in memory now
    kv: dict[str, str] | None = None  # precision tags: hot, working, disk
    warm_tier: dict | None = None  # on, degraded (why) or off (why)
    ranks: dict | None = None  # split over processes: size, mode, each rank's part (engine/report.py)

    @property
    def ok(self) -> bool:
        return self.status == "ok"


class EngineClient(ABC):
    """One served model's engine."""

    # -- lifetime -----------------------------------------------------------------------

    @abstractmethod
    def start(self) -> None:
        """Start loading the model in the background; `wait_loaded` says how it went."""

    @abstractmethod
    def wait_loaded(self) -> str | None:
        """Block until the model is loaded: None, or why it could not be."""

    @abstractmethod
    def announce(self, url: str) -> None:
        """Say where the server answers (the `cache` commands then end agents through it)."""

    @abstractmethod
    def stop(self) -> None:
        """Finish: running requests end, queued writes reach the warm tier, the announcement goes."""

    # -- the model ----------------------------------------------------------------------

    @property
    @abstractmethod
    def model(self) -> ModelFacts | None:
        """The served model's facts; None until it is loaded."""

    @property
    @abstractmethod
    def max_batch(self) -> int:
        """Sequences decoded together at most (what a waiting request's retry hint scales by)."""

    # -- requests -----------------------------------------------------------------------

    @abstractmethod
    def submit(self, request: GenerationRequest, sink: Sink) -> int:
        """Queue a request; its events go to `sink` (on the engine thread). Returns its id."""

    @abstractmethod
    def cancel(self, request_id: int) -> None:
        """Stop a submitted request (its client left); what it computed is kept."""

    def embed(self, inputs: list[list[int]]) -> Future:
        """An embedding model's vectors for `inputs` (token ids each): a Future of an np.ndarray,
        one float32 row per input, or of a Failed. Only a model of kind "embedding" has them."""
        raise NotImplementedError(f"{type(self).__name__} serves no embeddings")

    # -- agents -------------------------------------------------------------------------

    @abstractmethod
    def agents(self, tenant: str | None) -> list[AgentInfo]:
        """A tenant's agents (None: every tenant's); stored responses are not agents."""

    @abstractmethod
    def agent(self, key: AgentKey) -> AgentInfo | None:
        """One agent or stored response, or None."""

    @abstractmethod
    def totals(self, tenant: str | None = None) -> dict[str, int]:
        """The memory's figures: bytes and budgets by tier, blocks by tier; every tenant's
        (None), or one tenant's."""

    @abstractmethod
    def end_agent(self, key: AgentKey) -> Future:
        """Forget an agent in every tier: a Future of whether it existed."""

    @abstractmethod
    def heads(self, tenant: str | None) -> list[AgentInfo]:
        """A tenant's shared heads (None: every tenant's): records of kind HEAD, made by a
        prefill-only request (`GenerationRequest.prefill_only`, api/heads.py)."""

    @abstractmethod
    def pin(self, key: AgentKey, on: bool) -> PinResult:
        """Keep an agent or head against eviction (on), or no longer; refused over the budget."""

    # -- the operator's view ------------------------------------------------------------

    @abstractmethod
    def health(self) -> Health:
        """Loading, serving or broken, and what is in force."""

    @abstractmethod
    def summary(self) -> str:
        """One line for the log once loaded: what is served, how memory is spent, where."""

    @property
    @abstractmethod
    def metrics(self) -> CollectorRegistry:
        """The Prometheus families this engine exports."""

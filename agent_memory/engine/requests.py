"""What the API hands the engine, and the events the engine streams back."""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass, field, fields
from typing import Any

from agent_memory.agent_key import AgentKey
from agent_memory.cache_miss import Miss
from agent_memory.memory.hashing import SpanKey
from agent_memory.vision.prompt import VisionInputs

TOP_LOGPROBS = 20  # the most alternatives a request may ask for (OpenAI's limit)


@dataclass
class TokenLogprob:
    """A generated token's logprob and its likeliest alternatives (computed by logprobs.py)."""

    token: int
    logprob: float
    top: list[tuple[int, float]]  # the likeliest tokens and their logprobs, likeliest first


@dataclass
class SamplingParams:
    max_tokens: int
    temperature: float = 1.0
    top_p: float = 1.0
    seed: int | None = None
    top_k: int = 0  # 0: no top-k cut
    stop: list[str] = field(default_factory=list)
    logit_bias: dict[int, float] = field(default_factory=dict)
    # None: no logprobs; k: each token's logprob and its k likeliest alternatives (logprobs.py).
    logprobs: int | None = None
    frequency_penalty: float = 0.0  # OpenAI's, over the generated tokens (penalties.py)
    presence_penalty: float = 0.0
    repetition_penalty: float = 1.0  # vLLM's, over the prompt's and generated tokens; 1: none
    n: int = 1  # samples of one prompt, prefilled once: each its own `index` in the events


@dataclass(frozen=True)
class Sampling:
    """What a request asks to sample with, in SamplingParams' terms but max_tokens: a field it
    left out (None) takes the model's own default (its generation_config.json), else ours."""

    temperature: float | None = None
    top_p: float | None = None
    top_k: int | None = None
    seed: int | None = None
    stop: list[str] = field(default_factory=list)
    logit_bias: dict[int, float] = field(default_factory=dict)
    logprobs: int | None = None
    frequency_penalty: float | None = None
    presence_penalty: float | None = None
    repetition_penalty: float | None = None
    n: int | None = None

    def params(self, defaults: Mapping[str, float | int], max_tokens: int) -> SamplingParams:
        """What the engine samples with: the request's fields over the model's defaults."""
        asked = {f.name: value for f in fields(self) if (value := getattr(self, f.name)) is not None}
        return SamplingParams(max_tokens=max_tokens, **{**defaults, **asked})


@dataclass(frozen=True)
class Breakpoint:
    """A point of the prompt its client expects to come back to (Anthropic's `cache_control`):
    the prefill stops there to offer it (with a snapshot on state layers), and the blocks up to
    it are kept with priority for `ttl_s` seconds (memory/index/keep.py)."""

    position: int  # prompt tokens before it
    ttl_s: float


@dataclass(frozen=True)
class Retention:
    """How long an agent's memory is kept with priority (OpenAI's `prompt_cache_retention`):
    its hot blocks, and with `disk` its warm copies too (persisted in its manifest)."""

    seconds: float
    disk: bool


@dataclass(eq=False)  # by identity: the API counts requests in flight in a weak set
class GenerationRequest:
    prompt: list[int]
    params: SamplingParams
    agent: AgentKey | None = None  # whose memory it reads and joins; None: nobody's
    request_id: str = ""  # the X-Request-Id, for logs
    tenant: str = ""  # the API key's name when keys are per tenant: a namespace of its own
    cache_salt: str = ""  # requests with different salts share no cached block (vLLM's field)
    # What fixes the prompt's KV beyond its token ids, by token span (an image's digest): blocks
    # share KV only where these match too (memory/hashing.py).
    extra_keys: tuple[SpanKey, ...] = ()
    # A vision model's images (vision/prompt.py): their pixels and spans; None: text only.
    vision: VisionInputs | None = None
    # An llguidance matcher the output must follow (constrained decoding), made by the API.
    grammar: Any = None
    # False: a request that must not be remembered (`remember: false`, `Cache-Control: no-store`):
    # it reuses the cache, but nothing of it is committed, followed up, snapshotted or recorded.
    remember: bool = True
    breakpoints: tuple[Breakpoint, ...] = ()  # ascending positions
    retention: Retention | None = None  # None: its agent's memory at the usual value
    # A chat turn whose API settles it: once it ends, the API sends the history as the template
    # writes it back (chat/continuation.py) as a prefill-only request, so the engine queues no
    # canonical follow-up of its own (sequence.canonical_reply).
    settles: bool = False
    # Only its prompt's KV, for its agent, and no output: a settle, or a shared head (api/heads.py).
    prefill_only: bool = False


@dataclass
class Usage:
    prompt_tokens: int
    completion_tokens: int = 0
    hot_tokens: int = 0  # prompt tokens whose KV came from memory
    warm_tokens: int = 0  # prompt tokens whose KV came from disk
    # Speculative decoding: proposed tokens the model accepted (each a decode step saved), and refused.
    accepted_prediction_tokens: int = 0
    rejected_prediction_tokens: int = 0
    miss: Miss | None = None  # why the prompt was not reused further (cache_miss.py), once planned
    agent: AgentKey | None = None  # whose memory the turn joined (the API's settle names it so)

    @property
    def cached_tokens(self) -> int:
        return self.hot_tokens + self.warm_tokens

    def speculated(self, proposed: int, accepted: int) -> None:
        self.accepted_prediction_tokens += accepted
        self.rejected_prediction_tokens += proposed - accepted


@dataclass
class TextDelta:
    text: str
    logprobs: list[TokenLogprob] | None = None  # the tokens this text completes (when asked)
    index: int = 0  # which of the request's n samples


@dataclass
class Finished:
    reason: str  # "stop" | "length" | "cancelled"
    usage: Usage
    stop_sequence: str | None = None  # reason "stop" by a stop string: which one (None: end of sequence)
    index: int = 0  # which of the request's n samples


# A served model whose weights cannot be loaded (engine/loading/weights.py): no retry mends it, so the
# API answers 500 with `x-should-retry: false` (api/serving/admit.py), before a stream starts.
MODEL_UNAVAILABLE = "model_unavailable"


@dataclass
class Failed:
    """The request could not be served; status and code are what the client is told."""

    message: str
    status: int = 500
    code: str = "engine_error"


Event = TextDelta | Finished | Failed
Sink = Callable[[Event], None]

"""What a wire format (OpenAI chat and text completions, Anthropic Messages, Responses) tells
the one serving path (serve.py): from its body, the model, the agent and the limits it asks
for (`Asked`) and the prompt (`WireFormat.prompt`); from the engine's events, its reply, as a
stream's frames or one JSON body (`Answer`)."""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass, field
from typing import Protocol

from agent_memory.agent_key import AgentKey
from agent_memory.api.serving.output_limit import OutputLimit, no_room
from agent_memory.api.serving.prompt import Prepared
from agent_memory.api.state import ServedModel
from agent_memory.chat.conversation import Message
from agent_memory.engine.requests import Event, GenerationRequest, Retention, Sampling


@dataclass(frozen=True)
class Asked:
    """What a request asks of the engine besides its prompt."""

    model: str | None  # the body's `model`: which served model (None: the only one)
    agent: AgentKey | None  # whose memory it reads and joins; None: nobody's
    max_tokens: int | None  # its own output limit; None: the model's default
    sampling: Sampling = field(default_factory=Sampling)
    cache_salt: str | None = None
    stream: bool = False
    # A prompt that leaves no room to generate, in the wire format's words: (prompt tokens, context) -> message.
    too_long: Callable[[int, int], str] = no_room
    remember: bool = True  # the body's `remember` (serving/controls.py: Cache-Control: no-store too)
    retention: Retention | None = None  # OpenAI's prompt_cache_retention


@dataclass(frozen=True)
class Admitted:
    """A request the engine is handed (serving/admit.py)."""

    generation: GenerationRequest
    output: OutputLimit  # what it generates at most, and whether the room cut the request's limit


class Answer(Protocol):
    """A reply as it is made from the engine's events."""

    headers: dict[str, str]

    def stream(self, events: AsyncIterator[Event]) -> AsyncIterator[str]:
        """The frames of a stream (SSE), a failure among them in the wire format's shape."""

    def body(self, events: list[Event]) -> dict:
        """The JSON reply of a request run to its end (every sample Finished)."""

    def returned(self) -> Message | None:
        """The reply as its client sends it back in the next request (ids as the client got
        them, reasoning where the wire format returns it), once its Finished is read; None
        before, or where no conversation continues it (serving/settle.py)."""


class WireFormat(ABC):
    """One request in one wire format: `asked` read from its body at once; `prompt` once the
    model is known; `answer` once the engine has admitted it."""

    asked: Asked

    @abstractmethod
    async def prompt(self, model: ServedModel) -> Prepared:
        """The body as the tokens the engine continues (and the grammar its reply follows)."""

    @abstractmethod
    def answer(self, model: ServedModel, prepared: Prepared, admitted: Admitted) -> Answer:
        """How the engine's events for this request become its reply."""

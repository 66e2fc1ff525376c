"""How many tokens a request may generate, the same on every API: what it asked for, or, when
it sends no limit (Codex sends no `max_output_tokens`), its model's default
(`--default-max-tokens`, else the room left); never more than the context has room for after
the prompt. A limit over the room is the room, as Anthropic's Messages API does it: a prompt that
fits with room to answer is answered, and the reply ends with `length` where the room ends
(opencode asks any model it does not know for 32000 tokens). Only a prompt that leaves no room
for one token, or for the shortest output its grammar allows, is refused."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from agent_memory.api.errors import APIError
from agent_memory.chat.finish import ConstrainedOutput
from agent_memory.engine.protocol import ModelFacts


@dataclass(frozen=True)
class OutputLimit:
    max_tokens: int  # what the engine generates at most
    asked: int | None  # the request's own limit (None: it sent none)

    @property
    def clamped(self) -> str | None:
        """`ASKED->ROOM` for the request's log line when the room cut its limit, else None."""
        return f"{self.asked}->{self.max_tokens}" if self.asked is not None and self.asked > self.max_tokens else None


def no_room(prompt_tokens: int, context: int) -> str:
    """OpenAI's wording for a prompt that leaves no room to generate a token."""
    return (
        f"This model's maximum context length is {context} tokens, and the prompt is {prompt_tokens} "
        "tokens: no room is left to generate one."
    )


def output_limit(
    facts: ModelFacts,
    prompt_tokens: int,
    asked: int | None,
    grammar: ConstrainedOutput | None,
    prompt_param: str,
    too_long: Callable[[int, int], str] = no_room,
) -> OutputLimit:
    """The request's OutputLimit, or a 400: no room after the prompt (`too_long(prompt tokens,
    context)` says so in the wire format's words), or a limit (asked, or the room) below the
    shortest output the grammar allows. The one place the room left is reckoned."""
    context = facts.context_length
    room = context - prompt_tokens
    if room < 1:
        raise APIError(400, too_long(prompt_tokens, context), param=prompt_param, code="context_length_exceeded")
    needs = grammar.min_tokens if grammar is not None else None
    if needs is not None and asked is not None and asked < needs:
        raise APIError(
            400,
            f"the constrained output needs at least {needs} tokens (its shortest valid form), "
            f"but max_tokens is {asked}",
            param="max_tokens",
        )
    if needs is not None and room < needs:
        raise APIError(
            400,
            f"This model's maximum context length is {context} tokens: after the prompt's {prompt_tokens} "
            f"there is room for {room}, but the constrained output needs at least {needs} (its shortest valid form).",
            param=prompt_param,
            code="context_length_exceeded",
        )
    wanted = asked if asked is not None else facts.default_max_tokens
    if wanted is None:
        return OutputLimit(room, None)
    if needs is not None:  # a default never makes a grammar's output impossible
        wanted = max(wanted, needs)
    return OutputLimit(min(wanted, room), asked)

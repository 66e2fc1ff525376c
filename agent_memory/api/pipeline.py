"""The one request path every wire format shares: who is speaking, render + tokenize, the
context check, the engine's events for one request, and running it to the end while watching
for the client to leave. Wire formats (openai/, anthropic/, responses/) only parse their bodies
and shape output."""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator, Awaitable
from dataclasses import dataclass
from typing import Any, TypeVar

from fastapi import Request

from agent_memory.agent_key import AgentKey
from agent_memory.api.access_log import shown_agent
from agent_memory.api.agent_ids import check_agent_id
from agent_memory.api.errors import APIError, failure
from agent_memory.api.output_limit import output_limit
from agent_memory.api.state import ServedModel, ServerState
from agent_memory.chat.call_check import CheckedReader
from agent_memory.chat.conversation import Conversation
from agent_memory.chat.finish import ConstrainedOutput
from agent_memory.chat.grammar import GrammarError
from agent_memory.chat.render import RenderError, render_prompt
from agent_memory.engine.requests import MODEL_UNAVAILABLE, Event, Failed, Finished, GenerationRequest
from agent_memory.engine.requests import SamplingParams, TextDelta

T = TypeVar("T")


def utf8_header(request: Request, name: str) -> str | None:
    """A header's value read as UTF-8 (HTTP hands us bytes; Starlette decodes Latin-1)."""
    value = request.headers.get(name)
    if value is None:
        return None
    try:
        return value.encode("latin-1").decode("utf-8")
    except UnicodeError as e:
        raise APIError(400, f"{name} is not valid UTF-8", param=name, code="invalid_unicode") from e


def tenant(request: Request) -> str:
    """The tenant of the request's API key; "" when keys are not per tenant."""
    return request.scope.get("state", {}).get("tenant", "")


def agent_key(request: Request, candidates: list[tuple[str, object]]) -> AgentKey | None:
    """The agent a request speaks for, in its tenant: the first non-empty string of (param,
    value) candidates, in the wire format's order; None when it names none."""
    for param, value in candidates:
        if isinstance(value, str) and value:
            check_agent_id(value, param)
            return AgentKey(value, tenant(request))
    return None


def openai_agent(body: Any, request: Request) -> AgentKey | None:
    """Where the OpenAI formats (chat, completions, Responses) name their agent, in order."""
    return agent_key(
        request,
        [
            ("prompt_cache_key", body.prompt_cache_key),
            # The AI SDK's name for it, which its openai-compatible provider sends as it is (opencode's sessions)
            ("promptCacheKey", (body.model_extra or {}).get("promptCacheKey")),
            ("X-Agent-Id", utf8_header(request, "X-Agent-Id")),
            ("user", body.user),
            ("metadata.user_id", (body.metadata or {}).get("user_id")),
        ],
    )


@dataclass
class Prepared:
    prompt: list[int]
    grammar: ConstrainedOutput | None  # None: free text
    started: bool | None = None  # the prompt opened the reply's reasoning, closed it (False), or neither


async def prepare_chat(
    model: ServedModel,
    conversation: Conversation,
    params: tuple[str, str, str] = ("messages", "tools", "response_format"),
    constrained: bool = True,
) -> Prepared:
    """The conversation rendered through the chat template (tools natively or in the built-in
    format) on a render thread, then tokenized, and the grammar its output must follow, on the
    tokenizer worker.
    `params`: the wire format's names of the messages, the tools and the output format;
    `constrained` False: only the prompt (counting tokens compiles no grammar)."""
    messages_param, tools_param, format_param = params
    chars = sum(len(m.content) + sum(len(c.arguments) for c in m.tool_calls) for m in conversation.messages)
    check_length(model, chars, messages_param)

    fmt = model.reply_format
    try:  # on a render thread, bounded in time: a slow template holds up no other request
        text = await model.render(lambda tok: render_prompt(tok, conversation, fmt))
    except RenderError as e:
        raise APIError(400, str(e), param=messages_param) from e

    def prepare(tokenizer) -> Prepared:
        started = fmt.started_by(text)
        grammar = output_grammar(model, conversation, tools_param, format_param, started) if constrained else None
        return Prepared(tokenizer.encode(text, add_special_tokens=False), grammar, started)

    return await model.tokenize(prepare)


def output_grammar(
    model: ServedModel, conversation: Conversation, tools_param: str, format_param: str, started: bool | None
) -> ConstrainedOutput | None:
    """What the reply must follow (None: free text); a 400 when the request asks for what
    cannot be enforced. On the tokenizer worker: it compiles, and finds the shortest finish."""
    fmt = model.reply_format
    if conversation.calls_tools and not fmt.constrained:
        if conversation.tool_choice.mode != "auto":
            raise APIError(
                400,
                f"tool_choice '{conversation.tool_choice.mode}' cannot be enforced: this model's template writes "
                f"calls in mlx-lm's {fmt.name} format, which is parsed but not constrained here",
                param="tool_choice",
            )
        return None
    try:
        text_grammar = model.grammars.grammar(conversation, tools_param, format_param, started)
        return model.grammars.output(text_grammar, conversation.calls_tools) if text_grammar else None
    except GrammarError as e:
        raise APIError(400, str(e), param=e.param, code="invalid_schema") from e


def reply_reader(model: ServedModel, conversation: Conversation, prepared: Prepared):
    """How a reply's text turns into reasoning, content and calls (chat/reader.py)."""
    tools = conversation.tools if conversation.calls_tools else []
    reader = model.reply_format.reader(tools, prepared.started)
    return CheckedReader(reader, tools) if tools else reader


def token_counter(model: ServedModel):
    """text -> how many tokens it is (a reply's reasoning, for usage), on the event loop with
    the model's counting tokenizer (never the tokenizer worker's)."""
    return lambda text: len(model.counter.encode(text, add_special_tokens=False).ids)


def check_length(model: ServedModel, chars: int, param: str) -> None:
    """Refuse a prompt that cannot fit before tokenizing it: n characters are at least
    n / (the longest token's characters) tokens. A 10 MB message costs nothing this way."""
    at_least = -(-chars // model.facts.max_token_chars)
    if at_least >= model.context_length:
        raise APIError(
            400,
            f"This model's maximum context length is {model.context_length} tokens, but the prompt "
            f"is at least {at_least} tokens ({chars} characters).",
            param=param,
            code="context_length_exceeded",
        )


def check_available(model: ServedModel) -> None:
    """Refuse, before a stream starts, a request to a model whose weights cannot be loaded."""
    if (health := model.engine.health()).status == "unavailable":
        raise failure(Failed(f"the model {model.id} cannot be loaded: {health.message}", 500, MODEL_UNAVAILABLE))


def generation_request(
    state: ServerState,
    model: ServedModel,
    prompt: list[int],
    agent: AgentKey | None,
    limit: int | None,
    sampling: dict,
    request: Request,
    prompt_param: str,
    grammar: ConstrainedOutput | None = None,
    cache_salt: str | None = None,
) -> GenerationRequest:
    """Check the prompt and the tokens to generate against the context (`limit`: the request's
    own, or None; clamped to the room left: output_limit.py), then build the engine's request.
    `sampling`: SamplingParams' fields but max_tokens; a field the request left out (None)
    takes the model's own default (its generation_config.json), else ours."""
    if not prompt:
        raise APIError(400, "the prompt is empty", param=prompt_param)
    check_available(model)
    if len(state.waiting) >= state.max_waiting:
        raise APIError(
            503,
            f"{len(state.waiting)} requests are waiting to start; retry shortly",
            code="server_busy",
            headers={"Retry-After": str(1 + len(state.waiting) // model.engine.max_batch)},
        )
    output = output_limit(model.facts, len(prompt), limit, grammar, prompt_param)  # clamped to the room left
    sampling = {**model.facts.sampling_defaults, **{k: v for k, v in sampling.items() if v is not None}}
    if sampling.get("n", 1) > model.engine.max_batch:
        why = f"n is at most the batch limit, {model.engine.max_batch} samples decoding side by side"
        raise APIError(400, why, param="n")
    bias = sampling.get("logit_bias") or {}
    if any(not 0 <= t < model.vocabulary for t in bias):
        raise APIError(400, f"logit_bias token ids must be in [0, {model.vocabulary})", param="logit_bias")
    generation = GenerationRequest(
        prompt=prompt,
        params=SamplingParams(max_tokens=output.max_tokens, **sampling),
        agent=agent,
        request_id=request.scope.get("state", {}).get("request_id", ""),
        grammar=grammar,
        tenant=tenant(request),
        cache_salt=cache_salt or "",
    )
    state.waiting.add(generation)  # counted from now: requests admitted in one tick all count
    trace = {"agent": shown_agent(agent, state.log_agent_ids), "prompt_tokens": len(prompt)}
    if output.clamped:  # the request asked for more than the room left
        trace["clamped"] = output.clamped
    if len(state.models) > 1:  # which model served it, where there is a choice
        trace = {"model": model.id, **trace}
    request.scope.setdefault("state", {})["trace"] = state.traces[generation] = trace
    return generation


async def events(state: ServerState, model: ServedModel, generation: GenerationRequest) -> AsyncIterator[Event]:
    """The engine's events for one request; leaving early cancels its generation."""
    loop = asyncio.get_running_loop()
    queue: asyncio.Queue[Event] = asyncio.Queue()

    def sink(event: Event) -> None:
        try:
            loop.call_soon_threadsafe(queue.put_nowait, event)
        except RuntimeError:  # the event loop has closed: nobody is listening any more
            pass

    request_id = model.engine.submit(generation, sink)
    trace = state.traces.get(generation, {})
    started = time.perf_counter()
    first: float | None = None
    done = False
    left = generation.params.n  # samples still to finish
    try:
        while not done:
            event = await queue.get()
            state.waiting.discard(generation)
            now = time.perf_counter()
            if first is None:
                first = now
                trace["ttft_ms"] = round((now - started) * 1000, 1)
            if isinstance(event, Finished):
                u = event.usage
                trace.update(cached_tokens=u.cached_tokens, hot_tokens=u.hot_tokens, warm_tokens=u.warm_tokens)
                trace.update(completion_tokens=u.completion_tokens, finish=event.reason)
                if u.accepted_prediction_tokens or u.rejected_prediction_tokens:
                    trace["accepted"] = (
                        f"{u.accepted_prediction_tokens}/{u.accepted_prediction_tokens + u.rejected_prediction_tokens}"
                    )
                if u.completion_tokens > 1 and now > first:
                    trace["tok_s"] = round((u.completion_tokens - 1) / (now - first), 1)
            elif isinstance(event, Failed):
                trace["finish"] = f"error ({event.code})"
            left -= isinstance(event, Finished)
            done = isinstance(event, Failed) or left == 0
            yield event
    finally:
        state.waiting.discard(generation)
        if not done:
            model.engine.cancel(request_id)


async def collect(
    state: ServerState, model: ServedModel, generation: GenerationRequest, request: Request
) -> list[Event] | None:
    """A request run to the end: its events, the last Finished (None: the client left first)."""

    async def consume() -> list[Event]:
        out = []
        async for event in events(state, model, generation):
            if isinstance(event, Failed):
                raise failure(event)
            out.append(event)
        return out

    return await unless_client_leaves(request, consume())


async def unless_client_leaves(request: Request, work: Awaitable[T]) -> T | None:
    """`work`'s result, or None once the client has left first (the work is then cancelled)."""

    async def disconnected() -> None:
        while (await request.receive())["type"] != "http.disconnect":
            pass

    task = asyncio.ensure_future(work)
    watch = asyncio.ensure_future(disconnected())
    await asyncio.wait({task, watch}, return_when=asyncio.FIRST_COMPLETED)
    if task.done():
        watch.cancel()
        return task.result()
    task.cancel()
    return None


def merged(events: list[Event], index: int = 0) -> TextDelta:
    """One sample's collected text and logprobs as one delta (a JSON reply's whole text)."""
    mine = [e for e in events if isinstance(e, TextDelta) and e.index == index]
    return TextDelta("".join(e.text for e in mine), [lp for e in mine for lp in e.logprobs or []], index)

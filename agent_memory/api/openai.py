"""The OpenAI adapter: chat and text completions (JSON or SSE) and the model list."""

from __future__ import annotations

import asyncio
import json
import time
import uuid
from collections.abc import AsyncIterator, Callable

from fastapi import APIRouter, Depends, Request, Response
from fastapi.responses import StreamingResponse

from agent_memory.api.errors import APIError, error_body
from agent_memory.api.schemas import MAX_AGENT_ID, ChatCompletionRequest, CompletionRequest, SamplingFields
from agent_memory.api.state import ServerState, ready_state
from agent_memory.engine.requests import (
    Event,
    Failed,
    Finished,
    GenerationRequest,
    SamplingParams,
    TextDelta,
    Usage,
)

router = APIRouter()


def usage_dict(usage: Usage) -> dict:
    return {
        "prompt_tokens": usage.prompt_tokens,
        "completion_tokens": usage.completion_tokens,
        "total_tokens": usage.prompt_tokens + usage.completion_tokens,
        "prompt_tokens_details": {
            "cached_tokens": usage.cached_tokens,
            "hot_tokens": usage.hot_tokens,
            "warm_tokens": usage.warm_tokens,
        },
    }


@router.get("/v1/models")
async def list_models(request: Request) -> dict:
    state: ServerState = request.app.state.server
    return {
        "object": "list",
        "data": [{"id": state.model_name, "object": "model", "created": state.started, "owned_by": "agent-memory"}],
    }


@router.post("/v1/chat/completions")
async def chat_completions(
    body: ChatCompletionRequest, request: Request, state: ServerState = Depends(ready_state)
):
    messages = [{"role": m.template_role(), "content": m.text()} for m in body.messages]
    prompt = await state.tokenize(lambda tok: tok.encode(_render_chat(tok, messages), add_special_tokens=False))
    generation = _generation_request(state, body, request, prompt)
    completion_id = "chatcmpl-" + uuid.uuid4().hex

    def chunk(delta: dict, finish_reason: str | None = None) -> dict:
        return {"choices": [{"index": 0, "delta": delta, "logprobs": None, "finish_reason": finish_reason}]}

    if body.stream:
        frames = _sse(
            state,
            generation,
            completion_id,
            "chat.completion.chunk",
            body.include_usage(),
            first={"choices": [{"index": 0, "delta": {"role": "assistant", "content": ""}, "logprobs": None, "finish_reason": None}]},
            text_chunk=lambda text: chunk({"content": text}),
            final_chunk=lambda reason: chunk({}, reason),
        )
        return StreamingResponse(frames, media_type="text/event-stream")
    text, finished = await _collect(state, generation, request)
    if finished is None:
        return Response(status_code=499)
    return {
        "id": completion_id,
        "object": "chat.completion",
        "created": int(time.time()),
        "model": state.model_name,
        "choices": [
            {
                "index": 0,
                "message": {"role": "assistant", "content": text},
                "logprobs": None,
                "finish_reason": finished.reason,
            }
        ],
        "usage": usage_dict(finished.usage),
    }


@router.post("/v1/completions")
async def completions(body: CompletionRequest, request: Request, state: ServerState = Depends(ready_state)):
    if isinstance(body.prompt, str):
        text_prompt = body.prompt
        prompt = await state.tokenize(lambda tok: tok.encode(text_prompt))
    else:
        prompt = list(body.prompt)
        if any(t < 0 or t >= state.vocab_size for t in prompt):
            raise APIError(400, f"prompt token ids must be in [0, {state.vocab_size})", param="prompt")
    if not prompt:
        raise APIError(400, "the prompt is empty", param="prompt")
    generation = _generation_request(state, body, request, prompt)
    completion_id = "cmpl-" + uuid.uuid4().hex

    def chunk(text: str, finish_reason: str | None = None) -> dict:
        return {"choices": [{"index": 0, "text": text, "logprobs": None, "finish_reason": finish_reason}]}

    if body.stream:
        frames = _sse(
            state,
            generation,
            completion_id,
            "text_completion",
            body.include_usage(),
            first=None,
            text_chunk=chunk,
            final_chunk=lambda reason: chunk("", reason),
        )
        return StreamingResponse(frames, media_type="text/event-stream")
    text, finished = await _collect(state, generation, request)
    if finished is None:
        return Response(status_code=499)
    return {
        "id": completion_id,
        "object": "text_completion",
        "created": int(time.time()),
        "model": state.model_name,
        "choices": [{"index": 0, "text": text, "logprobs": None, "finish_reason": finished.reason}],
        "usage": usage_dict(finished.usage),
    }


def utf8_header(request: Request, name: str) -> str | None:
    """A header's value read as UTF-8 (HTTP hands us bytes; Starlette decodes Latin-1)."""
    value = request.headers.get(name)
    if value is None:
        return None
    try:
        return value.encode("latin-1").decode("utf-8")
    except UnicodeError as e:
        raise APIError(400, f"{name} is not valid UTF-8", param=name, code="invalid_unicode") from e


def _render_chat(tokenizer, messages: list[dict]) -> str:
    try:
        return tokenizer.apply_chat_template(messages, add_generation_prompt=True, tokenize=False)
    except Exception as e:  # the model's own template refused these messages
        raise APIError(400, f"the chat template cannot render these messages: {e}", param="messages") from e


def _generation_request(
    state: ServerState, body: SamplingFields, request: Request, prompt: list[int]
) -> GenerationRequest:
    agent = body.agent_id(utf8_header(request, "X-Agent-Id"))
    if agent is not None and len(agent) > MAX_AGENT_ID:
        raise APIError(400, f"agent ids are at most {MAX_AGENT_ID} characters", param="prompt_cache_key")
    room = state.context_length - len(prompt)
    limit = body.token_limit()
    if room < 1 or (limit is not None and limit > room):
        wanted = len(prompt) + (limit or 1)
        raise APIError(
            400,
            f"This model's maximum context length is {state.context_length} tokens, but "
            f"{wanted} were requested ({len(prompt)} in the prompt, {limit or 1} to generate).",
            param="messages" if isinstance(body, ChatCompletionRequest) else "prompt",
            code="context_length_exceeded",
        )
    bias = body.logit_bias or {}
    if any(not 0 <= t < state.vocab_size for t in bias):
        raise APIError(400, f"logit_bias token ids must be in [0, {state.vocab_size})", param="logit_bias")
    params = SamplingParams(
        max_tokens=limit or room,
        temperature=body.temperature,
        top_p=body.top_p,
        seed=body.seed,
        stop=body.stop_strings(),
        logit_bias=bias,
    )
    return GenerationRequest(prompt=prompt, params=params, agent=agent)


async def _events(state: ServerState, generation: GenerationRequest) -> AsyncIterator[Event]:
    """The engine's events for one request; leaving early cancels its generation."""
    loop = asyncio.get_running_loop()
    queue: asyncio.Queue[Event] = asyncio.Queue()

    def sink(event: Event) -> None:
        try:
            loop.call_soon_threadsafe(queue.put_nowait, event)
        except RuntimeError:  # the event loop has closed: nobody is listening any more
            pass

    seq_id = state.engine.submit(generation, sink)
    done = False
    try:
        while not done:
            event = await queue.get()
            done = isinstance(event, (Finished, Failed))
            yield event
    finally:
        if not done:
            state.engine.cancel(seq_id)


async def _collect(
    state: ServerState, generation: GenerationRequest, request: Request
) -> tuple[str, Finished | None]:
    """Run a request to the end; (text, None) if the client left first (it is cancelled)."""

    async def consume() -> tuple[str, Finished]:
        parts = []
        async for event in _events(state, generation):
            if isinstance(event, TextDelta):
                parts.append(event.text)
            elif isinstance(event, Failed):
                raise APIError(event.status, event.message, code=event.code)
            else:
                return "".join(parts), event
        raise AssertionError("the event stream ended without finishing")

    async def disconnected() -> None:
        while (await request.receive())["type"] != "http.disconnect":
            pass

    work = asyncio.ensure_future(consume())
    watch = asyncio.ensure_future(disconnected())
    await asyncio.wait({work, watch}, return_when=asyncio.FIRST_COMPLETED)
    if work.done():
        watch.cancel()
        return work.result()
    work.cancel()
    return "", None


async def _sse(
    state: ServerState,
    generation: GenerationRequest,
    completion_id: str,
    object_name: str,
    include_usage: bool,
    first: dict | None,
    text_chunk: Callable[[str], dict],
    final_chunk: Callable[[str], dict],
) -> AsyncIterator[str]:
    created = int(time.time())

    def frame(payload: dict) -> str:
        payload = {"id": completion_id, "object": object_name, "created": created, "model": state.model_name, **payload}
        if include_usage:
            payload.setdefault("usage", None)
        return f"data: {json.dumps(payload)}\n\n"

    if first is not None:
        yield frame(first)
    async for event in _events(state, generation):
        if isinstance(event, TextDelta):
            yield frame(text_chunk(event.text))
        elif isinstance(event, Failed):
            yield f"data: {json.dumps(error_body(event.status, event.message, code=event.code))}\n\n"
            break
        else:
            yield frame(final_chunk(event.reason))
            if include_usage:
                yield frame({"choices": [], "usage": usage_dict(event.usage)})
    yield "data: [DONE]\n\n"

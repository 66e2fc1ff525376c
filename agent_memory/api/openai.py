"""The OpenAI wire format: chat and text completions (JSON or SSE) and the model list."""

from __future__ import annotations

import json
import time
import uuid
from collections.abc import AsyncIterator, Callable

from fastapi import APIRouter, Depends, Request, Response
from fastapi.responses import StreamingResponse

from agent_memory.api import pipeline
from agent_memory.api.errors import APIError, error_body
from agent_memory.api.schemas import ChatCompletionRequest, CompletionRequest, SamplingFields
from agent_memory.api.state import ServerState, ready_state
from agent_memory.engine.requests import Failed, Finished, GenerationRequest, TextDelta, Usage

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


def _generation(
    state: ServerState, body: SamplingFields, request: Request, prompt: list[int], prompt_param: str
) -> GenerationRequest:
    agent = pipeline.agent_id(
        [
            ("prompt_cache_key", body.prompt_cache_key),
            ("X-Agent-Id", pipeline.utf8_header(request, "X-Agent-Id")),
            ("user", body.user),
            ("metadata.user_id", (body.metadata or {}).get("user_id")),
        ]
    )
    sampling = {
        "temperature": body.temperature,
        "top_p": body.top_p,
        "seed": body.seed,
        "stop": body.stop_strings(),
        "logit_bias": body.logit_bias or {},
    }
    return pipeline.generation_request(state, prompt, agent, body.token_limit(), sampling, request, prompt_param)


@router.post("/v1/chat/completions")
async def chat_completions(
    body: ChatCompletionRequest, request: Request, state: ServerState = Depends(ready_state)
):
    messages = [{"role": m.template_role(), "content": m.text()} for m in body.messages]
    prompt = await pipeline.render_chat(state, messages)
    generation = _generation(state, body, request, prompt, "messages")
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
            first=chunk({"role": "assistant", "content": ""}),
            text_chunk=lambda text: chunk({"content": text}),
            final_chunk=lambda reason: chunk({}, reason),
        )
        return StreamingResponse(frames, media_type="text/event-stream")
    events = await pipeline.collect(state, generation, request)
    if events is None:
        return Response(status_code=499)
    finished = events[-1]
    text = "".join(e.text for e in events if isinstance(e, TextDelta))
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
    generation = _generation(state, body, request, prompt, "prompt")
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
    events = await pipeline.collect(state, generation, request)
    if events is None:
        return Response(status_code=499)
    finished = events[-1]
    text = "".join(e.text for e in events if isinstance(e, TextDelta))
    return {
        "id": completion_id,
        "object": "text_completion",
        "created": int(time.time()),
        "model": state.model_name,
        "choices": [{"index": 0, "text": text, "logprobs": None, "finish_reason": finished.reason}],
        "usage": usage_dict(finished.usage),
    }


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
    async for event in pipeline.events(state, generation):
        if isinstance(event, TextDelta):
            yield frame(text_chunk(event.text))
        elif isinstance(event, Failed):
            yield f"data: {json.dumps(error_body(event.status, event.message, code=event.code))}\n\n"
            break
        elif isinstance(event, Finished):
            yield frame(final_chunk(event.reason))
            if include_usage:
                yield frame({"choices": [], "usage": usage_dict(event.usage)})
    yield "data: [DONE]\n\n"

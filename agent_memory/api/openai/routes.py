"""The OpenAI wire format: chat and text completions (JSON or SSE), tools and structured
output on chat, and the model list."""

from __future__ import annotations

import json
import time
import uuid
from collections.abc import AsyncIterator, Callable

from fastapi import APIRouter, Depends, Request, Response
from fastapi.responses import JSONResponse, StreamingResponse

from agent_memory.api import pipeline
from agent_memory.api.errors import APIError, error_body
from agent_memory.api.openai.schemas import ChatCompletionRequest, CompletionRequest, NamedToolChoice, SamplingFields
from agent_memory.api.state import ServerState, ready_state
from agent_memory.chat.conversation import Conversation, Message, OutputFormat, Tool, ToolCall, ToolChoice
from agent_memory.chat.toolcalls import CallStart, ContentDelta, ToolCallParser
from agent_memory.engine.requests import Failed, Finished, GenerationRequest, TextDelta, Usage
from agent_memory.models.demo import aliases

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


def model_ids(state: ServerState) -> tuple[str, ...]:
    """The served model's id (its folder's name), then the aliases it answers to."""
    return (state.model_name, *aliases(state.model_name))


@router.get("/v1/models")
async def list_models(request: Request) -> dict:
    """The served model under its id (its folder's name), then the aliases it answers to:
    `demo` for the demo model, so examples written for `--model demo` name a listed id."""
    state: ServerState = request.app.state.server
    return {"object": "list", "data": [_model(state, i) for i in model_ids(state)]}


@router.get("/v1/models/{model_id:path}")
async def retrieve_model(model_id: str, request: Request):
    """One model object (OpenAI's `client.models.retrieve`); 404 `model_not_found` otherwise."""
    state: ServerState = request.app.state.server
    if model_id in model_ids(state):
        return _model(state, model_id)
    body = error_body(404, f"The model '{model_id}' does not exist", param="model", code="model_not_found")
    body["error"]["type"] = "invalid_request_error"  # OpenAI's own type for this 404
    return JSONResponse(body, status_code=404)


def answering(state: ServerState, requested: str | None) -> str:
    """The model id a reply names: the one asked for when it is one of the served model's ids
    (clients such as AutoGen check), else the served model's own."""
    return requested if requested in model_ids(state) else state.model_name


def _model(state: ServerState, model_id: str) -> dict:
    """A model object; `root` names the served model an alias stands for (as vLLM's do)."""
    return {
        "id": model_id,
        "object": "model",
        "created": state.started,
        "owned_by": "agent-memory",
        "root": state.model_name,
    }


def _generation(
    state: ServerState, body: SamplingFields, request: Request, prompt: list[int], prompt_param: str, grammar=None
) -> GenerationRequest:
    agent = pipeline.openai_agent(body, request)
    sampling = {
        "temperature": body.temperature,
        "top_p": body.top_p,
        "seed": body.seed,
        "stop": body.stop_strings(),
        "logit_bias": body.logit_bias or {},
    }
    return pipeline.generation_request(
        state, prompt, agent, body.token_limit(), sampling, request, prompt_param, grammar, body.cache_salt
    )


def conversation(body: ChatCompletionRequest) -> Conversation:
    messages = [
        Message(
            role=m.template_role(),
            content=m.text(),
            tool_calls=[ToolCall(c.id, c.function.name, c.function.arguments) for c in m.tool_calls or []],
            tool_call_id=m.tool_call_id,
        )
        for m in body.messages
    ]
    tools = [Tool(t.function.name, t.function.description, t.function.parameters or {}) for t in body.tools or []]
    choice = body.tool_choice or ("auto" if tools else "none")
    if isinstance(choice, NamedToolChoice):
        choice = ToolChoice("named", choice.function.name)
    else:
        choice = ToolChoice(choice)
    fmt = body.response_format
    output = OutputFormat()
    if fmt is not None and fmt.type == "json_object":
        output = OutputFormat("json_object")
    elif fmt is not None and fmt.type == "json_schema":
        output = OutputFormat("json_schema", fmt.json_schema.schema_)
    return Conversation(messages, tools, choice, body.parallel_tool_calls, output)


def tool_parser(state: ServerState, conv: Conversation) -> ToolCallParser | None:
    """How this reply's text turns into calls: None when it may hold none."""
    if not conv.calls_tools:
        return None
    if state.tool_format.json_calls:
        return ToolCallParser()
    tok = state.engine.loaded.tokenizer
    return ToolCallParser(tok.tool_call_start, tok.tool_call_end, lambda body: tok.tool_parser(body, conv.tools))


def finish_reason(reason: str, calls: list) -> str:
    return "tool_calls" if calls and reason == "stop" else reason


def call_dict(call: ToolCall) -> dict:
    return {"id": call.id, "type": "function", "function": {"name": call.name, "arguments": call.arguments}}


@router.post("/v1/chat/completions")
async def chat_completions(
    body: ChatCompletionRequest, request: Request, state: ServerState = Depends(ready_state)
):
    conv = conversation(body)
    prepared = await pipeline.prepare_chat(state, conv)
    generation = _generation(state, body, request, prepared.prompt, "messages", prepared.grammar)
    completion_id = "chatcmpl-" + uuid.uuid4().hex
    parser = tool_parser(state, conv)
    if body.stream:
        frames = _chat_sse(state, generation, completion_id, body.include_usage(), parser, answering(state, body.model))
        return StreamingResponse(frames, media_type="text/event-stream")
    collected = await pipeline.collect_text(state, generation, request)
    if collected is None:
        return Response(status_code=499)
    text, finished = collected
    content, calls = parser.split(text) if parser else (text, [])
    message: dict = {"role": "assistant", "content": content if content or not calls else None}
    if calls:
        message["tool_calls"] = [call_dict(c) for c in calls]
    return {
        "id": completion_id,
        "object": "chat.completion",
        "created": int(time.time()),
        "model": answering(state, body.model),
        "choices": [
            {"index": 0, "message": message, "logprobs": None, "finish_reason": finish_reason(finished.reason, calls)}
        ],
        "usage": usage_dict(finished.usage),
    }


@router.post("/v1/completions")
async def completions(body: CompletionRequest, request: Request, state: ServerState = Depends(ready_state)):
    if isinstance(body.prompt, str):
        text_prompt = body.prompt
        pipeline.check_length(state, len(text_prompt), "prompt")
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

        def chunks(event) -> list[dict]:
            if isinstance(event, TextDelta):
                return [chunk(event.text)]
            return [chunk("", event.reason)]

        model = answering(state, body.model)
        frames = _sse(state, generation, completion_id, "text_completion", body.include_usage(), None, chunks, model)
        return StreamingResponse(frames, media_type="text/event-stream")
    collected = await pipeline.collect_text(state, generation, request)
    if collected is None:
        return Response(status_code=499)
    text, finished = collected
    return {
        "id": completion_id,
        "object": "text_completion",
        "created": int(time.time()),
        "model": answering(state, body.model),
        "choices": [{"index": 0, "text": text, "logprobs": None, "finish_reason": finished.reason}],
        "usage": usage_dict(finished.usage),
    }


def _chat_sse(
    state: ServerState, generation: GenerationRequest, completion_id: str, include_usage: bool, parser, model: str
) -> AsyncIterator[str]:
    """Chat chunks: text as content deltas, calls as OpenAI's tool-call deltas (the first of a
    call with its index, id, type and name; then fragments of its arguments)."""

    def chunk(delta: dict, finish: str | None = None) -> dict:
        return {"choices": [{"index": 0, "delta": delta, "logprobs": None, "finish_reason": finish}]}

    def delta(out) -> dict:
        if isinstance(out, ContentDelta):
            return {"content": out.text}
        if isinstance(out, CallStart):
            call = {"index": out.index, "id": out.id, "type": "function", "function": {"name": out.name, "arguments": ""}}
            return {"tool_calls": [call]}
        return {"tool_calls": [{"index": out.index, "function": {"arguments": out.text}}]}

    def chunks(event) -> list[dict]:
        if isinstance(event, TextDelta):
            outs = parser.feed(event.text) if parser else [ContentDelta(event.text)]
            return [chunk(delta(o)) for o in outs]
        outs, unfinished = parser.finish() if parser else ([], "")
        if unfinished:
            outs.append(ContentDelta(unfinished))
        calls = parser.calls if parser else []
        return [*(chunk(delta(o)) for o in outs), chunk({}, finish_reason(event.reason, calls))]

    first = chunk({"role": "assistant", "content": ""})
    return _sse(state, generation, completion_id, "chat.completion.chunk", include_usage, first, chunks, model)


async def _sse(
    state: ServerState,
    generation: GenerationRequest,
    completion_id: str,
    object_name: str,
    include_usage: bool,
    first: dict | None,
    chunks: Callable[[TextDelta | Finished], list[dict]],
    model: str,
) -> AsyncIterator[str]:
    created = int(time.time())

    def frame(payload: dict) -> str:
        payload = {"id": completion_id, "object": object_name, "created": created, "model": model, **payload}
        if include_usage:
            payload.setdefault("usage", None)
        return f"data: {json.dumps(payload)}\n\n"

    if first is not None:
        yield frame(first)
    async for event in pipeline.events(state, generation):
        if isinstance(event, Failed):
            yield f"data: {json.dumps(error_body(event.status, event.message, code=event.code))}\n\n"
            break
        for payload in chunks(event):
            yield frame(payload)
        if isinstance(event, Finished) and include_usage:
            yield frame({"choices": [], "usage": usage_dict(event.usage)})
    yield "data: [DONE]\n\n"

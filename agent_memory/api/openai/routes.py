"""The OpenAI wire format: chat and text completions (JSON or SSE), tools and structured
output on chat, and the model list. reply.py shapes what the engine writes."""

from __future__ import annotations

import json
import time
import uuid
from collections.abc import AsyncIterator, Callable

from fastapi import APIRouter, Depends, Request, Response
from fastapi.responses import JSONResponse, StreamingResponse

from agent_memory.api import pipeline
from agent_memory.api.errors import APIError, ErrorShape, error_body
from agent_memory.api.logprobs import LogprobWriter
from agent_memory.api.openai.reply import ChatReply, model_object, text_choice, total_usage, usage_dict
from agent_memory.api.openai.schemas import ChatCompletionRequest, CompletionRequest, NamedToolChoice, SamplingFields
from agent_memory.api.state import ServedModel, ServerState, ready_state
from agent_memory.chat.conversation import Conversation, Message, OutputFormat, Tool, ToolCall, ToolChoice, effort_thinking
from agent_memory.chat.render import TemplateVariableError, check_variables
from agent_memory.engine.requests import Failed, Finished, GenerationRequest, TextDelta

router = APIRouter()
ERROR_SHAPES: dict[str, ErrorShape] = {}  # OpenAI's shape is every route's unless claimed


@router.get("/v1/models")
async def list_models(request: Request) -> dict:
    """Each served model under its id (the NAME of `--model NAME=…`, else its hub id or folder's
    name), then the other names it answers to: its own under a NAME, `demo` for the demo model
    (examples written for `--model demo` name a listed id). `root`: the id each stands for."""
    state: ServerState = request.app.state.server
    data = [
        model_object(i, model.id, state.started, model.engine.model) for model in state.models.values() for i in model.ids
    ]
    return {"object": "list", "data": data}


@router.get("/v1/models/{model_id:path}")
async def retrieve_model(model_id: str, request: Request):
    """One model object (OpenAI's `client.models.retrieve`); 404 `model_not_found` otherwise."""
    state: ServerState = request.app.state.server
    for model in state.models.values():
        if model_id in model.ids:
            return model_object(model_id, model.id, state.started, model.engine.model)
    body = error_body(404, f"The model '{model_id}' does not exist", param="model", code="model_not_found")
    body["error"]["type"] = "invalid_request_error"  # OpenAI's own type for this 404
    return JSONResponse(body, status_code=404)


def _generation(
    state: ServerState,
    model: ServedModel,
    body: SamplingFields,
    request: Request,
    prompt: list[int],
    prompt_param: str,
    grammar=None,
) -> GenerationRequest:
    agent = pipeline.openai_agent(body, request)
    sampling = {
        "temperature": body.temperature,
        "top_p": body.top_p,
        "seed": body.seed,
        "stop": body.stop_strings(),
        "logit_bias": body.logit_bias or {},
        "logprobs": body.top_logprobs_asked(),
        "frequency_penalty": body.frequency_penalty,
        "presence_penalty": body.presence_penalty,
        "repetition_penalty": body.repetition_penalty,
        "n": body.n,
    }
    return pipeline.generation_request(
        state, model, prompt, agent, body.token_limit(), sampling, request, prompt_param, grammar, body.cache_salt
    )


def conversation(body: ChatCompletionRequest) -> Conversation:
    messages = [
        Message(
            role=m.template_role(),
            content=m.text(),
            tool_calls=[ToolCall(c.id, c.function.name, c.function.arguments) for c in m.tool_calls or []],
            tool_call_id=m.tool_call_id,
            reasoning=(m.reasoning_content or m.reasoning or "") if m.role == "assistant" else "",
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
    variables = body.chat_template_kwargs or {}
    try:  # the template's variables only: never the template or its renderer's arguments
        check_variables(variables, "chat_template_kwargs")
    except TemplateVariableError as e:
        raise APIError(400, str(e), param=e.param) from e
    thinking = effort_thinking(body.reasoning_effort, variables)
    return Conversation(messages, tools, choice, body.parallel_tool_calls, output, thinking)


@router.post("/v1/chat/completions")
async def chat_completions(
    body: ChatCompletionRequest, request: Request, state: ServerState = Depends(ready_state)
):
    model = state.model_for(body.model)
    conv = conversation(body)
    prepared = await pipeline.prepare_chat(model, conv)
    generation = _generation(state, model, body, request, prepared.prompt, "messages", prepared.grammar)
    completion_id = "chatcmpl-" + uuid.uuid4().hex
    writer = LogprobWriter(model.counter) if body.logprobs else None
    count = pipeline.token_counter(model)
    replies = [ChatReply(pipeline.reply_reader(model, conv, prepared), count, i, writer) for i in range(body.n)]

    def usage(finished: list[Finished]) -> dict:
        reasoning = sum(replies[f.index].reasoning_tokens(f.usage) for f in finished)
        return usage_dict(total_usage(finished), reasoning)

    if body.stream:
        frames = _sse(
            pipeline.events(state, model, generation),
            completion_id,
            "chat.completion.chunk",
            body.include_usage(),
            [r.first_chunk() for r in replies],
            lambda event: replies[event.index].feed(event),
            model.answering(body.model),
            usage,
        )
        return StreamingResponse(frames, media_type="text/event-stream")
    events = await pipeline.collect(state, model, generation, request)
    if events is None:
        return Response(status_code=499)
    finished = _finished(events)
    for event in events:
        replies[event.index].feed(event)
    return {
        "id": completion_id,
        "object": "chat.completion",
        "created": int(time.time()),
        "model": model.answering(body.model),
        "choices": [r.choice(f) for r, f in zip(replies, finished)],
        "usage": usage(finished),
    }


def _finished(events: list) -> list[Finished]:
    """Each sample's Finished event, in index order."""
    return sorted((e for e in events if isinstance(e, Finished)), key=lambda e: e.index)


@router.post("/v1/completions")
async def completions(body: CompletionRequest, request: Request, state: ServerState = Depends(ready_state)):
    model = state.model_for(body.model)
    if isinstance(body.prompt, str):
        text_prompt = body.prompt
        pipeline.check_length(model, len(text_prompt), "prompt")
        prompt = await model.tokenize(lambda tok: tok.encode(text_prompt))
    else:
        prompt = list(body.prompt)
        if any(t < 0 or t >= model.vocabulary for t in prompt):
            raise APIError(400, f"prompt token ids must be in [0, {model.vocabulary})", param="prompt")
    generation = _generation(state, model, body, request, prompt, "prompt")
    completion_id = "cmpl-" + uuid.uuid4().hex
    asked = body.logprobs is not None
    writers = [LogprobWriter(model.counter) for _ in range(body.n)]

    def logprobs(event: TextDelta) -> dict | None:
        return writers[event.index].legacy(event.logprobs or []) if asked else None

    def usage(finished: list[Finished]) -> dict:
        return usage_dict(total_usage(finished))

    if body.stream:

        def chunks(event: TextDelta | Finished) -> list[dict]:
            if isinstance(event, TextDelta):
                return [{"choices": [text_choice(event.text, None, event.index, logprobs(event))]}]
            return [{"choices": [text_choice("", event.reason, event.index)]}]

        events = pipeline.events(state, model, generation)
        answering = model.answering(body.model)
        frames = _sse(events, completion_id, "text_completion", body.include_usage(), [], chunks, answering, usage)
        return StreamingResponse(frames, media_type="text/event-stream")
    events = await pipeline.collect(state, model, generation, request)
    if events is None:
        return Response(status_code=499)
    finished = _finished(events)
    choices = []
    for f in finished:
        text = pipeline.merged(events, f.index)
        choices.append(text_choice(text.text, f.reason, f.index, logprobs(text)))
    return {
        "id": completion_id,
        "object": "text_completion",
        "created": int(time.time()),
        "model": model.answering(body.model),
        "choices": choices,
        "usage": usage(finished),
    }


async def _sse(
    events: AsyncIterator,
    completion_id: str,
    object_name: str,
    include_usage: bool,
    first: list[dict],
    chunks: Callable[[TextDelta | Finished], list[dict]],
    model_id: str,
    usage: Callable[[list[Finished]], dict],
) -> AsyncIterator[str]:
    """A completion's SSE frames: `first`, the chunks of each engine event, once every choice
    has finished the usage chunk when asked, then [DONE]; a failure is an error frame."""
    created = int(time.time())

    def frame(payload: dict) -> str:
        payload = {"id": completion_id, "object": object_name, "created": created, "model": model_id, **payload}
        if include_usage:
            payload.setdefault("usage", None)
        return f"data: {json.dumps(payload)}\n\n"

    for payload in first:
        yield frame(payload)
    finished: list[Finished] = []
    async for event in events:
        if isinstance(event, Failed):
            yield f"data: {json.dumps(error_body(event.status, event.message, code=event.code))}\n\n"
            finished = []  # no usage after a failure
            break
        for payload in chunks(event):
            yield frame(payload)
        if isinstance(event, Finished):
            finished.append(event)
    if include_usage and finished:
        yield frame({"choices": [], "usage": usage(sorted(finished, key=lambda e: e.index))})
    yield "data: [DONE]\n\n"

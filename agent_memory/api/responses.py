"""The OpenAI Responses wire format: `POST /v1/responses` (JSON or the `response.*` event
stream), `GET` and `DELETE /v1/responses/{id}`.

A stored response (`store`, true by default) keeps its whole conversation — the chain it
continues, its input, its output — and its KV under its own id (responses_store.py), so a
follow-up that sends only `previous_response_id` and new input prefills only that input, also
after a restart. Instructions are not carried over, as OpenAI specifies.
"""

from __future__ import annotations

import json
import secrets
import time
from collections.abc import AsyncIterator

from fastapi import APIRouter, Depends, Request, Response
from fastapi.responses import StreamingResponse

from agent_memory.api import pipeline
from agent_memory.api.errors import APIError
from agent_memory.api.openai import tool_parser
from agent_memory.api.responses_schemas import ResponsesRequest, input_messages
from agent_memory.api.responses_store import StoredResponse
from agent_memory.api.state import ServerState, ready_state
from agent_memory.chat.conversation import Conversation, Message, ToolCall
from agent_memory.chat.toolcalls import CallArguments, CallStart, ContentDelta
from agent_memory.engine.requests import Failed, Finished, GenerationRequest, TextDelta, Usage

router = APIRouter()


def new_id(prefix: str) -> str:
    return f"{prefix}_{secrets.token_hex(16)}"


def usage_dict(usage: Usage) -> dict:
    return {
        "input_tokens": usage.prompt_tokens,
        "input_tokens_details": {
            "cached_tokens": usage.cached_tokens,
            "cache_write_tokens": 0,
            "hot_tokens": usage.hot_tokens,
            "warm_tokens": usage.warm_tokens,
        },
        "output_tokens": usage.completion_tokens,
        "output_tokens_details": {"reasoning_tokens": 0},
        "total_tokens": usage.prompt_tokens + usage.completion_tokens,
    }


def message_item(item_id: str, text: str, status: str = "completed") -> dict:
    part = {"type": "output_text", "text": text, "annotations": [], "logprobs": []}
    return {"id": item_id, "type": "message", "status": status, "role": "assistant", "content": [part] if status == "completed" else []}


def call_item(item_id: str, call: ToolCall, status: str = "completed") -> dict:
    args = call.arguments if status == "completed" else ""
    return {"id": item_id, "type": "function_call", "status": status, "call_id": call.id, "name": call.name, "arguments": args}


class Draft:
    """One response as it is made: its request's echo, its output items, its status."""

    def __init__(self, state: ServerState, body: ResponsesRequest, response_id: str) -> None:
        self.state, self.body, self.id = state, body, response_id
        self.created = int(time.time())
        self.output: list[dict] = []

    def object(self, status: str, usage: Usage | None = None, reason: str | None = None) -> dict:
        body = self.body
        tools = [t.model_dump(exclude_none=True) for t in body.tools]
        choice = body.tool_choice if isinstance(body.tool_choice, str) else body.tool_choice.model_dump()
        return {
            "id": self.id,
            "object": "response",
            "created_at": self.created,
            "status": status,
            "completed_at": int(time.time()) if status in ("completed", "incomplete") else None,
            "background": False,
            "error": None,
            "incomplete_details": {"reason": "max_output_tokens"} if reason == "length" else None,
            "instructions": body.instructions,
            "max_output_tokens": body.max_output_tokens,
            "max_tool_calls": None,
            "model": self.state.model_name,
            "output": self.output if status != "in_progress" else [],
            "parallel_tool_calls": body.parallel_tool_calls,
            "previous_response_id": body.previous_response_id,
            "prompt_cache_key": body.prompt_cache_key,
            "reasoning": {"effort": None, "summary": None},
            "store": body.store,
            "temperature": body.temperature,
            "text": {"format": body.text.format.model_dump(by_alias=True, exclude_none=True), "verbosity": "medium"},
            "tool_choice": choice,
            "tools": tools,
            "top_p": body.top_p,
            "truncation": "disabled",
            "usage": usage_dict(usage) if usage is not None else None,
            "user": body.user,
            "metadata": body.metadata or {},
        }

    @staticmethod
    def status(finished: Finished) -> str:
        return "incomplete" if finished.reason == "length" else "completed"


def _reply(content: str, calls: list[ToolCall]) -> Message:
    """This turn's output as the next turn will render it (text as written, then calls)."""
    return Message("assistant", content, list(calls))


@router.post("/v1/responses")
async def create_response(body: ResponsesRequest, request: Request, state: ServerState = Depends(ready_state)):
    tenant = pipeline.tenant(request)
    context: list[Message] = []
    if body.previous_response_id is not None:
        previous = state.responses.get(tenant, body.previous_response_id)
        if previous is None:
            raise APIError(
                400,
                f"Previous response with id '{body.previous_response_id}' not found.",
                param="previous_response_id",
                code="previous_response_not_found",
            )
        context = list(previous.context)
    context += input_messages(body.input)
    tools, choice, output_format = body.conversation_tools()
    system = [Message("system", body.instructions)] if body.instructions else []
    conv = Conversation(system + context, tools, choice, body.parallel_tool_calls, output_format)
    prepared = await pipeline.prepare_chat(state, conv, ("input", "tools", "text.format"))
    draft = Draft(state, body, new_id("resp"))
    if body.store:
        agent, kind = draft.id, "response"  # the response is the unit of memory
    else:
        agent = pipeline.agent_id(
            [
                ("prompt_cache_key", body.prompt_cache_key),
                ("X-Agent-Id", pipeline.utf8_header(request, "X-Agent-Id")),
                ("user", body.user),
                ("metadata.user_id", (body.metadata or {}).get("user_id")),
            ]
        )
        kind = "agent"
    sampling = {"temperature": body.temperature, "top_p": body.top_p}
    generation = pipeline.generation_request(
        state, prepared.prompt, agent, body.max_output_tokens, sampling, request, "input", prepared.grammar, body.cache_salt
    )
    generation.agent_kind = kind
    parser = tool_parser(state, conv)

    def keep(content: str, calls: list[ToolCall], finished: Finished) -> dict:
        result = draft.object(Draft.status(finished), finished.usage, finished.reason)
        if body.store:
            state.responses.put(StoredResponse(draft.id, tenant, context + [_reply(content, calls)], result))
        return result

    if body.stream:
        return StreamingResponse(_stream(state, generation, draft, parser, keep), media_type="text/event-stream")
    collected = await pipeline.collect_text(state, generation, request)
    if collected is None:
        return Response(status_code=499)
    text, finished = collected
    content, calls = parser.split(text) if parser else (text, [])
    if content or not calls:
        draft.output.append(message_item(new_id("msg"), content))
    draft.output += [call_item(new_id("fc"), c) for c in calls]
    return keep(content, calls, finished)


async def _stream(state: ServerState, generation: GenerationRequest, draft: Draft, parser, keep) -> AsyncIterator[str]:
    """The `response.*` events: created and in_progress at once, then each output item opened,
    filled (text deltas or argument deltas) and closed in turn, then completed."""
    seq = 0

    def event(kind: str, **fields) -> str:
        nonlocal seq
        payload = {"type": kind, "sequence_number": seq, **fields}
        seq += 1
        return f"event: {kind}\ndata: {json.dumps(payload)}\n\n"

    text_parts: list[str] = []  # the message item's text so far, when one is open
    open_item: dict | None = None
    content: list[str] = []
    calls: list[ToolCall] = []

    def close() -> list[str]:
        nonlocal open_item
        if open_item is None:
            return []
        index, item = len(draft.output) - 1, open_item
        open_item = None
        if item["type"] == "message":
            text = "".join(text_parts)
            part = {"type": "output_text", "text": text, "annotations": [], "logprobs": []}
            done = message_item(item["id"], text)
            draft.output[index] = done
            ids = {"item_id": item["id"], "output_index": index, "content_index": 0}
            return [
                event("response.output_text.done", **ids, text=text, logprobs=[]),
                event("response.content_part.done", **ids, part=part),
                event("response.output_item.done", output_index=index, item=done),
            ]
        call = ToolCall(item["call_id"], item["name"], "".join(text_parts))
        calls.append(call)
        done = call_item(item["id"], call)
        draft.output[index] = done
        return [
            event("response.function_call_arguments.done", item_id=item["id"], output_index=index, arguments=call.arguments, name=call.name),
            event("response.output_item.done", output_index=index, item=done),
        ]

    started_calls = 0

    def feed(out) -> list[str]:
        nonlocal open_item, started_calls
        frames: list[str] = []
        started_calls += isinstance(out, CallStart)
        if isinstance(out, CallStart) or (isinstance(out, ContentDelta) and (open_item is None or open_item["type"] != "message")):
            frames += close()
            text_parts.clear()
            if isinstance(out, CallStart):
                open_item = call_item(new_id("fc"), ToolCall(out.id, out.name, ""), "in_progress")
            else:
                open_item = message_item(new_id("msg"), "", "in_progress")
            draft.output.append(open_item)
            frames.append(event("response.output_item.added", output_index=len(draft.output) - 1, item=open_item))
            if open_item["type"] == "message":
                part = {"type": "output_text", "text": "", "annotations": [], "logprobs": []}
                ids = {"item_id": open_item["id"], "output_index": len(draft.output) - 1, "content_index": 0}
                frames.append(event("response.content_part.added", **ids, part=part))
        if isinstance(out, ContentDelta):
            text_parts.append(out.text)
            content.append(out.text)
            ids = {"item_id": open_item["id"], "output_index": len(draft.output) - 1, "content_index": 0}
            frames.append(event("response.output_text.delta", **ids, delta=out.text, logprobs=[]))
        elif isinstance(out, CallArguments):
            text_parts.append(out.text)
            frames.append(event("response.function_call_arguments.delta", item_id=open_item["id"], output_index=len(draft.output) - 1, delta=out.text))
        return frames

    yield event("response.created", response=draft.object("in_progress"))
    yield event("response.in_progress", response=draft.object("in_progress"))
    async for engine_event in pipeline.events(state, generation):
        if isinstance(engine_event, TextDelta):
            outs = parser.feed(engine_event.text) if parser else [ContentDelta(engine_event.text)]
            for out in outs:
                for frame in feed(out):
                    yield frame
        elif isinstance(engine_event, Failed):
            yield event("error", code=engine_event.code, message=engine_event.message, param=None)
            failed = {**draft.object("failed"), "error": {"code": "server_error", "message": engine_event.message}}
            yield event("response.failed", response=failed)
            return
        else:
            outs, unfinished = parser.finish() if parser else ([], "")
            if unfinished and (parser is None or started_calls == len(parser.calls)):
                outs.append(ContentDelta(unfinished))  # cut off before its name was whole: text
            # (cut off in its arguments, a call keeps its item: the stream has sent it)
            for out in outs:
                for frame in feed(out):
                    yield frame
            for frame in close():
                yield frame
            result = keep("".join(content), calls, engine_event)
            yield event("response.completed" if result["status"] == "completed" else "response.incomplete", response=result)


@router.get("/v1/responses/{response_id}")
async def get_response(response_id: str, request: Request, state: ServerState = Depends(ready_state)) -> dict:
    stored = state.responses.get(pipeline.tenant(request), response_id)
    if stored is None:
        raise APIError(404, f"No response with id '{response_id}'.", param="response_id", code="response_not_found")
    return stored.body


@router.delete("/v1/responses/{response_id}")
async def delete_response(response_id: str, request: Request, state: ServerState = Depends(ready_state)) -> dict:
    tenant = pipeline.tenant(request)
    if not state.responses.delete(tenant, response_id):
        raise APIError(404, f"No response with id '{response_id}'.", param="response_id", code="response_not_found")
    return {"id": response_id, "object": "response.deleted", "deleted": True}

"""A Responses request's conversation: the stored chain it continues (`previous_response_id`),
its input items as messages, its instructions (never carried over, as OpenAI specifies), tools
and output format."""

from __future__ import annotations

from typing import Any

from agent_memory.api.errors import APIError
from agent_memory.api.responses.schemas import ResponsesRequest
from agent_memory.api.responses.store import ResponseStore
from agent_memory.api.sealing import TenantSeal
from agent_memory.chat.conversation import Conversation, Message, ToolCall, with_parts
from agent_memory.chat.images import NO_FILES, ImageError, source_of_url
from agent_memory.chat.freeform import freeform_arguments


def context(body: ResponsesRequest, store: ResponseStore, tenant: str, seal: TenantSeal) -> list[Message]:
    """What the response continues from, instructions excluded: the chain before it, then its input."""
    earlier: list[Message] = []
    if body.previous_response_id is not None:
        previous = store.get(tenant, body.previous_response_id)
        if previous is None:
            raise APIError(
                400,
                f"Previous response with id '{body.previous_response_id}' not found.",
                param="previous_response_id",
                code="previous_response_not_found",
            )
        earlier = list(previous.context)
    return earlier + input_messages(body.input, seal, earlier)


def conversation(body: ResponsesRequest, context: list[Message]) -> Conversation:
    """The conversation the model continues: the instructions, the context, the tools."""
    tools, choice, output_format = body.conversation_tools()
    system = [Message("system", body.instructions)] if body.instructions else []
    return Conversation(system + context, tools, choice, body.parallel_tool_calls, output_format, body.thinking())


def _parts(content: Any, param: str, images: bool) -> list:
    """A message's content: a string, or input_text / output_text parts and, where `images`
    (a user message, a function's output: Codex's view_image), input_image parts as their
    sources (chat/images.py; a file_id is refused: there is no files API)."""
    if isinstance(content, str):
        return [content]
    if not isinstance(content, list):
        raise APIError(400, f"{param} must be a string or a list of content parts", param=param)
    parts = []
    for i, part in enumerate(content):
        kind = part.get("type") if isinstance(part, dict) else None
        where = f"{param}.{i}"
        if kind in ("input_image", "input_file") and images:
            if part.get("file_id") is not None or kind == "input_file":
                raise ImageError(NO_FILES, where)
            parts.append(source_of_url(part.get("image_url"), where))
        elif kind in ("input_text", "output_text", "text") and isinstance(part.get("text"), str):
            parts.append(part["text"])
        else:
            taken = "text and input_image parts are" if images else "only text parts are"
            raise APIError(400, f"{where}: a part of type '{kind}': {taken} taken here", param=where)
    return parts


def input_messages(items: str | list[dict[str, Any]], seal: TenantSeal, earlier: list[Message]) -> list[Message]:
    """Input items as messages: message items by role, function calls as an assistant turn's
    tool calls, function outputs as tool results (each answering a call made in them or in
    `earlier`, the chain they continue), a reasoning item as the reasoning of the assistant
    turn it opens (its `encrypted_content` opened by `seal`). A user message that says
    nothing, and an output that answers no call, are refused, as OpenAI refuses them."""
    if isinstance(items, str):
        if not items:
            raise APIError(400, "input: a user message needs content: it is empty", param="input")
        return [Message("user", items)]
    calls = {c.id for m in earlier for c in m.tool_calls}
    out: list[Message] = []
    for i, item in enumerate(items):
        param = f"input.{i}"
        kind = item.get("type", "message")
        if kind == "message":
            role = item.get("role")
            if role not in ("user", "system", "developer", "assistant"):
                raise APIError(400, f"{param}.role must be user, system, developer or assistant", param=f"{param}.role")
            message = with_parts(role, _parts(item.get("content", ""), f"{param}.content", role == "user"), "")
            if role == "user" and not message.content and not message.parts:
                where = f"{param}.content"
                raise APIError(400, f"{where}: a user message needs content: it is empty", param=where)
            if role == "assistant" and out and _reasoning_only(out[-1]):
                out[-1].content = message.content
            else:
                message.role = "system" if role == "developer" else role
                out.append(message)
        elif kind == "function_call":
            try:
                name = f"{item['namespace']}.{item['name']}" if item.get("namespace") else str(item["name"])
                call = ToolCall(str(item["call_id"]), name, str(item.get("arguments", "{}")))
            except KeyError as e:
                raise APIError(400, f"{param}: a function_call needs {e.args[0]}", param=f"{param}.{e.args[0]}") from e
            _add_call(out, call)
            calls.add(call.id)
        elif kind == "custom_tool_call":
            if not isinstance(item.get("call_id"), str) or not isinstance(item.get("name"), str):
                raise APIError(400, f"{param}: a custom_tool_call needs call_id and name", param=param)
            _add_call(out, ToolCall(item["call_id"], item["name"], freeform_arguments(str(item.get("input", "")))))
            calls.add(item["call_id"])
        elif kind in ("function_call_output", "custom_tool_call_output"):
            if "call_id" not in item:
                raise APIError(400, f"{param}: a {kind} needs call_id", param=f"{param}.call_id")
            if str(item["call_id"]) not in calls:
                why = f"no call with call_id {str(item['call_id'])!r} was made before this output"
                raise APIError(400, f"{param}.call_id: {why}", param=f"{param}.call_id")
            output = _parts(item.get("output", ""), f"{param}.output", True)
            out.append(with_parts("tool", output or [""], "", tool_call_id=str(item["call_id"])))
        elif kind == "reasoning":
            _check_reasoning_parts(item, param)
            out.append(Message("assistant", reasoning=_reasoning_text(item, param, seal)))
        else:
            raise APIError(400, f"{param} has type '{kind}', which this server does not take", param=f"{param}.type")
    return out


def _add_call(out: list[Message], call: ToolCall) -> None:
    """A call item as one of the calls of the assistant turn it follows (after its text, if any)."""
    if out and out[-1].role == "assistant":
        out[-1].tool_calls.append(call)
    else:
        out.append(Message("assistant", "", [call]))


def _reasoning_only(m: Message) -> bool:
    return m.role == "assistant" and not m.content and not m.tool_calls and bool(m.reasoning)


def _check_reasoning_parts(item: dict[str, Any], param: str) -> None:
    """A reasoning item's `content` and `summary`, where given: lists of parts with text."""
    for key in ("content", "summary"):
        parts = item.get(key)
        if parts is None:
            continue
        if not isinstance(parts, list):
            raise APIError(400, f"{param}.{key} must be a list of parts with text", param=f"{param}.{key}")
        for k, part in enumerate(parts):
            if not isinstance(part, dict) or not isinstance(part.get("text"), str):
                raise APIError(400, f"{param}.{key}.{k} must be a part with text", param=f"{param}.{key}.{k}")


def _reasoning_text(item: dict[str, Any], param: str, seal: TenantSeal) -> str:
    """A reasoning item's text: what its `encrypted_content` holds (a client that keeps only
    that: Codex with `store: false`), which must open as this server sealed it for this tenant
    (a 400 naming it otherwise); else its reasoning_text parts (as this server returns them),
    else its summary."""
    if item.get("encrypted_content") is not None:
        return seal.open(item["encrypted_content"], f"{param}.encrypted_content")
    parts = item.get("content") or item.get("summary") or []
    return "".join(p.get("text", "") for p in parts if isinstance(p, dict) and isinstance(p.get("text"), str))

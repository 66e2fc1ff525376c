"""The reply side of the Responses wire format (respond.py): usage, and the engine's events as
output items — reasoning with its text, messages with their text, function calls with their
arguments — the `response.*` events a stream sends about them, and the output a JSON reply holds. One `Reply` builds both,
so a stream and a JSON reply cannot differ (the other wire formats' replies do the same)."""

from __future__ import annotations

import json
import secrets
from collections.abc import Callable

from agent_memory.api.logprobs import LogprobWriter
from agent_memory.cache_miss import usage_field
from agent_memory.chat.conversation import Message, ToolCall
from agent_memory.chat.freeform import freeform_input
from agent_memory.chat.events import CallArguments, CallCutOff, CallStart, ContentDelta, OutputEvent, ReasoningDelta
from agent_memory.engine.requests import Finished, TextDelta, Usage


def usage_dict(usage: Usage, reasoning_tokens: int = 0) -> dict:
    """Responses' usage; beside the cached tokens, where they came from (hot, warm) and why the
    rest was not reused (`cache_miss`: docs/usage.md, "Why a request missed")."""
    return {
        "input_tokens": usage.prompt_tokens,
        "input_tokens_details": {
            "cached_tokens": usage.cached_tokens,
            "cache_write_tokens": 0,
            "hot_tokens": usage.hot_tokens,
            "warm_tokens": usage.warm_tokens,
            **usage_field(usage.miss),
        },
        "output_tokens": usage.completion_tokens,
        "output_tokens_details": {"reasoning_tokens": reasoning_tokens},
        "total_tokens": usage.prompt_tokens + usage.completion_tokens,
    }


def new_id(prefix: str) -> str:
    return f"{prefix}_{secrets.token_hex(16)}"


def _part(text: str, logprobs: list[dict] | None = None) -> dict:
    return {"type": "output_text", "text": text, "annotations": [], "logprobs": logprobs or []}


def message_item(item_id: str, text: str, status: str = "completed", logprobs: list[dict] | None = None) -> dict:
    content = [_part(text, logprobs)] if status == "completed" else []
    return {"id": item_id, "type": "message", "status": status, "role": "assistant", "content": content}


def reasoning_item(
    item_id: str, text: str, status: str = "completed", seal: Callable[[str], str] | None = None
) -> dict:
    """A reasoning item; with `seal` (the request's `include` asked for
    `reasoning.encrypted_content`): with its text sealed in `encrypted_content` too (api/sealing.py)."""
    content = [{"type": "reasoning_text", "text": text}] if status == "completed" else []
    item = {"id": item_id, "type": "reasoning", "status": status, "summary": [], "content": content}
    if seal is not None and status == "completed":
        item["encrypted_content"] = seal(text)
    return item


def call_item(item_id: str, call: ToolCall, status: str = "completed", namespaced: dict | None = None) -> dict:
    """A function_call item; a namespaced tool's call is its own name and its `namespace`."""
    args = call.arguments if status == "completed" else ""
    item = {
        "id": item_id,
        "type": "function_call",
        "status": status,
        "call_id": call.id,
        "name": call.name,
        "arguments": args,
    }
    if namespaced and call.name in namespaced:
        item["namespace"], item["name"] = namespaced[call.name]
    return item


def custom_call_item(item_id: str, call: ToolCall, status: str = "completed") -> dict:
    """A custom_tool_call item: the freeform tool's input, raw (chat/freeform.py)."""
    text = freeform_input(call.arguments) if status == "completed" else ""
    return {
        "id": item_id,
        "type": "custom_tool_call",
        "status": status,
        "call_id": call.id,
        "name": call.name,
        "input": text,
    }


class Reply:
    """One response's output, built from the engine's events. Items are opened, filled and
    closed in the order the model writes them; a reply with no item at all gets an empty
    message, so that every response has one."""

    def __init__(
        self,
        output: list[dict],
        reader,
        namespaced: dict[str, tuple[str, str]] | None = None,
        seal: Callable[[str], str] | None = None,
        custom: set[str] | None = None,
        logprobs: LogprobWriter | None = None,
    ) -> None:
        self.output = output  # the response's output items, filled in place
        self.reader = reader  # chat/reader.py's ReplyReader, or harmony's
        self.namespaced = namespaced or {}  # the model's name of a namespaced tool -> (namespace, name)
        self.seal = seal  # reasoning items carry `encrypted_content`, sealed by it
        self.custom = custom or set()  # the freeform tools: calls as custom_tool_call items
        self.open: dict | None = None  # the item being written
        self.parts: list[str] = []  # its text, or its arguments, so far
        self.content: list[str] = []  # the text of every message item
        self.reasoning: list[str] = []  # the text of every reasoning item
        self.calls: list[ToolCall] = []
        self.sequence = 0
        self.writer = logprobs  # None: no logprobs asked for (`include`, `top_logprobs`)
        self.pending: list[dict] = []  # logprobs of tokens read but not yet in an output_text delta
        self.logprobs: list[dict] = []  # the open message's
        self.whole = False  # its Finished read: every item is closed

    @property
    def text(self) -> str:
        return "".join(self.content)

    def said(self) -> Message:
        """The turn as the conversation holds it next: stored with the response, and what its
        items read back as (conversation.py)."""
        return Message("assistant", self.text, list(self.calls), reasoning="".join(self.reasoning))

    def event(self, kind: str, **fields) -> str:
        """One SSE event, numbered in the order they are sent."""
        payload = {"type": kind, "sequence_number": self.sequence, **fields}
        self.sequence += 1
        return f"event: {kind}\ndata: {json.dumps(payload)}\n\n"

    def feed(self, event: TextDelta | Finished) -> list[str]:
        """The SSE events for one engine event; after Finished, every item is closed."""
        if self.writer is not None and isinstance(event, TextDelta) and event.logprobs:
            self.pending += self.writer.entries(event.logprobs)
        outs = self.reader.read(event.text if isinstance(event, TextDelta) else None)
        if outs and not any(isinstance(out, ContentDelta) for out in outs):
            self.pending = []  # reasoning's or a call's tokens: no output_text's
        frames = [frame for out in outs for frame in self._write(out)]
        if isinstance(event, Finished):
            self.whole = True
            if not self.output:
                frames += self._start(message_item(new_id("msg"), "", "in_progress"))
            frames += self._close()
        return frames

    def _write(self, out: OutputEvent) -> list[str]:
        if isinstance(out, CallStart):
            call = ToolCall(out.id, out.name, "")
            if out.name in self.custom:
                return self._start(custom_call_item(new_id("ctc"), call, "in_progress"))
            return self._start(call_item(new_id("fc"), call, "in_progress", self.namespaced))
        if isinstance(out, CallCutOff):
            self.parts = [out.arguments]
            return []
        frames = []
        if isinstance(out, ContentDelta) and (self.open is None or self.open["type"] != "message"):
            frames = self._start(message_item(new_id("msg"), "", "in_progress"))
        if isinstance(out, ReasoningDelta) and (self.open is None or self.open["type"] != "reasoning"):
            frames = self._start(reasoning_item(new_id("rs"), "", "in_progress"))
        self.parts.append(out.text)
        index = len(self.output) - 1
        if isinstance(out, ReasoningDelta):
            self.reasoning.append(out.text)
            ids = {"item_id": self.open["id"], "output_index": index, "content_index": 0}
            return frames + [self.event("response.reasoning_text.delta", **ids, delta=out.text)]
        if isinstance(out, CallArguments):
            if self.open["type"] == "custom_tool_call":
                return frames  # JSON-escaped as the model writes it: the raw input goes out whole, at its end
            return frames + [
                self.event(
                    "response.function_call_arguments.delta",
                    item_id=self.open["id"],
                    output_index=index,
                    delta=out.text,
                )
            ]
        self.content.append(out.text)
        logprobs, self.pending = self.pending, []
        self.logprobs += logprobs
        ids = {"item_id": self.open["id"], "output_index": index, "content_index": 0}
        return frames + [self.event("response.output_text.delta", **ids, delta=out.text, logprobs=logprobs)]

    def _start(self, item: dict) -> list[str]:
        frames = self._close()
        self.open = item
        self.parts = []
        self.logprobs = []
        self.output.append(item)
        index = len(self.output) - 1
        frames.append(self.event("response.output_item.added", output_index=index, item=item))
        if item["type"] == "message":
            ids = {"item_id": item["id"], "output_index": index, "content_index": 0}
            frames.append(self.event("response.content_part.added", **ids, part=_part("")))
        return frames

    def _close(self) -> list[str]:
        if self.open is None:
            return []
        index, item, text = len(self.output) - 1, self.open, "".join(self.parts)
        self.open = None
        if item["type"] == "reasoning":
            done = self.output[index] = reasoning_item(item["id"], text, seal=self.seal)
            ids = {"item_id": item["id"], "output_index": index, "content_index": 0}
            return [
                self.event("response.reasoning_text.done", **ids, text=text),
                self.event("response.output_item.done", output_index=index, item=done),
            ]
        if item["type"] == "message":
            done = self.output[index] = message_item(item["id"], text, logprobs=self.logprobs)
            ids = {"item_id": item["id"], "output_index": index, "content_index": 0}
            return [
                self.event("response.output_text.done", **ids, text=text, logprobs=self.logprobs),
                self.event("response.content_part.done", **ids, part=_part(text, self.logprobs)),
                self.event("response.output_item.done", output_index=index, item=done),
            ]
        name = f"{item['namespace']}.{item['name']}" if "namespace" in item else item["name"]  # as the model knows it
        call = ToolCall(item["call_id"], name, text)
        self.calls.append(call)
        if item["type"] == "custom_tool_call":
            done = self.output[index] = custom_call_item(item["id"], call)
            ids = {"item_id": item["id"], "output_index": index}
            return [
                self.event("response.custom_tool_call_input.delta", **ids, delta=done["input"]),
                self.event("response.custom_tool_call_input.done", **ids, input=done["input"]),
                self.event("response.output_item.done", output_index=index, item=done),
            ]
        done = self.output[index] = call_item(item["id"], call, namespaced=self.namespaced)
        return [
            self.event(
                "response.function_call_arguments.done",
                item_id=item["id"],
                output_index=index,
                arguments=text,
                name=done["name"],
            ),
            self.event("response.output_item.done", output_index=index, item=done),
        ]

"""The reply side of the OpenAI wire format (chat.py, completion.py): usage, model objects, and the engine's
events as a chat completion — the chunks a stream sends and the message a JSON reply holds.
One `ChatReply` builds both, reading generated text through the model's reply reader
(chat/reader.py) as the Anthropic and Responses replies do, so a reply ends alike in all three
(a call cut off in its arguments: a call with `{}` arguments, never its markup as content).
Reasoning is `reasoning_content`, as vLLM and DeepSeek return it."""

from __future__ import annotations

from dataclasses import replace

from agent_memory.api.logprobs import LogprobWriter
from agent_memory.cache_miss import usage_field
from agent_memory.chat.conversation import Message, ToolCall
from agent_memory.chat.events import CallCutOff, CallStart, ContentDelta, OutputEvent, ReasoningDelta
from agent_memory.chat.images import ImageLimits
from agent_memory.engine.protocol import ModelFacts
from agent_memory.engine.requests import Finished, TextDelta, Usage


def usage_dict(usage: Usage, reasoning_tokens: int | None = None) -> dict:
    """OpenAI's usage; `reasoning_tokens` (chat): how many of the completion's tokens were
    reasoning (its text as the tokenizer writes it, at most the completion's). Speculative
    decoding's proposed tokens, accepted and rejected, as OpenAI and vLLM report predictions;
    `cache_miss`: why the prompt was not reused further (docs/usage.md, "Why a request missed")."""
    out = {
        "prompt_tokens": usage.prompt_tokens,
        "completion_tokens": usage.completion_tokens,
        "total_tokens": usage.prompt_tokens + usage.completion_tokens,
        "prompt_tokens_details": {
            "cached_tokens": usage.cached_tokens,
            "hot_tokens": usage.hot_tokens,
            "warm_tokens": usage.warm_tokens,
            **usage_field(usage.miss),
        },
    }
    details = {
        "accepted_prediction_tokens": usage.accepted_prediction_tokens,
        "rejected_prediction_tokens": usage.rejected_prediction_tokens,
    }
    if reasoning_tokens is not None:
        details["reasoning_tokens"] = reasoning_tokens
    out["completion_tokens_details"] = details
    return out


def total_usage(finished: list[Finished]) -> Usage:
    """n samples' usage as OpenAI counts it: the prompt once, the completions added up."""
    return replace(
        finished[0].usage,
        completion_tokens=sum(f.usage.completion_tokens for f in finished),
        accepted_prediction_tokens=sum(f.usage.accepted_prediction_tokens for f in finished),
        rejected_prediction_tokens=sum(f.usage.rejected_prediction_tokens for f in finished),
    )


def model_object(
    model_id: str, root: str, created: int, facts: ModelFacts | None, images: ImageLimits | None = None
) -> dict:
    """A model object; `root` names the served model an alias stands for, `max_model_len` its
    context (as vLLM's do); once loaded, its `kind` ("chat" or "embedding"), a chat model's
    `sampling_defaults` (what a request that leaves out temperature, top_p or top_k samples with:
    its generation_config.json; `max_tokens` where --default-max-tokens bounds a request that
    sends no limit), what it takes as `input` (text, and images for a vision model, with the
    operator's `image_limits`), an embedding model's `dimensions`."""
    obj = {"id": model_id, "object": "model", "created": created, "owned_by": "agent-memory", "root": root}
    if facts is not None and facts.embedding is not None:
        obj.update(kind="embedding", max_model_len=facts.context_length, dimensions=facts.embedding.dimensions)
    elif facts is not None:
        defaults = dict(facts.sampling_defaults)
        if facts.default_max_tokens is not None:
            defaults["max_tokens"] = facts.default_max_tokens
        obj.update(kind="chat", max_model_len=facts.context_length, sampling_defaults=defaults)
        obj["input"] = ["text", "image"] if facts.takes_images else ["text"]
        if facts.takes_images and images is not None:
            obj["image_limits"] = images.described()
    return obj


def text_choice(text: str, finish_reason: str | None = None, index: int = 0, logprobs: dict | None = None) -> dict:
    """A text completion's choice, whole or as a stream's chunk."""
    return {"index": index, "text": text, "logprobs": logprobs, "finish_reason": finish_reason}


def call_dict(call: ToolCall) -> dict:
    return {"id": call.id, "type": "function", "function": {"name": call.name, "arguments": call.arguments}}


class ChatReply:
    """One chat completion, built from the engine's events: its stream's chunks (text as
    content deltas; a call's first delta with its index, id, type and name, then fragments of
    its arguments) and, once finished, its JSON message."""

    def __init__(self, reader, count=len, index: int = 0, logprobs: LogprobWriter | None = None) -> None:
        self.reader = reader  # chat/reader.py's ReplyReader, or harmony's
        self.count = count  # text -> its tokens (the reasoning's, for usage)
        self.index = index  # which of the request's n choices
        self.writer = logprobs  # None: the request asked for no logprobs
        self.content: list[str] = []
        self.reasoning: list[str] = []
        self.calls: list[ToolCall] = []  # as written so far; a cut-off one with `{}` arguments
        self.logprobs: list[dict] = []  # every token's, for the JSON reply
        self.pending: list[dict] = []  # those the stream has not sent: on its next chunk
        self.whole = False  # its Finished read: the reply is all here

    def feed(self, event: TextDelta | Finished) -> list[dict]:
        """The chunks for one engine event: deltas (the first with the logprobs of the tokens
        read since the last chunk), and after Finished the finish reason."""
        if self.writer is not None and isinstance(event, TextDelta) and event.logprobs:
            entries = self.writer.entries(event.logprobs)
            self.logprobs += entries
            self.pending += entries
        outs = self.reader.read(event.text if isinstance(event, TextDelta) else None)
        chunks = [self._chunk(delta) for out in outs if (delta := self._write(out)) is not None]
        if isinstance(event, Finished):
            self.whole = True
            chunks.append(self._chunk({}, self.finish_reason(event)))
        if chunks and self.pending:
            chunks[0]["choices"][0]["logprobs"] = {"content": self.pending, "refusal": None}
            self.pending = []
        return chunks

    def choice(self, finished: Finished) -> dict:
        """The JSON reply's choice."""
        logprobs = {"content": self.logprobs, "refusal": None} if self.writer is not None else None
        return {
            "index": self.index,
            "message": self.message(),
            "logprobs": logprobs,
            "finish_reason": self.finish_reason(finished),
        }

    def first_chunk(self) -> dict:
        """What a chat stream sends first for each choice: the assistant's role."""
        return self._chunk({"role": "assistant", "content": ""})

    def _chunk(self, delta: dict, finish_reason: str | None = None) -> dict:
        choice = {"index": self.index, "delta": delta, "logprobs": None, "finish_reason": finish_reason}
        return {"choices": [choice]}

    def message(self) -> dict:
        """The JSON reply's message: content (None when there are calls and no text), calls."""
        content = "".join(self.content)
        message: dict = {"role": "assistant", "content": content if content or not self.calls else None}
        if self.reasoning:
            message["reasoning_content"] = "".join(self.reasoning)
        if self.calls:
            message["tool_calls"] = [call_dict(c) for c in self.calls]
        return message

    def returned(self) -> Message | None:
        """The turn as its client sends it back (chat.conversation reads a message so), once whole."""
        if not self.whole:
            return None
        return Message("assistant", "".join(self.content), list(self.calls), reasoning="".join(self.reasoning))

    def reasoning_tokens(self, usage: Usage) -> int:
        """How many of its completion's tokens were reasoning."""
        reasoning = self.count("".join(self.reasoning)) if self.reasoning else 0
        return min(reasoning, usage.completion_tokens)

    def finish_reason(self, finished: Finished) -> str:
        whole_calls = self.reader.calls
        return "tool_calls" if whole_calls and finished.reason == "stop" else finished.reason

    def _write(self, out: OutputEvent) -> dict | None:
        if isinstance(out, ReasoningDelta):
            self.reasoning.append(out.text)
            return {"reasoning_content": out.text}
        if isinstance(out, ContentDelta):
            self.content.append(out.text)
            return {"content": out.text}
        if isinstance(out, CallStart):
            self.calls.append(ToolCall(out.id, out.name, ""))
            function = {"name": out.name, "arguments": ""}
            return {"tool_calls": [{"index": out.index, "id": out.id, "type": "function", "function": function}]}
        last = self.calls[-1]
        if isinstance(out, CallCutOff):  # its fragments are sent; the JSON reply holds no broken call
            self.calls[-1] = ToolCall(last.id, last.name, out.arguments)
            return None
        self.calls[-1] = ToolCall(last.id, last.name, last.arguments + out.text)
        return {"tool_calls": [{"index": out.index, "function": {"arguments": out.text}}]}


"""One internal chat request, whatever wire format it came in: messages (with tool calls and
tool results), the tools on offer, and what the output must be."""

from __future__ import annotations

import secrets
from dataclasses import dataclass, field
from typing import Literal


def new_call_id() -> str:
    return "call_" + secrets.token_hex(12)


@dataclass(frozen=True)
class ToolCall:
    id: str
    name: str
    arguments: str  # a JSON object, as text: exactly what the model wrote (or the client sent back)


@dataclass
class Message:
    role: Literal["system", "user", "assistant", "tool"]
    content: str = ""
    tool_calls: list[ToolCall] = field(default_factory=list)
    tool_call_id: str | None = None  # role "tool": the call this result answers
    reasoning: str = ""  # role "assistant": its thinking, as the reply returned it
    # With images (roles "user" and "tool"): the content in order, text (str) and images
    # (chat/images.py: an ImageSource as read, its ChatImage once loaded); empty: `content` is all.
    parts: list = field(default_factory=list)


def with_parts(role: str, parts: list, joiner: str, **fields) -> Message:
    """A message of text and images: `content` its text, texts joined by `joiner`; `parts`,
    adjacent texts so joined, kept only where an image is among them."""
    merged: list = []
    for p in parts:
        if isinstance(p, str) and merged and isinstance(merged[-1], str):
            merged[-1] = merged[-1] + joiner + p
        else:
            merged.append(p)
    texts = [p for p in parts if isinstance(p, str)]
    return Message(role, joiner.join(texts), parts=merged if len(texts) < len(parts) else [], **fields)


@dataclass(frozen=True)
class Tool:
    name: str
    description: str
    parameters: dict  # a JSON schema (type object)


@dataclass(frozen=True)
class ToolChoice:
    mode: Literal["auto", "none", "required", "named"] = "auto"
    name: str | None = None  # mode "named": the one function to call


@dataclass(frozen=True)
class OutputFormat:
    """What the output must be besides tool calls: free text, any JSON object, or JSON that
    validates against a schema."""

    kind: Literal["text", "json_object", "json_schema"] = "text"
    schema: dict | None = None


@dataclass(frozen=True)
class Thinking:
    """What a request asks of a thinking model: on or off (None: the template's default),
    an effort (low, medium, high), and the chat template variables it passed itself."""

    enabled: bool | None = None
    effort: str | None = None
    template_kwargs: dict = field(default_factory=dict)

    def kwargs(self) -> dict:
        """Variables for apply_chat_template: Qwen3's and GLM's `enable_thinking`, gpt-oss's
        `reasoning_effort`; the request's own `chat_template_kwargs` win (variables only, and
        small: render.check_variables refused the renderer's own arguments at the route)."""
        out: dict = {}
        if self.enabled is not None:  # and DeepSeek-V3.1's name for it
            out["enable_thinking"] = out["thinking"] = self.enabled
        if self.effort is not None:
            out["reasoning_effort"] = self.effort
        return {**out, **self.template_kwargs}


EFFORTS = {"minimal": "low", "xhigh": "high"}  # OpenAI's efforts templates lack, as the nearest they know


def effort_thinking(effort: str | None, template_kwargs: dict) -> Thinking:
    """OpenAI's `reasoning_effort` / `reasoning.effort`: "none" turns thinking off, any other
    turns it on at that effort (gpt-oss's template knows low, medium and high)."""
    if effort is None:
        return Thinking(template_kwargs=template_kwargs)
    if effort == "none":
        return Thinking(False, None, template_kwargs)
    return Thinking(True, EFFORTS.get(effort, effort), template_kwargs)


@dataclass
class Conversation:
    messages: list[Message]
    tools: list[Tool] = field(default_factory=list)
    tool_choice: ToolChoice = ToolChoice()
    parallel_tool_calls: bool = True
    output: OutputFormat = OutputFormat()
    thinking: Thinking = Thinking()

    def images(self) -> list:
        """Every image part, in the order the prompt holds them."""
        return [p for m in self.messages for p in m.parts if not isinstance(p, str)]

    def put_images(self, images: list) -> None:
        """The image parts replaced, in order, by `images` (their ChatImages, once loaded)."""
        loaded = iter(images)
        for m in self.messages:
            m.parts = [p if isinstance(p, str) else next(loaded) for p in m.parts]

    @property
    def calls_tools(self) -> bool:
        """Whether the output may hold tool calls."""
        return bool(self.tools) and self.tool_choice.mode != "none"

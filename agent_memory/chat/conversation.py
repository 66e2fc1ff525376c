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


@dataclass
class Conversation:
    messages: list[Message]
    tools: list[Tool] = field(default_factory=list)
    tool_choice: ToolChoice = ToolChoice()
    parallel_tool_calls: bool = True
    output: OutputFormat = OutputFormat()

    @property
    def calls_tools(self) -> bool:
        """Whether the output may hold tool calls."""
        return bool(self.tools) and self.tool_choice.mode != "none"

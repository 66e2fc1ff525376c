"""Anthropic Messages request bodies (`POST /v1/messages`, `/v1/messages/count_tokens`).

Unknown fields are accepted and ignored everywhere (Claude Code adds some with every release),
`cache_control` and `citations` included; content blocks the server cannot honour (images,
documents) are refused with a message naming the block."""

from __future__ import annotations

from typing import Annotated, Any, Literal

from pydantic import BaseModel, ConfigDict, Field, field_validator, model_validator
from pydantic_core import PydanticCustomError

from agent_memory.api.bodies import TOOL_NAME, RequestBody


class Block(BaseModel):
    model_config = ConfigDict(extra="allow")


class TextBlock(Block):
    type: Literal["text"]
    text: str


class ToolUseBlock(Block):
    type: Literal["tool_use"]
    id: str
    name: str
    input: dict[str, Any] = Field(default_factory=dict)


class ThinkingBlock(Block):
    """Reasoning from an earlier turn: its text goes back to the template as the turn's
    reasoning (a redacted block has none this server can read)."""

    type: Literal["thinking", "redacted_thinking"]
    thinking: str = ""
    signature: str | None = None


class ThinkingParam(BaseModel):
    """`thinking`: enabled (with a token budget, not enforced here), adaptive, or disabled."""

    model_config = ConfigDict(extra="allow")
    type: Literal["enabled", "disabled", "adaptive"]
    budget_tokens: int | None = None


class ToolResultBlock(Block):
    type: Literal["tool_result"]
    tool_use_id: str
    content: list[TextBlock] = Field(default_factory=list)
    is_error: bool = False

    @field_validator("content", mode="before")
    @classmethod
    def text_blocks(cls, v):
        return _blocks(v, ("text",))


ContentBlock = Annotated[TextBlock | ToolUseBlock | ToolResultBlock | ThinkingBlock, Field(discriminator="type")]
BLOCK_TYPES = ("text", "tool_use", "tool_result", "thinking", "redacted_thinking")


def _blocks(v: Any, kinds: tuple[str, ...]) -> Any:
    """Content as a list of blocks: a string is one text block (so a turn sent as one and
    resent as the other is the same turn). A block of a type we cannot take (an image, a
    document) is named, rather than which branch of a union failed."""
    if isinstance(v, str):
        return [{"type": "text", "text": v}]
    if isinstance(v, list):
        for i, block in enumerate(v):
            kind = block.get("type") if isinstance(block, dict) else type(block).__name__
            if kind not in kinds:
                raise PydanticCustomError(
                    "unsupported_part",
                    "content block {i} has type '{kind}': only {kinds} blocks are supported",
                    {"i": i, "kind": kind, "kinds": ", ".join(kinds)},
                )
    return v


def joined(blocks: list) -> str:
    """The text of a list of blocks, text blocks joined by a line break."""
    return "\n".join(b.text for b in blocks if isinstance(b, TextBlock))


class MessageParam(BaseModel):
    model_config = ConfigDict(extra="allow")
    role: Literal["user", "assistant", "system"]
    content: list[ContentBlock]

    @field_validator("content", mode="before")
    @classmethod
    def known_blocks(cls, v):
        return _blocks(v, BLOCK_TYPES)


class ToolParam(BaseModel):
    model_config = ConfigDict(extra="allow")
    name: str = Field(pattern=TOOL_NAME)
    description: str = ""
    input_schema: dict[str, Any]
    type: Literal["custom"] | None = None  # server tools (bash_…, web_search_…) are not run here


class ToolChoiceParam(BaseModel):
    model_config = ConfigDict(extra="allow")
    type: Literal["auto", "any", "tool", "none"]
    name: str | None = None
    disable_parallel_tool_use: bool = False


class OutputFormatParam(BaseModel):
    model_config = ConfigDict(extra="allow")
    type: Literal["json_schema"]
    schema_: dict[str, Any] = Field(alias="schema")


class OutputConfig(BaseModel):
    model_config = ConfigDict(extra="allow")
    format: OutputFormatParam | None = None


class Metadata(BaseModel):
    model_config = ConfigDict(extra="allow")
    user_id: str | None = None


class PromptFields(RequestBody):
    """What a prompt is made of: count_tokens takes these alone."""

    model: str
    messages: list[MessageParam] = Field(min_length=1)
    system: list[TextBlock] | None = None
    tools: list[ToolParam] | None = None
    tool_choice: ToolChoiceParam | None = None
    output_config: OutputConfig | None = None
    thinking: ThinkingParam | None = None

    @field_validator("system", mode="before")
    @classmethod
    def system_text_only(cls, v):
        return _blocks(v, ("text",))

    @model_validator(mode="after")
    def choice_names_a_tool(self):
        names = [t.name for t in self.tools or []]
        choice = self.tool_choice
        if len(set(names)) != len(names):
            raise ValueError("tool names must be unique")
        if choice is not None and choice.type == "tool":
            if choice.name not in names:
                raise PydanticCustomError(
                    "unknown_tool", "tool_choice names '{name}', which is not in tools", {"name": choice.name}
                )
        elif choice is not None and choice.type == "any" and not names:
            raise PydanticCustomError("unknown_tool", "tool_choice 'any' needs tools", {})
        return self


class MessagesRequest(PromptFields):
    max_tokens: int = Field(ge=0)  # 0: only compute (and cache) the prompt, write nothing
    stop_sequences: list[str] | None = None
    # None (left out, or null as some clients send): the model's default.
    temperature: float | None = Field(default=None, ge=0.0, le=1.0)
    top_p: float | None = Field(default=None, gt=0.0, le=1.0)
    top_k: int | None = Field(default=None, ge=0)  # 0: no top-k cut
    metadata: Metadata | None = None
    stream: bool = False


class CountTokensRequest(PromptFields):
    pass

"""Anthropic Messages request bodies (`POST /v1/messages`, `/v1/messages/count_tokens`).

Unknown fields are accepted and ignored everywhere (Claude Code adds some with every release),
`cache_control` and `citations` included; content blocks the server cannot honour (documents)
are refused with a message naming the block."""

from __future__ import annotations

from typing import TYPE_CHECKING, Annotated, Any, Literal

from pydantic import BaseModel, ConfigDict, Field, field_validator, model_validator
from pydantic_core import PydanticCustomError

from agent_memory.api.bodies import TOOL_NAME, RequestBody, field_error
from agent_memory.api.errors import APIError
from agent_memory.chat.images import NO_FILES, ImageError, ImageSource, source_of_base64, source_of_url

if TYPE_CHECKING:
    from agent_memory.api.sealing import TenantSeal


MAX_BREAKPOINTS = 4  # Anthropic's most blocks with cache_control in one request


class CacheControl(BaseModel):
    """A cache breakpoint: the prompt up to and including its block is where the client will
    come back (api/anthropic/breakpoints.py), kept with priority for `ttl`."""

    model_config = ConfigDict(extra="allow")
    type: Literal["ephemeral"]
    ttl: Literal["5m", "1h"] = "5m"


class Block(BaseModel):
    model_config = ConfigDict(extra="allow")
    cache_control: CacheControl | None = None


class TextBlock(Block):
    type: Literal["text"]
    text: str


class ImageBlock(Block):
    """An image: `source` base64 (always), a URL (chat/images.py: http(s) where the operator
    allows it), or a file (refused: there is no files API)."""

    type: Literal["image"]
    source: dict[str, Any]

    def image_source(self, where: str) -> ImageSource:
        kind = self.source.get("type")
        if kind == "base64":
            return source_of_base64(self.source.get("media_type"), self.source.get("data"), where)
        if kind == "url":
            return source_of_url(self.source.get("url"), where)
        if kind == "file":
            raise ImageError(NO_FILES, where)
        raise ImageError(f"an image source has type base64 or url, not {kind!r}", f"{where}.source.type")


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

    def reasoning(self, seal: TenantSeal, param: str) -> str:
        """Its text, once its signature opens to that text (this server wrote the block, for
        this tenant); a 400 naming the signature otherwise, as Anthropic answers."""
        if self.type == "redacted_thinking":
            return ""
        where = f"{param}.signature"
        if self.signature is None:
            raise APIError(400, f"{where}: a thinking block needs the signature it was given", param=where)
        if seal.open(self.signature, where) != self.thinking:
            raise APIError(400, f"{where} is not valid: it was given for other thinking text", param=where)
        return self.thinking


MIN_THINKING_BUDGET = 1024  # Anthropic's least budget_tokens


class ThinkingParam(BaseModel):
    """`thinking`: enabled (with a token budget, not enforced here, but checked as Anthropic
    checks it: at least 1024, and less than max_tokens), adaptive, or disabled."""

    model_config = ConfigDict(extra="allow")
    type: Literal["enabled", "disabled", "adaptive"]
    budget_tokens: int | None = Field(default=None, ge=MIN_THINKING_BUDGET, strict=True)

    @model_validator(mode="after")
    def budget_given(self):
        if self.type == "enabled" and self.budget_tokens is None:
            raise field_error("thinking.budget_tokens", "thinking of type enabled needs budget_tokens")
        return self


class ToolResultBlock(Block):
    type: Literal["tool_result"]
    tool_use_id: str
    content: list[Annotated[TextBlock | ImageBlock, Field(discriminator="type")]] = Field(default_factory=list)
    is_error: bool = Field(default=False, strict=True)

    @field_validator("content", mode="before")
    @classmethod
    def text_blocks(cls, v):
        return _blocks(v, ("text", "image"))


ContentBlock = Annotated[
    TextBlock | ImageBlock | ToolUseBlock | ToolResultBlock | ThinkingBlock, Field(discriminator="type")
]
BLOCK_TYPES = ("text", "image", "tool_use", "tool_result", "thinking", "redacted_thinking")


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
    cache_control: CacheControl | None = None


class ToolChoiceParam(BaseModel):
    model_config = ConfigDict(extra="allow")
    type: Literal["auto", "any", "tool", "none"]
    name: str | None = None
    disable_parallel_tool_use: bool = Field(default=False, strict=True)


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

    @model_validator(mode="after")
    def turns_are_whole(self):
        """As Anthropic refuses them: a user (or system) message with no content, and a
        tool_result that answers no tool_use block of an earlier assistant message. An empty
        assistant turn is taken: a reply that wrote nothing comes back so (docs/usage.md)."""
        calls: set[str] = set()
        for i, m in enumerate(self.messages):
            if m.role != "assistant" and all(isinstance(b, TextBlock) and not b.text for b in m.content):
                raise field_error(f"messages.{i}.content", f"a {m.role} message must have non-empty content")
            for j, block in enumerate(m.content):
                if isinstance(block, ToolUseBlock):
                    calls.add(block.id)
                elif isinstance(block, ToolResultBlock) and block.tool_use_id not in calls:
                    why = f"tool_use_id {block.tool_use_id!r} answers no tool_use block of an earlier assistant message"
                    raise field_error(f"messages.{i}.content.{j}", why)
        return self


class MessagesRequest(PromptFields):
    # Numbers and switches are strict, as Anthropic's are: "10" or true is no token count.
    max_tokens: int = Field(ge=0, strict=True)  # 0: only compute (and cache) the prompt, write nothing
    stop_sequences: list[str] | None = None
    # None (left out, or null as some clients send): the model's default.
    temperature: float | None = Field(default=None, ge=0.0, le=1.0, strict=True)
    top_p: float | None = Field(default=None, gt=0.0, le=1.0, strict=True)
    top_k: int | None = Field(default=None, ge=0, strict=True)  # 0: no top-k cut
    metadata: Metadata | None = None
    stream: bool = Field(default=False, strict=True)
    # The last cacheable block's breakpoint ("automatic" caching); `remember` false: reuse, write
    # nothing new (api/serving/controls.py).
    cache_control: CacheControl | None = None
    remember: bool = Field(default=True, strict=True)

    @model_validator(mode="after")
    def budget_under_max_tokens(self):
        budget = self.thinking.budget_tokens if self.thinking and self.thinking.type == "enabled" else None
        if budget is not None and self.max_tokens and budget >= self.max_tokens:
            why = f"budget_tokens ({budget}) must be less than max_tokens ({self.max_tokens})"
            raise field_error("thinking.budget_tokens", why)
        return self

    @model_validator(mode="after")
    def breakpoints_as_anthropic_takes_them(self):
        """At most four, longer ttls first (in the order tools, system, messages); and a
        request that writes nothing new cannot be a prewarm, which only writes."""
        marks = [
            *(t.cache_control for t in self.tools or []),
            *(b.cache_control for b in self.system or []),
            *(b.cache_control for m in self.messages for b in m.content),
            self.cache_control,
        ]
        ttls = [c.ttl for c in marks if c is not None]
        if len(ttls) > MAX_BREAKPOINTS:
            why = "A maximum of {most} blocks with cache_control may be provided. Found {found}."
            raise PydanticCustomError("too_many_breakpoints", why, {"most": MAX_BREAKPOINTS, "found": len(ttls)})
        if "5m" in ttls and "1h" in ttls[ttls.index("5m") :]:
            why = (
                "a ttl='1h' cache_control block must not come after a ttl='5m' cache_control block. Note that "
                "blocks are processed in the following order: `tools`, `system`, `messages`."
            )
            raise PydanticCustomError("breakpoint_order", why, {})
        if not self.remember and self.max_tokens == 0:
            raise field_error("remember", "remember false writes nothing, and max_tokens 0 (a prewarm) only writes")
        return self


class CountTokensRequest(PromptFields):
    pass

"""OpenAI Responses request bodies (conversation.py reads their input items)."""

from __future__ import annotations

from typing import Annotated, Any, Literal

from pydantic import BaseModel, ConfigDict, Field

from agent_memory.api.bodies import PROMPT_CACHE_KEY, TOOL_NAME, RequestBody
from agent_memory.api.errors import APIError
from agent_memory.api.serving.controls import RetentionName
from agent_memory.chat.conversation import OutputFormat, Thinking, Tool, ToolChoice, effort_thinking
from agent_memory.chat.freeform import freeform_tool
from agent_memory.engine.requests import TOP_LOGPROBS


class FunctionTool(BaseModel):
    """Responses' function tools are flat: no nested `function` object."""

    model_config = ConfigDict(extra="allow")
    type: Literal["function"]
    name: str = Field(pattern=TOOL_NAME)
    description: str | None = None
    parameters: dict[str, Any] | None = None
    strict: bool | None = None


class NamespaceTool(BaseModel):
    """Function tools grouped under a namespace (Codex's `multi_agent_v1`): the model sees each
    as `namespace.name`, and its calls come back as `name` with their `namespace`."""

    model_config = ConfigDict(extra="allow")
    type: Literal["namespace"]
    name: str = Field(pattern=TOOL_NAME)
    description: str | None = None
    tools: list[FunctionTool]


class CustomFormat(BaseModel):
    model_config = ConfigDict(extra="allow")
    type: Literal["text", "grammar"] = "text"
    syntax: Literal["lark", "regex"] | None = None
    definition: str | None = None


class CustomTool(BaseModel):
    """A freeform tool: its calls' input is raw text, constrained by `format`'s grammar where
    one is given (chat/freeform.py). Codex sends `apply_patch` so to the models it knows."""

    model_config = ConfigDict(extra="allow")
    type: Literal["custom"]
    name: str = Field(pattern=TOOL_NAME)
    description: str | None = None
    format: CustomFormat = Field(default_factory=CustomFormat)


# Tools OpenAI runs on its side, and Codex's `tool_search` over tools it defers (whose call
# items this server does not write): left out of what the model sees (a log line, and the
# response's `x-agent-memory-ignored-tools` header, say so).
HOSTED_TOOLS = (
    "web_search",
    "web_search_preview",
    "web_search_preview_2025_03_11",
    "file_search",
    "computer_use_preview",
    "image_generation",
    "code_interpreter",
    "local_shell",
    "mcp",
    "tool_search",
)


class HostedTool(BaseModel):
    model_config = ConfigDict(extra="allow")
    type: Literal[HOSTED_TOOLS]


AnyTool = Annotated[FunctionTool | NamespaceTool | CustomTool | HostedTool, Field(discriminator="type")]


class NamedFunction(BaseModel):
    model_config = ConfigDict(extra="allow")
    type: Literal["function", "custom"]
    name: str


class TextFormat(BaseModel):
    model_config = ConfigDict(extra="allow", populate_by_name=True)
    type: Literal["text", "json_object", "json_schema"] = "text"
    name: str | None = None
    schema_: dict[str, Any] | None = Field(default=None, alias="schema")
    strict: bool | None = None


class TextOptions(BaseModel):
    model_config = ConfigDict(extra="allow")
    format: TextFormat = Field(default_factory=TextFormat)


class ReasoningOptions(BaseModel):
    model_config = ConfigDict(extra="allow")
    effort: Literal["none", "minimal", "low", "medium", "high", "xhigh"] | None = None
    summary: str | None = None


class ResponsesRequest(RequestBody):
    UNSUPPORTED = {
        "background": (
            lambda v: v is True,
            "background responses are not supported: wait for the reply (or stream it)",
        ),
        "conversation": (
            lambda v: True,
            "conversation objects are not supported: chain responses with previous_response_id",
        ),
        "prompt": (lambda v: True, "stored prompt templates are not supported: send instructions and input"),
    }
    model: str | None = None
    input: str | list[dict[str, Any]]
    instructions: str | None = None
    tools: list[AnyTool] = Field(default_factory=list)
    tool_choice: Literal["none", "auto", "required"] | NamedFunction = "auto"
    # Numbers and switches are strict, as OpenAI's are: "10" or true is no token count.
    parallel_tool_calls: bool = Field(default=True, strict=True)
    text: TextOptions = Field(default_factory=TextOptions)
    max_output_tokens: int | None = Field(default=None, ge=1, strict=True)
    temperature: float | None = Field(default=None, ge=0.0, le=2.0, strict=True)  # None: the model's default
    top_p: float | None = Field(default=None, gt=0.0, le=1.0, strict=True)
    stream: bool = Field(default=False, strict=True)
    store: bool = Field(default=True, strict=True)
    previous_response_id: str | None = None
    metadata: dict[str, str] | None = None
    prompt_cache_key: str | None = Field(default=None, max_length=PROMPT_CACHE_KEY)
    user: str | None = None
    cache_salt: str | None = None
    remember: bool = Field(default=True, strict=True)  # api/serving/controls.py
    prompt_cache_retention: RetentionName | None = None
    reasoning: ReasoningOptions | None = None
    include: list[str] | None = None
    top_logprobs: int | None = Field(default=None, ge=0, le=TOP_LOGPROBS, strict=True)

    @property
    def sealed(self) -> bool:
        """Reasoning items carry `encrypted_content` (asked for by `include`)."""
        return "reasoning.encrypted_content" in (self.include or [])

    def top_logprobs_asked(self) -> int | None:
        """None: no logprobs; k: the output text's tokens' logprobs, each with its k likeliest
        alternatives (asked for by `include`, or by `top_logprobs` alone)."""
        if "message.output_text.logprobs" in (self.include or []) or self.top_logprobs is not None:
            return self.top_logprobs or 0
        return None

    def thinking(self) -> Thinking:
        return effort_thinking(self.reasoning.effort if self.reasoning else None, {})

    def namespaced(self) -> dict[str, tuple[str, str]]:
        """The model's name of each namespaced tool -> (its namespace, its name)."""
        return {
            f"{n.name}.{t.name}": (n.name, t.name) for n in self.tools if isinstance(n, NamespaceTool) for t in n.tools
        }

    def custom_tools(self) -> set[str]:
        """The names of the freeform tools: their calls are returned as custom_tool_call items."""
        return {t.name for t in self.tools if isinstance(t, CustomTool)}

    def ignored_tools(self) -> list[str]:
        """The hosted tools this server leaves out, by type."""
        return sorted({t.type for t in self.tools if isinstance(t, HostedTool)})

    def conversation_tools(self) -> tuple[list[Tool], ToolChoice, OutputFormat]:
        tools = []
        for t in self.tools:
            if isinstance(t, FunctionTool):
                tools.append(Tool(t.name, t.description or "", t.parameters or {}))
            elif isinstance(t, CustomTool):
                tools.append(freeform_tool(t.name, t.description or "", t.format.syntax, t.format.definition))
            elif isinstance(t, NamespaceTool):
                tools += [Tool(f"{t.name}.{f.name}", f.description or "", f.parameters or {}) for f in t.tools]
        names = {t.name for t in tools}
        choice = self.tool_choice
        if isinstance(choice, NamedFunction):
            if choice.name not in names:
                raise APIError(400, f"tool_choice names '{choice.name}', which is not in tools", param="tool_choice")
            choice = ToolChoice("named", choice.name)
        elif choice == "required" and not tools:
            raise APIError(400, "tool_choice 'required' needs tools", param="tool_choice")
        else:
            choice = ToolChoice(choice if tools else "none")
        fmt = self.text.format
        if fmt.type == "json_schema" and fmt.schema_ is None:
            raise APIError(400, "text.format json_schema needs a schema", param="text.format.schema")
        return tools, choice, OutputFormat(fmt.type, fmt.schema_)

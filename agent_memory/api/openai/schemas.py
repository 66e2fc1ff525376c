"""OpenAI request bodies. Unknown fields are accepted and ignored; fields we cannot honour
meaningfully are rejected with a message that says which and why."""

from __future__ import annotations

from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, field_validator, model_validator
from pydantic_core import PydanticCustomError

from agent_memory.api.bodies import PROMPT_CACHE_KEY, TOOL_NAME, RequestBody, field_error
from agent_memory.api.openai.messages import Message
from agent_memory.api.serving.controls import RetentionName
from agent_memory.engine.requests import TOP_LOGPROBS, Sampling

MAX_SAMPLES = 16  # n: samples of one prompt, decoding side by side in the batch


class StreamOptions(BaseModel):
    model_config = ConfigDict(extra="allow")
    include_usage: bool = Field(default=False, strict=True)


class SamplingFields(RequestBody):
    """The fields chat and text completions share."""
    # Numbers and switches are strict, as OpenAI's are: "10" or true is no token count.
    model: str | None = None
    max_tokens: int | None = Field(default=None, ge=1, strict=True)
    temperature: float | None = Field(default=None, ge=0.0, le=2.0, strict=True)  # None: the model's default
    top_p: float | None = Field(default=None, gt=0.0, le=1.0, strict=True)
    seed: int | None = Field(default=None, strict=True)
    stop: str | list[str] | None = None
    stream: bool = Field(default=False, strict=True)
    stream_options: StreamOptions | None = None
    n: int = Field(default=1, ge=1, le=MAX_SAMPLES, strict=True)
    frequency_penalty: float | None = Field(default=None, ge=-2.0, le=2.0, strict=True)
    presence_penalty: float | None = Field(default=None, ge=-2.0, le=2.0, strict=True)
    repetition_penalty: float | None = Field(default=None, gt=0.0, strict=True)  # vLLM's extension
    user: str | None = None
    prompt_cache_key: str | None = Field(default=None, max_length=PROMPT_CACHE_KEY)
    cache_salt: str | None = None  # vLLM's field: requests with different salts share no cached block
    # Memory controls (api/serving/controls.py): false, reuse the cache but write nothing new; the
    # agent's memory kept with priority for an hour (in memory) or a day (on disk too).
    remember: bool = Field(default=True, strict=True)
    prompt_cache_retention: RetentionName | None = None
    metadata: dict[str, Any] | None = None
    logit_bias: dict[int, float] | None = None

    @field_validator("logit_bias")
    @classmethod
    def bias_range(cls, v):
        if v and any(not -100 <= b <= 100 for b in v.values()):
            raise ValueError("logit_bias values must be between -100 and 100")
        return v

    @field_validator("stop")
    @classmethod
    def stop_list(cls, v):
        return [v] if isinstance(v, str) else v

    def stop_strings(self) -> list[str]:
        return [s for s in (self.stop or []) if s]

    def token_limit(self) -> int | None:
        return self.max_tokens

    def top_logprobs_asked(self) -> int | None:
        """None: no logprobs; k: each token's logprob and its k likeliest alternatives."""
        return None

    def include_usage(self) -> bool:
        return bool(self.stream_options and self.stream_options.include_usage)

    def sampling(self) -> Sampling:
        return Sampling(
            temperature=self.temperature,
            top_p=self.top_p,
            seed=self.seed,
            stop=self.stop_strings(),
            logit_bias=self.logit_bias or {},
            logprobs=self.top_logprobs_asked(),
            frequency_penalty=self.frequency_penalty,
            presence_penalty=self.presence_penalty,
            repetition_penalty=self.repetition_penalty,
            n=self.n,
        )


class FunctionDef(BaseModel):
    model_config = ConfigDict(extra="allow")
    name: str = Field(pattern=TOOL_NAME)
    description: str = ""
    parameters: dict[str, Any] | None = None
    strict: bool | None = None


class ToolDef(BaseModel):
    model_config = ConfigDict(extra="allow")
    type: Literal["function"]
    function: FunctionDef


class NamedFunction(BaseModel):
    model_config = ConfigDict(extra="allow")
    name: str


class NamedToolChoice(BaseModel):
    model_config = ConfigDict(extra="allow")
    type: Literal["function"]
    function: NamedFunction


class JsonSchemaFormat(BaseModel):
    model_config = ConfigDict(extra="allow", populate_by_name=True)
    name: str = "response"
    schema_: dict[str, Any] = Field(alias="schema")
    strict: bool | None = None


class ResponseFormat(BaseModel):
    model_config = ConfigDict(extra="allow")
    type: Literal["text", "json_object", "json_schema"]
    json_schema: JsonSchemaFormat | None = None

    @model_validator(mode="after")
    def schema_given(self):
        if self.type == "json_schema" and self.json_schema is None:
            raise ValueError("type json_schema needs json_schema.schema")
        return self


class ChatCompletionRequest(SamplingFields):
    UNSUPPORTED = {
        "audio": (lambda v: True, "audio output is not supported: this server writes text"),
        "modalities": (lambda v: isinstance(v, list) and set(v) - {"text"}, "only the text modality is supported"),
        "functions": (lambda v: bool(v), "the legacy functions are not supported: send them as tools"),
        "function_call": (lambda v: True, "the legacy function_call is not supported: use tool_choice"),
    }
    messages: list[Message] = Field(min_length=1)
    max_completion_tokens: int | None = Field(default=None, ge=1, strict=True)
    tools: list[ToolDef] | None = None
    tool_choice: Literal["none", "auto", "required"] | NamedToolChoice | None = None
    parallel_tool_calls: bool = Field(default=True, strict=True)
    response_format: ResponseFormat | None = None
    reasoning_effort: Literal["none", "minimal", "low", "medium", "high", "xhigh"] | None = None
    chat_template_kwargs: dict[str, Any] | None = None  # vLLM's: variables for the chat template
    logprobs: bool = Field(default=False, strict=True)
    top_logprobs: int | None = Field(default=None, ge=0, le=TOP_LOGPROBS, strict=True)

    @model_validator(mode="after")
    def top_needs_logprobs(self):
        if self.top_logprobs and not self.logprobs:  # as OpenAI refuses it
            raise field_error("top_logprobs", "top_logprobs needs logprobs: true")
        return self

    def top_logprobs_asked(self) -> int | None:
        return (self.top_logprobs or 0) if self.logprobs else None

    @model_validator(mode="after")
    def choice_names_a_tool(self):
        names = [t.function.name for t in self.tools or []]
        choice = self.tool_choice
        if isinstance(choice, NamedToolChoice) and choice.function.name not in names:
            raise PydanticCustomError(
                "unknown_tool", "tool_choice names '{name}', which is not in tools", {"name": choice.function.name}
            )
        if choice in ("required",) and not names:
            raise PydanticCustomError("unknown_tool", "tool_choice 'required' needs tools", {})
        if len(set(names)) != len(names):
            raise ValueError("tool names must be unique")
        return self

    @model_validator(mode="after")
    def turns_are_whole(self):
        """A user message that says nothing (as Anthropic refuses it), and a tool result that
        answers no call an earlier assistant message made (as OpenAI refuses it)."""
        calls: set[str] = set()
        for i, m in enumerate(self.messages):
            if m.role == "user" and not m.text() and not m.images():
                raise field_error(f"messages.{i}.content", "a user message needs content: it is empty")
            if m.role != "user" and m.images():
                j = m.images()[0]
                raise field_error(f"messages.{i}.content.{j}", f"image parts are taken in user messages, not {m.role}")
            if m.role == "tool" and m.tool_call_id not in calls:
                named = "it names none" if m.tool_call_id is None else f"{m.tool_call_id!r} is none"
                why = f"a tool message answers a tool call of an earlier assistant message: {named}"
                raise field_error(f"messages.{i}.tool_call_id", why)
            calls.update(c.id for c in m.tool_calls or [])
        return self

    def token_limit(self) -> int | None:
        return self.max_completion_tokens or self.max_tokens


class CompletionRequest(SamplingFields):
    prompt: str | list[int] | list[str] | list[list[int]]
    echo: bool = Field(default=False, strict=True)
    best_of: int | None = Field(default=None, strict=True)
    # The legacy shape: how many likeliest alternatives each token reports (0: its own logprob only).
    logprobs: int | None = Field(default=None, ge=0, le=TOP_LOGPROBS, strict=True)

    def top_logprobs_asked(self) -> int | None:
        return self.logprobs

    @field_validator("prompt")
    @classmethod
    def single_prompt(cls, v):
        if isinstance(v, list) and v and isinstance(v[0], (str, list)):
            if len(v) != 1:
                raise ValueError("only one prompt per request is supported")
            return v[0]
        if isinstance(v, list) and not v:
            raise ValueError("the prompt is empty")
        return v

    @field_validator("echo")
    @classmethod
    def no_echo(cls, v: bool) -> bool:
        if v:
            raise ValueError("echo is not supported")
        return v

    @field_validator("best_of")
    @classmethod
    def no_best_of(cls, v):
        if v not in (None, 1):
            raise ValueError("only best_of=1 is supported")
        return v

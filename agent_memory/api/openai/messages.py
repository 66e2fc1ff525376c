"""A chat completion's messages: roles, content as text or as text and image parts (an image's
URL read by chat/images.py), an assistant turn's tool calls and reasoning."""

from __future__ import annotations

from typing import Annotated, Literal

from pydantic import BaseModel, ConfigDict, Field, field_validator
from pydantic_core import PydanticCustomError

from agent_memory.api.bodies import TOOL_NAME
from agent_memory.chat.images import source_of_url


class TextPart(BaseModel):
    model_config = ConfigDict(extra="allow")
    type: Literal["text"]
    text: str


class ImageURL(BaseModel):
    model_config = ConfigDict(extra="allow")
    url: str
    detail: Literal["auto", "low", "high"] | None = None  # taken; the model's processor decides the size


class ImagePart(BaseModel):
    """An image (chat/images.py reads its URL: data: always, http(s) where the operator allows)."""

    model_config = ConfigDict(extra="allow")
    type: Literal["image_url"]
    image_url: ImageURL


ContentPart = Annotated[TextPart | ImagePart, Field(discriminator="type")]
NO_FILES = "there is no files API on this server: send the image itself as an image_url part (a data: URL)"


class FunctionCall(BaseModel):
    model_config = ConfigDict(extra="allow")
    name: str = Field(pattern=TOOL_NAME)
    arguments: str = "{}"


class ToolCallField(BaseModel):
    model_config = ConfigDict(extra="allow")
    id: str = ""
    type: Literal["function"] = "function"
    function: FunctionCall


class Message(BaseModel):
    model_config = ConfigDict(extra="allow")
    role: Literal["system", "developer", "user", "assistant", "tool"]
    content: str | list[ContentPart] | None = None
    tool_calls: list[ToolCallField] | None = None
    tool_call_id: str | None = None
    # An earlier turn's reasoning, as this server returns it (vLLM's newer name: `reasoning`).
    reasoning_content: str | None = None
    reasoning: str | None = None

    @field_validator("content", mode="before")
    @classmethod
    def known_parts(cls, v):
        """Say which part is not text or an image, rather than which union branch failed (a
        file part: there is no files API); an empty list is refused, as OpenAI refuses it (a
        message's parts are at least one)."""
        if v == []:
            raise PydanticCustomError("empty_content", "an empty array: content needs at least one part", {})
        if isinstance(v, list):
            for i, part in enumerate(v):
                kind = part.get("type") if isinstance(part, dict) else type(part).__name__
                if kind == "file":
                    raise PydanticCustomError("unsupported_part", NO_FILES, {"i": i})
                if kind not in ("text", "image_url"):
                    raise PydanticCustomError(
                        "unsupported_part",
                        "content part {i} has type '{kind}': only text and image_url parts are supported",
                        {"i": i, "kind": kind},
                    )
        return v

    def text(self) -> str:
        if isinstance(self.content, list):
            return "".join(p.text for p in self.content if isinstance(p, TextPart))
        return self.content or ""

    def parts(self, where: str) -> list:
        """The content in order: text, and each image as its source (chat/images.py), `where`
        the content's path in the body."""
        if not isinstance(self.content, list):
            return [self.content or ""]
        return [
            p.text if isinstance(p, TextPart) else source_of_url(p.image_url.url, f"{where}.{j}")
            for j, p in enumerate(self.content)
        ]

    def images(self) -> list[int]:
        """The indices of its image parts."""
        parts = self.content if isinstance(self.content, list) else []
        return [j for j, p in enumerate(parts) if isinstance(p, ImagePart)]

    def template_role(self) -> str:
        return "system" if self.role == "developer" else self.role

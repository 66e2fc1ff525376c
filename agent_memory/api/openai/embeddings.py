"""`/v1/embeddings` in OpenAI's shape, for the embedding models served (embeddings/engine.py).

`input`: a string, an array of strings, an array of token ids, or an array of such arrays; token
ids are the model's own (LangChain's OpenAIEmbeddings sends OpenAI's tiktoken ids unless told
`check_embedding_ctx_length=False`: an id past the vocabulary is a 400 that says so). Strings
are tokenized as the model's tokenizer does by default (its special tokens added: Qwen3-Embedding
ends each input with its end token). `dimensions` cuts each vector to its first so many values and
normalizes it again, where the model was trained for it (layout.py's `truncation`), else a 400.
"""

from __future__ import annotations

import asyncio
import base64
from typing import Literal

import numpy as np
from fastapi import APIRouter, Depends, Request, Response
from pydantic import Field

from agent_memory.api.bodies import RequestBody
from agent_memory.api.errors import APIError, failure
from agent_memory.api.serving.admit import check_available
from agent_memory.api.serving.events import unless_client_leaves
from agent_memory.api.serving.prompt import check_length
from agent_memory.api.state import ServedModel, ServerState, ready_state
from agent_memory.engine.requests import Failed

router = APIRouter()
MAX_INPUTS = 2048  # OpenAI's limit on an array's inputs


class EmbeddingRequest(RequestBody):
    input: str | list[str] | list[int] | list[list[int]]
    model: str | None = None
    encoding_format: Literal["float", "base64"] = "float"
    dimensions: int | None = Field(default=None, strict=True, ge=1)
    user: str | None = None

    def inputs(self) -> list[str] | list[list[int]]:
        """Each input on its own: one string or one list of ids becomes a list of one."""
        if isinstance(self.input, str):
            return [self.input]
        if self.input and isinstance(self.input[0], int):
            return [self.input]
        return self.input


@router.post("/v1/embeddings")
async def embeddings(body: EmbeddingRequest, request: Request, state: ServerState = Depends(ready_state)):
    return await embed(body, state.model_for(body.model, kind="embedding"), request)


async def embed(body: EmbeddingRequest, model: ServedModel, request: Request) -> dict | Response:
    """The inputs' vectors in OpenAI's list shape; a 499 for a client that left first."""
    layout = model.facts.embedding
    if body.dimensions is not None and (why := layout.truncation(body.dimensions)):
        raise APIError(400, f"dimensions: the model {model.id} gives {why}", param="dimensions")
    inputs = await _tokens(model, body.inputs())
    check_available(model)
    tokens = sum(map(len, inputs))
    trace = {"model": model.id, "inputs": len(inputs), "prompt_tokens": tokens}
    request.scope.setdefault("state", {})["trace"] = trace
    vectors = await unless_client_leaves(request, asyncio.wrap_future(model.engine.embed(inputs)))
    if vectors is None:
        return Response(status_code=499)
    if isinstance(vectors, Failed):
        trace["finish"] = f"error ({vectors.code})"
        raise failure(vectors)
    data = [_encoded(v, body.encoding_format) for v in _truncated(vectors, layout, body.dimensions)]
    return {
        "object": "list",
        "data": [{"object": "embedding", "index": i, "embedding": v} for i, v in enumerate(data)],
        "model": model.answering(body.model),
        "usage": {"prompt_tokens": tokens, "total_tokens": tokens},
    }


def _truncated(vectors: np.ndarray, layout, dimensions: int | None) -> np.ndarray:
    """The first `dimensions` of each vector (Matryoshka), normalized again if the model's are."""
    if dimensions is None or dimensions >= layout.dimensions:
        return vectors
    vectors = vectors[:, :dimensions]
    if layout.normalize:
        vectors = vectors / np.maximum(np.linalg.norm(vectors, axis=1, keepdims=True), 1e-12)
    return vectors


async def _tokens(model: ServedModel, inputs: list[str] | list[list[int]]) -> list[list[int]]:
    """Each input's token ids, checked: none empty, each within the context and the vocabulary."""
    if not inputs:
        raise APIError(400, "input: an empty array; send at least one string or token array", param="input")
    if len(inputs) > MAX_INPUTS:
        raise APIError(400, f"input: {len(inputs)} inputs; at most {MAX_INPUTS} per request", param="input")
    if isinstance(inputs[0], str):
        for i, text in enumerate(inputs):
            if not text:
                raise APIError(400, f"input.{i}: an empty string cannot be embedded", param="input")
            check_length(model, len(text), f"input.{i}")
        ids = await model.tokenize(lambda tok: [tok.encode(text) for text in inputs])
    else:
        ids = [list(tokens) for tokens in inputs]
        for i, tokens in enumerate(ids):
            if not tokens:
                raise APIError(400, f"input.{i}: an empty token array cannot be embedded", param="input")
            if any(t < 0 or t >= model.vocabulary for t in tokens):
                raise APIError(
                    400,
                    f"input.{i}: token ids must be in [0, {model.vocabulary}) (this model's tokenizer); "
                    "LangChain's OpenAIEmbeddings sends OpenAI's tiktoken ids unless check_embedding_ctx_length=False",
                    param="input",
                )
    for i, tokens in enumerate(ids):
        if len(tokens) > model.context_length:
            raise APIError(
                400,
                f"This model's maximum context length is {model.context_length} tokens, but input.{i} "
                f"is {len(tokens)} tokens.",
                param="input",
                code="context_length_exceeded",
            )
    return ids


def _encoded(vector: np.ndarray, encoding_format: str) -> list[float] | str:
    """float: a list of numbers; base64: the little-endian float32 bytes, as OpenAI sends them."""
    if encoding_format == "base64":
        return base64.b64encode(vector.astype("<f4").tobytes()).decode("ascii")
    return vector.tolist()

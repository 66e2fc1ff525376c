"""The Anthropic Messages wire format's routes, for Claude Code and the Anthropic SDK:
`POST /v1/messages` (JSON or SSE: messages.py, served by serving/serve.py) and
`POST /v1/messages/count_tokens`; failures in Anthropic's error shape (reply.error_shape)."""

from __future__ import annotations

from fastapi import APIRouter, Depends, Request, Response

from agent_memory.api.anthropic.conversation import conversation, prepare
from agent_memory.api.anthropic.messages import CreateMessage
from agent_memory.api.anthropic.reply import error_shape
from agent_memory.api.anthropic.schemas import CountTokensRequest, MessagesRequest
from agent_memory.api.errors import ErrorShape
from agent_memory.api.sealing import THINKING, Sealer, request_sealer
from agent_memory.api.serving.serve import serve
from agent_memory.api.serving.speaker import tenant
from agent_memory.api.state import ServerState, ready_state

router = APIRouter()

PATH = "/v1/messages"
ERROR_SHAPES: dict[str, ErrorShape] = {PATH: error_shape}  # /v1/messages and every path under it


@router.post(PATH)
async def create_message(
    body: MessagesRequest,
    request: Request,
    state: ServerState = Depends(ready_state),
    sealer: Sealer = Depends(request_sealer),
) -> Response:
    return await serve(CreateMessage(body, request, sealer), request, state)


@router.post(PATH + "/count_tokens")
async def count_tokens(
    body: CountTokensRequest,
    request: Request,
    state: ServerState = Depends(ready_state),
    sealer: Sealer = Depends(request_sealer),
) -> dict:
    """The prompt /v1/messages would run for the same body, tools included, in tokens (no
    grammar is compiled: a schema constrained decoding cannot enforce does not stop a count)."""
    model = state.model_for(body.model)
    prepared = await prepare(model, conversation(body, sealer.for_tenant(tenant(request), THINKING)), constrained=False)
    return {"input_tokens": len(prepared.prompt)}

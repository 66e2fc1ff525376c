"""The OpenAI wire format's routes: chat and text completions (chat.py, completion.py: JSON or
SSE, served by serving/serve.py) and the model list."""

from __future__ import annotations

from fastapi import APIRouter, Depends, Request, Response
from fastapi.responses import JSONResponse

from agent_memory.api.errors import ErrorShape, error_body
from agent_memory.api.openai.chat import ChatCompletion
from agent_memory.api.openai.completion import TextCompletion
from agent_memory.api.openai.reply import model_object
from agent_memory.api.openai.schemas import ChatCompletionRequest, CompletionRequest
from agent_memory.api.serving.serve import serve
from agent_memory.api.state import ServerState, ready_state

router = APIRouter()
ERROR_SHAPES: dict[str, ErrorShape] = {}  # OpenAI's shape is every route's unless claimed


@router.get("/v1/models")
async def list_models(request: Request) -> dict:
    """Each served model under its id (the NAME of `--model NAME=…`, else its hub id or folder's
    name), then the other names it answers to: its own under a NAME, `demo` for the demo model
    (examples written for `--model demo` name a listed id). `root`: the id each stands for."""
    state: ServerState = request.app.state.server
    data = [
        model_object(i, model.id, state.started, model.engine.model, model.images)
        for model in state.models.values()
        for i in model.ids
    ]
    return {"object": "list", "data": data}


@router.get("/v1/models/{model_id:path}")
async def retrieve_model(model_id: str, request: Request):
    """One model object (OpenAI's `client.models.retrieve`); 404 `model_not_found` otherwise."""
    state: ServerState = request.app.state.server
    for model in state.models.values():
        if model_id in model.ids:
            return model_object(model_id, model.id, state.started, model.engine.model, model.images)
    body = error_body(404, f"The model '{model_id}' does not exist", param="model", code="model_not_found")
    body["error"]["type"] = "invalid_request_error"  # OpenAI's own type for this 404
    return JSONResponse(body, status_code=404)


@router.post("/v1/chat/completions")
async def chat_completions(
    body: ChatCompletionRequest, request: Request, state: ServerState = Depends(ready_state)
) -> Response:
    return await serve(ChatCompletion(body, request), request, state)


@router.post("/v1/completions")
async def completions(body: CompletionRequest, request: Request, state: ServerState = Depends(ready_state)) -> Response:
    return await serve(TextCompletion(body, request), request, state)

"""The OpenAI Responses wire format's routes: `POST /v1/responses` (JSON or the `response.*`
event stream: respond.py, served by serving/serve.py), `GET` and `DELETE /v1/responses/{id}`
(stored responses: store.py)."""

from __future__ import annotations

from fastapi import APIRouter, Depends, Request, Response

from agent_memory.api.errors import APIError, ErrorShape
from agent_memory.api.responses.respond import CreateResponse
from agent_memory.api.responses.schemas import ResponsesRequest
from agent_memory.api.responses.store import ResponseStore
from agent_memory.api.sealing import Sealer, request_sealer
from agent_memory.api.serving.serve import serve
from agent_memory.api.serving.speaker import tenant
from agent_memory.api.state import ServerState, ready_state

router = APIRouter()
ERROR_SHAPES: dict[str, ErrorShape] = {}  # OpenAI's shape, as every route's unless claimed


def stored_responses(request: Request) -> ResponseStore:
    """The store create_app keeps the responses in."""
    return request.app.state.responses


@router.post("/v1/responses")
async def create_response(
    body: ResponsesRequest,
    request: Request,
    state: ServerState = Depends(ready_state),
    store: ResponseStore = Depends(stored_responses),
    sealer: Sealer = Depends(request_sealer),
) -> Response:
    return await serve(CreateResponse(body, request, store, sealer), request, state)


@router.get("/v1/responses/{response_id}", dependencies=[Depends(ready_state)])
async def get_response(response_id: str, request: Request, store: ResponseStore = Depends(stored_responses)) -> dict:
    stored = store.get(tenant(request), response_id)
    if stored is None:
        raise APIError(404, f"No response with id '{response_id}'.", param="response_id", code="response_not_found")
    return stored.body


@router.delete("/v1/responses/{response_id}", dependencies=[Depends(ready_state)])
async def delete_response(response_id: str, request: Request, store: ResponseStore = Depends(stored_responses)) -> dict:
    if not store.delete(tenant(request), response_id):
        raise APIError(404, f"No response with id '{response_id}'.", param="response_id", code="response_not_found")
    return {"id": response_id, "object": "response.deleted", "deleted": True}

"""A prepared prompt admitted as the engine's request: the model can be loaded, the queue has
room, the output limit fits the context (output_limit.py), the sampling is one the batch can
run; then the `GenerationRequest`, built by keyword, and the request's log fields."""

from __future__ import annotations

from fastapi import Request

from agent_memory.api.access_log import shown_agent
from agent_memory.api.errors import APIError, failure
from agent_memory.api.serving.controls import no_store
from agent_memory.api.serving.output_limit import output_limit
from agent_memory.api.serving.prompt import Prepared
from agent_memory.api.serving.speaker import tenant
from agent_memory.api.serving.wire import Admitted, Asked
from agent_memory.api.state import ServedModel, ServerState
from agent_memory.engine.requests import MODEL_UNAVAILABLE, Failed, GenerationRequest


def check_available(model: ServedModel) -> None:
    """Refuse, before a stream starts, a request to a model whose weights cannot be loaded, or
    whose engine serves no more (the server stops: a rank of a split model was lost)."""
    if (health := model.engine.health()).status == "unavailable":
        raise failure(Failed(f"the model {model.id} cannot be loaded: {health.message}", 500, MODEL_UNAVAILABLE))
    if health.status == "error" and health.code is not None:
        raise failure(Failed(health.message, 503, health.code))


def admit(state: ServerState, model: ServedModel, request: Request, prepared: Prepared, asked: Asked) -> Admitted:
    """Check the prompt and the tokens to generate against the context (the request's own
    limit, clamped to the room left), the queue and the batch, then build the engine's request."""
    param = prepared.param
    if not prepared.prompt:
        raise APIError(400, "the prompt is empty", param=param)
    check_available(model)
    if len(state.waiting) >= state.max_waiting:
        raise APIError(
            503,
            f"{len(state.waiting)} requests are waiting to start; retry shortly",
            code="server_busy",
            headers={"Retry-After": str(1 + len(state.waiting) // model.engine.max_batch)},
        )
    output = output_limit(model.facts, len(prepared.prompt), asked.max_tokens, prepared.grammar, param, asked.too_long)
    params = asked.sampling.params(model.facts.sampling_defaults, output.max_tokens)
    if params.n > model.engine.max_batch:
        why = f"n is at most the batch limit, {model.engine.max_batch} samples decoding side by side"
        raise APIError(400, why, param="n")
    if any(not 0 <= t < model.vocabulary for t in params.logit_bias):
        raise APIError(400, f"logit_bias token ids must be in [0, {model.vocabulary})", param="logit_bias")
    generation = GenerationRequest(
        prompt=prepared.prompt,
        params=params,
        agent=asked.agent,
        request_id=request.scope.get("state", {}).get("request_id", ""),
        grammar=prepared.grammar,
        tenant=tenant(request),
        cache_salt=asked.cache_salt or "",
        remember=(remember := asked.remember and not no_store(request)),
        breakpoints=prepared.breakpoints,
        retention=asked.retention,
        extra_keys=prepared.vision.keys if prepared.vision else (),
        vision=prepared.vision,
        # Chat turns are settled (serving/settle.py), images and all: not a request that keeps nothing.
        settles=remember and prepared.conversation is not None and params.n == 1,
    )
    state.waiting.add(generation)  # counted from now: requests admitted in one tick all count
    trace = {"agent": shown_agent(asked.agent, state.log_agent_ids), "prompt_tokens": len(prepared.prompt)}
    if prepared.conversation is not None and (images := prepared.conversation.images()):
        trace["images"] = len(images)  # in the prompt, however many turns ago they were sent
    if output.clamped:  # the request asked for more than the room left
        trace["clamped"] = output.clamped
    if len(state.models) > 1:  # which model served it, where there is a choice
        trace = {"model": model.id, **trace}
    request.scope.setdefault("state", {})["trace"] = state.traces[generation] = trace
    return Admitted(generation, output)

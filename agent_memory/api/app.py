"""The FastAPI app: routes, error shapes, middleware, `/health`, `/metrics`, and the engines'
lifetime. It knows the engines through EngineClient alone; which models are served, and by
which engines, is the caller's wiring (cli/serve.py)."""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable
from contextlib import asynccontextmanager

from fastapi import FastAPI, Request, Response
from fastapi.responses import JSONResponse
from prometheus_client import CONTENT_TYPE_LATEST, generate_latest

from agent_memory import __version__
from agent_memory.api import agents, dashboard, errors, heads
from agent_memory.api.access_log import AccessLogMiddleware
from agent_memory.api.anthropic import routes as anthropic
from agent_memory.api.errors import APIError, ErrorShapes
from agent_memory.api.exported import exported
from agent_memory.api.middleware import APIKeyMiddleware, BodyLimitMiddleware, HostCheckMiddleware, RequestIdMiddleware
from agent_memory.api.openai import embeddings
from agent_memory.api.openai import routes as openai
from agent_memory.api.responses import routes as responses_api
from agent_memory.api.responses.store import ResponseStore
from agent_memory.api.sealing import Sealer
from agent_memory.api.serving.speaker import tenant
from agent_memory.api.state import ServedModel, ServerState
from agent_memory.chat.images import ImageLimits
from agent_memory.engine.protocol import EngineClient, Health

log = logging.getLogger(__name__)

WIRE_FORMATS = (openai, anthropic, responses_api)  # each: its `router` and the `ERROR_SHAPES` it claims
OPERATOR_ONLY = "/metrics shows every tenant's figures: only the operator's key (--api-key) may read it"


def create_app(
    engines: dict[str, EngineClient],
    *,
    host: str,
    port: int,
    api_keys: dict[str, str],
    max_waiting: int,
    responses: ResponseStore,
    sealer: Sealer,
    log_agent_ids: bool = False,
    images: ImageLimits = ImageLimits(),
    on_load_failure: Callable[[], None],
    warm_prompts: list[heads.HeadRequest] = (),
) -> FastAPI:
    """`engines`: the served models' engines by the model id each is served under; the first
    answers requests naming a model no engine answers to. `warm_prompts`: heads computed once
    the models load (api/heads.py)."""
    state = ServerState(
        models={model_id: ServedModel(model_id, engine, images) for model_id, engine in engines.items()},
        max_waiting=max_waiting,
        log_agent_ids=log_agent_ids,
    )

    @asynccontextmanager
    async def lifespan(app: FastAPI):
        for engine in engines.values():
            engine.start()
        await asyncio.to_thread(responses.load)
        auth = f"API keys: {len(api_keys)} ({len(set(api_keys.values()))} tenants)" if api_keys else "no API key"
        url = base_url(host, port)
        watchers = [asyncio.create_task(_watch_load(e, on_load_failure, url, auth)) for e in engines.values()]
        watchers.append(asyncio.create_task(heads.warm(state, list(warm_prompts))))
        yield
        for watcher in watchers:
            watcher.cancel()
        for engine in engines.values():
            await asyncio.to_thread(engine.stop)
        for model in state.models.values():
            model.tokenizer_pool.shutdown()
            model.render_pool.shutdown()
        responses.close()

    app = FastAPI(title="agent-memory", version=__version__, lifespan=lifespan, docs_url=None, redoc_url=None)
    app.state.server = state
    app.state.responses = responses  # the Responses routes' store (responses/routes.stored_responses)
    app.state.sealer = sealer  # seals reasoning handed to clients (sealing.request_sealer)
    shapes = ErrorShapes({prefix: shape for wire in WIRE_FORMATS for prefix, shape in wire.ERROR_SHAPES.items()})
    errors.install(app, shapes)
    for wire in WIRE_FORMATS:
        app.include_router(wire.router)
    app.include_router(embeddings.router)
    app.include_router(heads.router)  # first: its pin routes' paths are ids to agents.router's
    app.include_router(agents.router)
    app.include_router(dashboard.router)

    registry = exported(engines)

    @app.get("/health")
    async def health():
        """The first engine loading or failed answers (503); else the kv and warm tier of the
        first model that serves, and which models are loaded now. A model whose weights cannot
        be loaded makes it `degraded`, with why (200: the others serve); every model so, 503."""
        return health_answer(engines)

    @app.get("/metrics")
    async def metrics(request: Request) -> Response:
        """Every tenant's figures: the operator's to see (tenant "": --api-key, or no key at all)."""
        if tenant(request):
            raise APIError(403, OPERATOR_ONLY, code="operator_only")
        return Response(generate_latest(registry), media_type=CONTENT_TYPE_LATEST)

    # Added last runs first: request id, access log, Host, key, body size.
    app.add_middleware(BodyLimitMiddleware, shapes=shapes)
    if api_keys:
        app.add_middleware(APIKeyMiddleware, keys=api_keys, shapes=shapes)
    app.add_middleware(HostCheckMiddleware, bind_host=host, shapes=shapes)
    app.add_middleware(AccessLogMiddleware, log_agent_ids=log_agent_ids)
    app.add_middleware(RequestIdMiddleware)
    return app


def _health_response(health: Health) -> JSONResponse:
    body = {"status": health.status} if health.message is None else {"status": health.status, "message": health.message}
    return JSONResponse(body, status_code=503)


async def _watch_load(engine: EngineClient, on_load_failure: Callable[[], None], url: str, auth: str) -> None:
    # Announced before the load ends, so server.json is on disk once /health says ok.
    await asyncio.to_thread(engine.announce, url)
    error = await asyncio.to_thread(engine.wait_loaded)
    if error:
        log.error("the model could not be loaded: %s", error)
        on_load_failure()
        return
    log.info("ready at %s/v1 — %s; %s", url, engine.summary(), auth)


def base_url(host: str, port: int) -> str:
    """Where a client on this machine reaches the server: a wildcard bind is reached on loopback."""
    host = {"0.0.0.0": "127.0.0.1", "": "127.0.0.1", "::": "::1"}.get(host, host)
    return f"http://[{host.strip('[]')}]:{port}" if ":" in host else f"http://{host}:{port}"


def health_answer(engines: dict[str, EngineClient]) -> dict | Response:
    """/health's answer from every engine's Health."""
    answers = {model_id: engine.health() for model_id, engine in engines.items()}
    unavailable = {model_id: h.message for model_id, h in answers.items() if h.status == "unavailable"}
    why = "; ".join(f"the model {model_id} cannot be loaded: {m}" for model_id, m in unavailable.items())
    failed = next((h for h in answers.values() if not h.ok and h.status != "unavailable"), None)
    if failed is None and len(unavailable) == len(answers):
        failed = Health("error", why)
    if failed is not None:
        return _health_response(failed)
    first = next(h for h in answers.values() if h.ok)
    models = [
        {"id": model_id, "loaded": h.loaded, **({"unavailable": h.message} if model_id in unavailable else {})}
        for model_id, h in answers.items()
    ]
    status = {"status": "degraded", "message": why} if unavailable else {"status": "ok"}
    ranks = {"ranks": first.ranks} if first.ranks else {}
    return {**status, "kv": first.kv, "warm_tier": first.warm_tier, "models": models, **ranks}

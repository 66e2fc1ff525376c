"""The FastAPI app: routes, error shape, middleware, and the engine's lifetime."""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable
from contextlib import asynccontextmanager

from fastapi import FastAPI, Request, Response
from fastapi.responses import JSONResponse
from prometheus_client import CONTENT_TYPE_LATEST, generate_latest

from agent_memory import __version__
from agent_memory.api import agents, dashboard, errors
from agent_memory.api.anthropic import routes as anthropic
from agent_memory.api.openai import routes as openai
from agent_memory.api.responses import routes as responses_api
from agent_memory.api.access_log import AccessLogMiddleware
from agent_memory.api.middleware import APIKeyMiddleware, BodyLimitMiddleware, HostCheckMiddleware, RequestIdMiddleware
from agent_memory.api.responses.store import ResponseStore
from agent_memory.api.state import ServerState
from agent_memory.engine.loop import BatchEngine
from agent_memory.engine.warm import warm_health
from agent_memory.memory.folder import Folder

log = logging.getLogger(__name__)


def create_app(
    engine: BatchEngine,
    *,
    model_name: str,
    host: str,
    port: int,
    api_keys: dict[str, str],
    max_waiting: int,
    responses: ResponseStore,
    log_agent_ids: bool = False,
    on_load_failure: Callable[[], None],
) -> FastAPI:
    @asynccontextmanager
    async def lifespan(app: FastAPI):
        engine.start()
        await asyncio.to_thread(responses.load)
        auth = f"API keys: {len(api_keys)} ({len(set(api_keys.values()))} tenants)" if api_keys else "no API key"
        watcher = asyncio.create_task(_watch_load(engine, on_load_failure, base_url(host, port), auth))
        yield
        watcher.cancel()
        await asyncio.to_thread(engine.stop)
        if engine.disk is not None and engine.disk.folder is not None:  # only now: the writer has flushed
            await asyncio.to_thread(_unrecord, engine.disk.folder)
        app.state.server.tokenizer_pool.shutdown()
        responses.close()

    app = FastAPI(title="agent-memory", version=__version__, lifespan=lifespan, docs_url=None, redoc_url=None)
    app.state.server = ServerState(
        engine=engine, model_name=model_name, max_waiting=max_waiting, responses=responses, log_agent_ids=log_agent_ids
    )
    errors.install(app)
    app.include_router(openai.router)
    app.include_router(anthropic.router)
    app.include_router(agents.router)
    app.include_router(responses_api.router)
    app.include_router(dashboard.router)

    @app.get("/health")
    async def health(request: Request):
        engine: BatchEngine = request.app.state.server.engine
        if engine.load_error:
            return JSONResponse({"status": "error", "message": engine.load_error}, status_code=503)
        if not engine.ready.is_set():
            return JSONResponse({"status": "loading"}, status_code=503)
        if problem := engine.problem():
            return JSONResponse({"status": "error", "message": problem}, status_code=503)
        p = engine.precisions
        budget = engine.store.disk_budget_bytes if engine.store is not None else 0
        warm = warm_health(engine.disk, engine.warm_error, budget)
        return {"status": "ok", "kv": {"hot": p.hot.tag, "working": p.working.tag, "disk": p.disk.tag}, "warm_tier": warm}

    @app.get("/metrics")
    async def metrics() -> Response:
        return Response(generate_latest(engine.metrics.registry), media_type=CONTENT_TYPE_LATEST)

    # Added last runs first: request id, access log, Host, key, body size.
    app.add_middleware(BodyLimitMiddleware)
    if api_keys:
        app.add_middleware(APIKeyMiddleware, keys=api_keys)
    app.add_middleware(HostCheckMiddleware, bind_host=host)
    app.add_middleware(AccessLogMiddleware, log_agent_ids=log_agent_ids)
    app.add_middleware(RequestIdMiddleware)
    return app


async def _watch_load(engine: BatchEngine, on_load_failure: Callable[[], None], url: str, auth: str) -> None:
    await asyncio.to_thread(engine.ready.wait)
    if engine.load_error:
        log.error("the model could not be loaded: %s", engine.load_error)
        on_load_failure()
        return
    if engine.disk is not None and engine.disk.folder is not None:  # a shared store records no server
        await asyncio.to_thread(_record, engine.disk.folder, url)
    log.info("ready at %s/v1 — %s", url, summary(engine, auth))


def summary(engine: BatchEngine, auth: str) -> str:
    """What an operator wants to know at a glance: what is served, how memory is spent, where."""
    from agent_memory import blas

    loaded, p, store = engine.loaded, engine.precisions, engine.store
    kv = f"KV exact while hot, {p.hot.tag} once cooled" if p.working != p.hot else f"KV {p.hot.tag}"
    warm = (
        f"warm tier {engine.disk.location} ({len(store.agents)} agents, {store.pool.disk_bytes >> 20} MiB "
        f"of {store.disk_budget_bytes >> 20} MiB at {p.disk.tag})"
        if engine.disk is not None
        else f"no warm tier ({engine.warm_error or 'disk budget 0'})"
    )
    return (
        f"model {loaded.name} ({loaded.num_layers} layers, context {loaded.context_length}); {kv}; "
        f"hot budget {store.hot_budget_bytes >> 20} MiB; {warm}; batch up to {engine.config.max_batch}; "
        f"BLAS {'OpenBLAS' if blas.OPENBLAS_LOADED else 'MLX reference (slow on CPU)'}; {auth}"
    )


def base_url(host: str, port: int) -> str:
    """Where a client on this machine reaches the server: a wildcard bind is reached on loopback."""
    host = {"0.0.0.0": "127.0.0.1", "": "127.0.0.1", "::": "::1"}.get(host, host)
    return f"http://[{host.strip('[]')}]:{port}" if ":" in host else f"http://{host}:{port}"


def _record(folder: Folder, url: str) -> None:
    """server.json: while it names this process, `agent-memory cache rm` and `prune` end agents
    through this server instead of deleting files it counts."""
    try:
        folder.write_server_json(url)
    except OSError as e:
        log.warning("could not write %s (%s): `agent-memory cache` will not know this server", folder.server_json, e)


def _unrecord(folder: Folder) -> None:
    try:
        folder.remove_server_json()
    except OSError as e:
        log.warning("could not remove %s: %s", folder.server_json, e)

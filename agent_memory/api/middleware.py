"""ASGI middleware: request id, Host check, API key, body size limit.

Plain ASGI rather than BaseHTTPMiddleware so streaming responses and client disconnects pass
through untouched. The Host check is Starlette's TrustedHostMiddleware, its plain-text refusal
answered in the API's error shape. The key check stays a middleware rather than FastAPI's
security helpers (HTTPBearer, APIKeyHeader): those are route dependencies, and FastAPI reads
and parses the body before it resolves them (measured: a keyless request with broken JSON gets
422, not 401, and unknown paths a 404), so a client without a key could make the server read
16 MB bodies; they also parse the header only: the constant-time comparison against every
tenant's key, which is the point, would still be ours.
"""

from __future__ import annotations

import json
import secrets
import uuid

from starlette.exceptions import HTTPException
from starlette.middleware.trustedhost import TrustedHostMiddleware

from agent_memory.api.dashboard import SHELL_PATHS
from agent_memory.api.errors import ErrorShapes

MAX_BODY_BYTES = 16 << 20
OPEN_PATHS = {"/health", *SHELL_PATHS}  # the dashboard's page holds no data: its script asks for the key
LOOPBACK_NAMES = {"127.0.0.1", "localhost", "::1", "[::1]"}


OPENAI_SHAPE = ErrorShapes()  # a middleware not told otherwise answers in OpenAI's shape


async def _reject(
    scope,
    send,
    shapes: ErrorShapes,
    status: int,
    message: str,
    code: str | None = None,
    headers: list[tuple[bytes, bytes]] = (),
) -> None:
    status, shaped = shapes.shaped(scope.get("path", ""), status, message, code=code)
    body = json.dumps(shaped).encode()
    await send(
        {
            "type": "http.response.start",
            "status": status,
            "headers": [
                (b"content-type", b"application/json"),
                (b"content-length", str(len(body)).encode()),
                *headers,
            ],
        }
    )
    await send({"type": "http.response.body", "body": body})


def _header(scope, name: bytes) -> str | None:
    for key, value in scope.get("headers", ()):
        if key == name:
            return value.decode("latin-1")
    return None


class RequestIdMiddleware:
    """Echo the client's X-Request-Id or make one, so logs and clients can name a request."""

    def __init__(self, app) -> None:
        self.app = app

    async def __call__(self, scope, receive, send):
        if scope["type"] != "http":
            return await self.app(scope, receive, send)
        request_id = _header(scope, b"x-request-id") or uuid.uuid4().hex
        scope.setdefault("state", {})["request_id"] = request_id

        async def send_with_id(message):
            if message["type"] == "http.response.start":
                message["headers"] = [*message.get("headers", []), (b"x-request-id", request_id.encode())]
            await send(message)

        await self.app(scope, receive, send_with_id)


class HostCheckMiddleware:
    """Refuse Host headers naming other sites: a web page must not reach a loopback server
    through DNS rebinding. Starlette's TrustedHostMiddleware decides (it parses the header,
    bracketed IPv6 and ports included); what it refuses is answered here, in the API's shape,
    instead of its text/plain "Invalid host header"."""

    def __init__(self, app, bind_host: str, shapes: ErrorShapes = OPENAI_SHAPE) -> None:
        self.app, self.shapes = app, shapes
        bind = bind_host.strip("[]").lower()
        if bind in ("0.0.0.0", "::", ""):
            self.hosts = ["*"]
        else:
            self.hosts = sorted(LOOPBACK_NAMES | {bind} | ({f"[{bind}]"} if ":" in bind else set()))

    async def __call__(self, scope, receive, send):
        if scope["type"] != "http" or self.hosts == ["*"]:
            return await self.app(scope, receive, send)

        async def through(scope, receive, _):
            await self.app(scope, receive, send)  # allowed: the real send, nothing of ours in between

        async def refuse(message):  # refused: our answer instead of its text/plain one
            if message["type"] == "http.response.start":
                host = _header(scope, b"host")
                why = f"Host {host!r} is not allowed" if host else "a Host header is required"
                await _reject(scope, send, self.shapes, 400, why, "invalid_host")

        await TrustedHostMiddleware(through, self.hosts, www_redirect=False)(scope, receive, refuse)


class APIKeyMiddleware:
    """Require a key as `Authorization: Bearer KEY` or `x-api-key: KEY` (not for /health).
    Each key belongs to a tenant, recorded for the routes: its own agents and blocks."""

    def __init__(self, app, keys: dict[str, str], shapes: ErrorShapes = OPENAI_SHAPE) -> None:
        self.app, self.shapes = app, shapes
        self.keys = [(key.encode(), tenant) for key, tenant in keys.items()]

    async def __call__(self, scope, receive, send):
        if scope["type"] != "http" or scope["path"] in OPEN_PATHS:
            return await self.app(scope, receive, send)
        auth = _header(scope, b"authorization") or ""
        given = (auth[7:] if auth.lower().startswith("bearer ") else _header(scope, b"x-api-key") or "").strip()
        tenant = None
        for key, name in self.keys:  # every key compared, in constant time each
            if secrets.compare_digest(given.encode("latin-1", "replace"), key):
                tenant = name
        if tenant is None:
            challenge = [(b"www-authenticate", b"Bearer")]  # RFC 9110: a 401 names how to authenticate
            return await _reject(scope, send, self.shapes, 401, "Invalid or missing API key", "invalid_api_key", challenge)
        scope.setdefault("state", {})["tenant"] = tenant
        await self.app(scope, receive, send)


class BodyLimitMiddleware:
    """Refuse bodies over the limit, whether announced by Content-Length or streamed."""

    def __init__(self, app, limit: int = MAX_BODY_BYTES, shapes: ErrorShapes = OPENAI_SHAPE) -> None:
        self.app, self.limit, self.shapes = app, limit, shapes

    async def __call__(self, scope, receive, send):
        if scope["type"] != "http":
            return await self.app(scope, receive, send)
        length = _header(scope, b"content-length")
        if length is not None and length.isdigit() and int(length) > self.limit:
            return await _reject(scope, send, self.shapes, 413, f"request body over {self.limit} bytes", "body_too_large")
        received = 0

        async def limited_receive():
            nonlocal received
            message = await receive()
            if message["type"] == "http.request":
                received += len(message.get("body", b""))
                if received > self.limit:
                    # An HTTPException, so the app's handler answers 413 while reading the body.
                    raise HTTPException(413, f"request body over {self.limit} bytes")
            return message

        await self.app(scope, limited_receive, send)

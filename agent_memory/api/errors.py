"""Every error leaves the server in OpenAI's shape, {"error": {message, type, param, code}},
but on the routes another wire format claims (ErrorShapes, filled by create_app from each wire
format's package): there, in that format's shape."""

from __future__ import annotations

import logging
from collections.abc import Callable

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse
from starlette.exceptions import HTTPException

from agent_memory.api.bodies import escape_surrogates
from agent_memory.chat.images import ImageError
from agent_memory.engine.requests import MODEL_UNAVAILABLE, Failed

log = logging.getLogger(__name__)

ERROR_TYPES = {
    400: "invalid_request_error",
    401: "authentication_error",
    404: "not_found_error",
    405: "invalid_request_error",
    413: "invalid_request_error",
    503: "service_unavailable",
}
# A validation error's kind -> the `code` OpenAI answers it with (else invalid_value).
ERROR_CODES = {
    "invalid_unicode": "invalid_unicode",
    "unsupported_field": "unsupported_parameter",
    "int_type": "invalid_type",
    "float_type": "invalid_type",
    "bool_type": "invalid_type",
    "string_type": "invalid_type",
    "string_too_long": "string_above_max_length",
}


class APIError(Exception):
    def __init__(
        self,
        status: int,
        message: str,
        *,
        param: str | None = None,
        code: str | None = None,
        headers: dict[str, str] | None = None,
    ):
        super().__init__(message)
        self.status, self.message, self.param, self.code = status, message, param, code
        self.headers = headers or {}


def failure(event: Failed) -> APIError:
    """A failed request's error. A model that cannot be loaded is a 500 (the fault is the
    server's, not the request's) that tells the OpenAI and Anthropic SDKs not to retry, as they
    would any 5xx, with `x-should-retry: false` and no Retry-After: no retry mends it."""
    headers = {"x-should-retry": "false"} if event.code == MODEL_UNAVAILABLE else None
    return APIError(event.status, event.message, code=event.code, headers=headers)


def error_body(status: int, message: str, param: str | None = None, code: str | None = None) -> dict:
    return {
        "error": {
            "message": message,
            "type": ERROR_TYPES.get(status, "server_error" if status >= 500 else "invalid_request_error"),
            "param": param,
            "code": code,
        }
    }


# A wire format's errors: (status, message, param, code) -> (the status it answers, the body).
ErrorShape = Callable[[int, str, str | None, str | None], tuple[int, dict]]


class ErrorShapes:
    """Which shape an error takes on which path: a wire format's on the path prefixes it claims
    (the prefix and every path under it), OpenAI's everywhere else."""

    def __init__(self, claims: dict[str, ErrorShape] | None = None) -> None:
        self.claims = dict(claims or {})

    def shaped(
        self, path: str, status: int, message: str, param: str | None = None, code: str | None = None
    ) -> tuple[int, dict]:
        """(status, body) of an error on `path`, in the shape of the wire format that path is."""
        message, param = escape_surrogates(message), None if param is None else escape_surrogates(param)
        for prefix, shape in self.claims.items():
            if path == prefix or path.startswith(prefix + "/"):
                return shape(status, message, param, code)
        return status, error_body(status, message, param, code)

    def response(
        self, path: str, status: int, message: str, param: str | None = None, code: str | None = None
    ) -> JSONResponse:
        status, body = self.shaped(path, status, message, param, code)
        return JSONResponse(body, status_code=status)


def _describe(err: dict) -> tuple[str, str | None]:
    """One readable sentence and the dotted parameter path from a pydantic error."""
    loc = [str(p) for p in err.get("loc", ()) if p not in ("body",)]
    if err.get("type") in ("invalid_unicode", "unsupported_field", "invalid_field"):
        return err["msg"], err["ctx"]["param"]
    if err.get("type") == "unknown_tool":
        return err["msg"], "tool_choice"
    if err.get("type") == "unsupported_part":  # the part itself, not the content holding it
        param = ".".join([*loc, str(err["ctx"]["i"])])
        return f"{param}: {err['msg']}", param
    if err.get("type") == "json_invalid":
        return f"the request body is not valid JSON: {err.get('ctx', {}).get('error', err.get('msg'))}", None
    param = ".".join(loc) or None
    msg = err.get("msg", "invalid value")
    return (f"{param}: {msg}" if param else msg), param


def _note(request: Request, message: str) -> None:
    """Why the request failed, for its access log line (api/access_log.py)."""
    request.scope.setdefault("state", {})["error"] = escape_surrogates(message)


def install(app: FastAPI, shapes: ErrorShapes) -> None:
    """Answer every error raised in a route in the shape of the wire format its path is."""

    @app.exception_handler(APIError)
    async def api_error(request: Request, exc: APIError):
        _note(request, exc.message)
        response = shapes.response(request.scope["path"], exc.status, exc.message, exc.param, exc.code)
        response.headers.update(exc.headers)
        return response

    @app.exception_handler(ImageError)
    async def image_error(request: Request, exc: ImageError):
        """An image the server cannot take (chat/images.py), wherever it was read: its part named."""
        _note(request, str(exc))
        return shapes.response(request.scope["path"], 400, str(exc), exc.where, "invalid_image")

    @app.exception_handler(RequestValidationError)
    async def validation_error(request: Request, exc: RequestValidationError):
        errors = exc.errors()
        message, param = _describe(errors[0]) if errors else ("invalid request", None)
        kind = errors[0].get("type") if errors else None
        code = ERROR_CODES.get(kind) or ("invalid_value" if param else "invalid_json")
        _note(request, message)
        return shapes.response(request.scope["path"], 400, message, param, code)

    @app.exception_handler(HTTPException)
    async def http_error(request: Request, exc: HTTPException):
        _note(request, str(exc.detail))
        return shapes.response(request.scope["path"], exc.status_code, str(exc.detail))

    @app.exception_handler(Exception)
    async def unexpected(request: Request, exc: Exception):
        log.exception("unhandled error")
        _note(request, f"internal error: {type(exc).__name__}")
        return shapes.response(request.scope["path"], 500, "internal server error")

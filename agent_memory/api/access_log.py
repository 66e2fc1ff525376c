"""One log line per HTTP request, when it is over: method, path, status, time, request id, and
for a generation its agent, prompt / cached (hot, warm) / completion tokens, time to first
token, tokens per second and finish reason (the request path fills `scope.state["trace"]`).
Errors say why at INFO; `/health` and `/metrics` polls are DEBUG. Agent ids are hashed unless the operator
asked for them (`--log-agent-ids`): logs travel further than the cache does.
"""

from __future__ import annotations

import hashlib
import logging
import time

log = logging.getLogger("agent_memory.requests")

QUIET_PATHS = {"/health", "/metrics"}


def shown_agent(agent: str | None, tenant: str, log_ids: bool) -> str | None:
    if agent is None or log_ids:
        return agent
    return hashlib.blake2b(f"{tenant}\0{agent}".encode("utf-8", "surrogatepass"), digest_size=6).hexdigest()


class AccessLogMiddleware:
    def __init__(self, app) -> None:
        self.app = app

    async def __call__(self, scope, receive, send):
        if scope["type"] != "http":
            return await self.app(scope, receive, send)
        started = time.perf_counter()
        status = 500

        async def send_status(message):
            nonlocal status
            if message["type"] == "http.response.start":
                status = message["status"]
            await send(message)

        try:
            await self.app(scope, receive, send_status)
        finally:
            state = scope.get("state", {})
            fields = {
                "method": scope["method"],
                "path": scope["path"],
                "status": status,
                "ms": round((time.perf_counter() - started) * 1000, 1),
                "request_id": state.get("request_id"),
                **state.get("trace", {}),
            }
            if "error" in state:
                fields["error"] = state["error"]
            quiet = scope["path"] in QUIET_PATHS  # polled all day: /health says its own state
            text = " ".join(f"{k}={v}" for k, v in fields.items() if v is not None)
            log.log(logging.DEBUG if quiet else logging.INFO, text, extra={"request": fields})

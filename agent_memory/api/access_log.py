"""One log line per HTTP request, when it is over: method, path, status, time, request id, and
for a generation its agent, prompt / cached (hot, warm) / completion tokens, time to first
token, tokens per second and finish reason (the request path fills `scope.state["trace"]`).
A client that left before the response ended is `status=499`, as nginx logs it, on every route,
streamed (the 200 already sent) or not.
Errors say why at INFO; polls (`/health`, `/metrics`, the dashboard) are DEBUG, a 503 "loading" from
/health included (only a crash, 500, lifts a poll to INFO). Agent ids are hashed unless the operator
asked for them (`--log-agent-ids`): logs travel further than the cache does.
"""

from __future__ import annotations

import hashlib
import logging
import time

from agent_memory.agent_key import UNNAMED, AgentKey, key_label

log = logging.getLogger("agent_memory.requests")

QUIET_PATHS = {"/health", "/metrics"}
CLIENT_LEFT = 499  # nginx's status for a client that closed the connection before the response ended
AGENT_PATH = "/v1/agents/"


def shown_agent(agent: AgentKey | None, log_ids: bool) -> str | None:
    """An agent as the log shows it: hashed unless `log_ids`; an unnamed conversation by its id,
    a hash of content already (agent_key.key_label)."""
    if agent is not None and agent.kind == UNNAMED:
        return key_label(agent)
    if agent is None or log_ids:
        return agent.id if agent is not None else None
    return hashlib.blake2b(f"{agent.tenant}\0{agent.id}".encode("utf-8", "surrogatepass"), digest_size=6).hexdigest()


def quiet(method: str, path: str) -> bool:
    """Polls (health, metrics, the dashboard and the agent list it reads) are DEBUG."""
    return path in QUIET_PATHS or path.startswith("/dashboard") or (method == "GET" and path == "/v1/agents")


class AccessLogMiddleware:
    def __init__(self, app, log_agent_ids: bool = False) -> None:
        self.app = app
        self.log_agent_ids = log_agent_ids

    def shown_path(self, path: str, tenant: str) -> str:
        """An agent's route names the agent: hashed like the agent field."""
        if path.startswith(AGENT_PATH) and not self.log_agent_ids:
            return AGENT_PATH + shown_agent(AgentKey(path[len(AGENT_PATH) :], tenant), False)
        return path

    async def __call__(self, scope, receive, send):
        if scope["type"] != "http":
            return await self.app(scope, receive, send)
        started = time.perf_counter()
        status = 500
        ended = left = False  # the response's last byte went out; the client left before it

        async def send_status(message):
            nonlocal status, ended
            if message["type"] == "http.response.start":
                status = message["status"]
            elif message["type"] == "http.response.body" and not message.get("more_body", False):
                ended = True
            await send(message)

        async def receive_watched():
            nonlocal left
            message = await receive()
            left = left or (message["type"] == "http.disconnect" and not ended)
            return message

        try:
            await self.app(scope, receive_watched, send_status)
        finally:
            state = scope.get("state", {})
            fields = {
                "method": scope["method"],
                "path": self.shown_path(scope["path"], state.get("tenant", "")),
                "status": CLIENT_LEFT if left else status,
                "ms": round((time.perf_counter() - started) * 1000, 1),
                "request_id": state.get("request_id"),
                **state.get("trace", {}),
            }
            if "error" in state:
                fields["error"] = state["error"]
            level = logging.DEBUG if quiet(scope["method"], scope["path"]) and status != 500 else logging.INFO
            text = " ".join(f"{k}={v}" for k, v in fields.items() if v is not None)
            log.log(level, text, extra={"request": fields})

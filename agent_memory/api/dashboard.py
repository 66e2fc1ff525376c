"""The operator's dashboard: /dashboard, a plain page whose script reads the JSON API.

The page and its two assets hold no data, so they are served without the API key (like
/health): a browser cannot send a Bearer header when it navigates. The data comes only from
the script's own requests to /v1/agents, /metrics and /health, which carry the key as
`Authorization: Bearer` once the person gives it, typed into the page's form or in the URL
fragment (`/dashboard#key=KEY`). A fragment never leaves the browser, so the key reaches no
access log, proxy or Referer; the script keeps it in sessionStorage (this tab only) and wipes
it from the address bar.
"""

from __future__ import annotations

from importlib.resources import files

from fastapi import APIRouter
from fastapi.responses import Response

router = APIRouter()

STATIC = files("agent_memory.api") / "static"
# URL -> (file under static/, media type)
ASSETS = {
    "/dashboard": ("dashboard.html", "text/html; charset=utf-8"),
    "/dashboard/dashboard.js": ("dashboard.js", "text/javascript; charset=utf-8"),
    "/dashboard/dashboard.css": ("dashboard.css", "text/css; charset=utf-8"),
}
# What APIKeyMiddleware lets through without a key: exactly these, nothing under them.
SHELL_PATHS = frozenset(ASSETS)

HEADERS = {
    # Only our own script and style; nothing inline, no frames, requests to this origin only.
    "Content-Security-Policy": (
        "default-src 'none'; script-src 'self'; style-src 'self'; img-src 'self' data:; "
        "connect-src 'self'; base-uri 'none'; form-action 'none'; frame-ancestors 'none'"
    ),
    "X-Content-Type-Options": "nosniff",
    "Referrer-Policy": "no-referrer",
    "Cache-Control": "no-cache",
}


def _route(path: str, name: str, media_type: str) -> None:
    body = (STATIC / name).read_bytes()  # once, at import: no file I/O on the event loop

    async def asset() -> Response:
        return Response(body, media_type=media_type, headers=HEADERS)

    router.add_api_route(path, asset, methods=["GET", "HEAD"], include_in_schema=False, name=f"dashboard:{name}")


for _path, (_name, _media_type) in ASSETS.items():
    _route(_path, _name, _media_type)

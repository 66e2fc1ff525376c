"""`/v1/models` as clients read it (the list, `client.models.retrieve`, OpenAI's 404), and the
Host and key checks in front of every route: Starlette's TrustedHostMiddleware answering in
the API's error shape, a 401 that says how to authenticate."""

from __future__ import annotations

import openai
import pytest
from starlette.applications import Starlette
from starlette.responses import PlainTextResponse, StreamingResponse
from starlette.routing import Route
from starlette.testclient import TestClient

from agent_memory.api.middleware import APIKeyMiddleware, HostCheckMiddleware
from agent_memory.models.demo import DEMO_ALIAS, DEMO_NAME, aliases


def test_models_list_and_retrieve(server, client):
    listed = client.models.list().data
    assert [m.id for m in listed] == ["tiny"]  # the tiny model has no alias
    model = client.models.retrieve("tiny")
    assert (model.id, model.object, model.owned_by) == ("tiny", "model", "agent-memory")
    with pytest.raises(openai.NotFoundError) as missing:
        client.models.retrieve("gpt-4o")
    assert missing.value.body == {
        "message": "The model 'gpt-4o' does not exist",
        "type": "invalid_request_error",
        "param": "model",
        "code": "model_not_found",
    }
    with server.http() as http:  # ids with slashes (org/name, ft:...) are ids too, not other routes
        response = http.get("/v1/models/org/name")
    assert response.status_code == 404 and response.json()["error"]["code"] == "model_not_found"


def test_the_demo_model_answers_to_demo_too():
    assert aliases(DEMO_NAME) == [DEMO_ALIAS] == ["demo"]
    assert aliases("tiny") == [] and aliases(DEMO_NAME + "-q4") == []


async def _hello(request):
    return PlainTextResponse(f"hello {request.scope.get('state', {}).get('tenant')}")


async def _stream(request):
    async def parts():
        for i in range(3):
            yield f"part {i}\n"

    return StreamingResponse(parts(), media_type="text/plain")


def _client(bind: str, keys: dict[str, str] | None = None) -> TestClient:
    app = Starlette(routes=[Route("/v1/hello", _hello), Route("/v1/stream", _stream), Route("/health", _hello)])
    if keys:
        app = APIKeyMiddleware(app, keys)
    return TestClient(HostCheckMiddleware(app, bind_host=bind), base_url="http://127.0.0.1:8000")


@pytest.mark.parametrize(
    "bind, host, allowed",
    [
        ("127.0.0.1", "127.0.0.1:8000", True),
        ("127.0.0.1", "localhost:8000", True),
        ("127.0.0.1", "LOCALHOST", True),
        ("127.0.0.1", "[::1]:8000", True),
        ("127.0.0.1", "evil.example:8000", False),  # DNS rebinding: a site's own name
        ("127.0.0.1", "127.0.0.1.evil.example", False),
        ("127.0.0.1", "", False),
        ("::1", "[::1]:8000", True),
        ("fe80::1", "[fe80::1]:8000", True),
        ("10.0.0.5", "10.0.0.5:8000", True),
        ("10.0.0.5", "10.0.0.6:8000", False),
        ("0.0.0.0", "anything.example", True),  # a wildcard bind takes any name
    ],
)
def test_host_check(bind, host, allowed):
    response = _client(bind).get("/v1/hello", headers={"host": host})
    if allowed:
        assert response.status_code == 200 and response.text == "hello None"
    else:
        assert response.status_code == 400 and response.headers["content-type"] == "application/json"
        error = response.json()["error"]
        assert error["code"] == "invalid_host" and error["type"] == "invalid_request_error"


def test_the_key_check_names_the_tenant_streams_and_challenges():
    client = _client("127.0.0.1", {"k-team-a": "team-a", "k-team-b": "team-b"})
    assert client.get("/v1/hello", headers={"authorization": "Bearer k-team-b"}).text == "hello team-b"
    assert client.get("/v1/hello", headers={"x-api-key": "k-team-a"}).text == "hello team-a"
    assert client.get("/v1/stream", headers={"x-api-key": "k-team-a"}).text == "part 0\npart 1\npart 2\n"
    assert client.get("/health").status_code == 200
    for headers in ({}, {"authorization": "Bearer nope"}, {"authorization": "Basic k-team-a"}):
        response = client.get("/v1/hello", headers=headers)
        assert response.status_code == 401 and response.headers["www-authenticate"] == "Bearer"
        assert response.json()["error"]["code"] == "invalid_api_key"

"""`chat_template_kwargs` are the chat template's variables, never the template or its renderer's
arguments, and a render is bounded in time: a slow one answers 400 and holds up no other request.
The server's model has the default ChatML template behind a loop over a variable (`spin`), the way
a template could loop over a list a client passed."""

from __future__ import annotations

import asyncio

import httpx
import pytest

from agent_memory.api.state import RENDER_SECONDS
from agent_memory.chat.render import MAX_VARIABLE_DEPTH, MAX_VARIABLES_CHARS
from agent_memory.models.tiny import CHAT_TEMPLATE, ChatTemplate, build_tiny
from tests.support.inprocess import InProcessServer

SPIN = "{% for i in range(spin | default(0)) %}{% for j in range(spin | default(0)) %}{% endfor %}{% endfor %}"
FOREVER = 100_000  # the sandbox's largest range: 10^10 turns of the loop, hours


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    folder = build_tiny(tmp_path_factory.mktemp("models") / "spin", template=ChatTemplate(SPIN + CHAT_TEMPLATE))
    with InProcessServer(folder, tmp_path_factory.mktemp("cache")) as s:
        yield s


def body(variables: dict | None = None, content: str = "hello") -> dict:
    out = {"model": "tiny", "messages": [{"role": "user", "content": content}], "max_tokens": 4, "temperature": 0}
    return out | ({"chat_template_kwargs": variables} if variables is not None else {})


def refused(r: httpx.Response, param: str) -> str:
    """The error's message, after checking it is a 400 in OpenAI's shape naming `param`."""
    assert r.status_code == 400, r.text
    error = r.json()["error"]
    assert error["type"] == "invalid_request_error" and error["param"] == param
    return error["message"]


@pytest.mark.parametrize(
    "name, value",
    [
        ("chat_template", "{% for i in range(1400) %}{% for j in range(1400) %}x{% endfor %}{% endfor %}"),
        ("add_generation_prompt", "yes"),
        ("tokenize", True),
        ("continue_final_message", True),
        ("return_dict", True),
        ("tools", [{"type": "function", "function": {"name": "f"}}]),
        ("documents", [{"title": "t", "text": "x"}]),
        ("messages", []),
        ("conversation", []),
        ("padding", True),
        ("max_length", 1),
        ("return_tensors", "np"),
        ("eos_token", "</s>"),
    ],
)
def test_a_renderer_argument_is_refused_by_name(server, name, value):
    with server.http() as http:
        message = refused(http.post("/v1/chat/completions", json=body({name: value})), f"chat_template_kwargs.{name}")
    assert f"'{name}' is not a chat template variable" in message
    assert not any(internal in message for internal in ("mlx_lm", "transformers", "TokenizerWrapper", "()"))


def test_a_deep_or_large_variable_is_refused(server):
    deep: object = 1
    for _ in range(MAX_VARIABLE_DEPTH + 1):
        deep = [deep]
    with server.http() as http:
        assert "deep" in refused(http.post("/v1/chat/completions", json=body({"x": deep})), "chat_template_kwargs.x")
        large = {"x": "a" * (MAX_VARIABLES_CHARS + 1)}
        assert "characters" in refused(http.post("/v1/chat/completions", json=body(large)), "chat_template_kwargs")


def test_a_template_variable_reaches_the_template(server):
    """A small `spin` is looped over and rendered; a variable the template does not read is harmless."""
    with server.http() as http:
        r = http.post("/v1/chat/completions", json=body({"spin": 30, "enable_thinking": False, "note": {"a": [1]}}))
    assert r.status_code == 200, r.text
    assert r.json()["choices"][0]["message"]["content"] is not None


def test_a_render_that_fails_names_no_library(server):
    """`range("many")` fails in Python, not in the template: the 400 says what failed, not where."""
    with server.http() as http:
        message = refused(http.post("/v1/chat/completions", json=body({"spin": "many"})), "messages")
    assert message == "the chat template cannot render these messages (TypeError)"


def test_a_slow_render_stops_at_its_deadline_and_holds_up_no_other_request(server):
    """A render that would run for hours answers 400 once past RENDER_SECONDS; a request sent
    while it runs is answered before it ends, and the render threads serve on afterwards."""

    async def run() -> tuple[httpx.Response, httpx.Response, bool]:
        async with httpx.AsyncClient(base_url=server.base_url, timeout=120) as http:
            slow = asyncio.ensure_future(http.post("/v1/chat/completions", json=body({"spin": FOREVER})))
            await asyncio.sleep(0.5)  # so that the slow one is rendering first
            quick = await http.post("/v1/chat/completions", json=body(content="meanwhile"))
            still_rendering = not slow.done()
            return quick, await slow, still_rendering

    quick, slow, still_rendering = asyncio.run(run())
    assert quick.status_code == 200, quick.text
    assert still_rendering
    message = refused(slow, "messages")
    assert message == f"the chat template took longer than {RENDER_SECONDS} s to render these messages"
    with server.http() as http:
        for _ in range(6):  # more than there are render threads: the interrupted one serves again
            assert http.post("/v1/chat/completions", json=body({"spin": 3})).status_code == 200


def test_responses_and_messages_take_no_template_variables(server):
    """Only chat completions passes variables: elsewhere `chat_template_kwargs` is an ignored
    field, which never reaches the template (`spin` would hold the render to its deadline)."""
    with server.http() as http:
        r = http.post(
            "/v1/responses",
            json={"model": "tiny", "input": "hi", "max_output_tokens": 4, "chat_template_kwargs": {"spin": FOREVER}},
        )
        assert r.status_code == 200, r.text
        r = http.post(
            "/v1/messages",
            json={
                "model": "tiny",
                "max_tokens": 4,
                "messages": [{"role": "user", "content": "hi"}],
                "chat_template_kwargs": {"spin": FOREVER},
            },
        )
        assert r.status_code == 200, r.text

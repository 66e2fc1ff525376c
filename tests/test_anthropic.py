"""The Anthropic Messages API (/v1/messages, /v1/messages/count_tokens) through the official
`anthropic` SDK, with strict response validation, against the real server on the tiny random
model; Claude-Code-shaped requests (research: its wire shapes, billing line, user id); and the
parts that need no model (the stream's event order on scripted engine events, the keep-alive,
stop strings, top-k)."""

from __future__ import annotations

import asyncio
import contextlib
import copy
import json
import re
from types import SimpleNamespace

import anthropic
import httpx
import jsonschema
import pytest

from agent_memory.api.anthropic import conversation as anthropic_conversation
from agent_memory.api.anthropic import messages as wire
from agent_memory.api.keepalive import with_keepalive
from agent_memory.api.anthropic.reply import Reply
from agent_memory.api.anthropic.schemas import MessagesRequest
from agent_memory.api.sealing import THINKING, Sealer
from agent_memory.chat.reader import ReplyReader
from agent_memory.chat.toolcalls import ToolCallParser
from agent_memory.engine.requests import Failed, Finished, TextDelta, Usage
from agent_memory.engine.tokens.stops import StopMatcher
from tests.support.chat import WEATHER
from tests.support.inprocess import InProcessServer


TOOLS = [
    {"name": "get_weather", "description": "The forecast for a city.", "input_schema": WEATHER},
    {
        "name": "add",
        "description": "Add two digits.",
        "input_schema": {
            "type": "object",
            "properties": {"a": {"type": "integer", "minimum": 0, "maximum": 9}},
            "required": ["a"],
        },
    },
]
HI = [{"role": "user", "content": "Tell me about lighthouses."}]
GREEDY = {"temperature": 0}  # SDK 2.x no longer types temperature/top_p/top_k: extra_body
SIGN = Sealer(bytes(32)).for_tenant("", THINKING).seal  # a thinking block's signature, for the replies built here


def sdk(server: InProcessServer, **kw) -> anthropic.Anthropic:
    return anthropic.Anthropic(
        base_url=server.base_url, api_key=kw.pop("api_key", "unused"), _strict_response_validation=True, max_retries=0, **kw
    )


@pytest.fixture(scope="module")
def claude(server) -> anthropic.Anthropic:
    return sdk(server)


def create(client: anthropic.Anthropic, messages=HI, max_tokens: int = 16, **kw):
    kw.setdefault("extra_body", GREEDY)
    return client.messages.create(model="claude-sonnet-4-6", max_tokens=max_tokens, messages=messages, **kw)


def text_of(message) -> str:
    return "".join(b.text for b in message.content if b.type == "text")


def prompt_tokens(usage) -> int:
    return usage.input_tokens + usage.cache_read_input_tokens + usage.cache_creation_input_tokens


def raw_events(server: InProcessServer, body: dict, path: str = "/v1/messages", headers: dict | None = None) -> list[tuple[str, dict]]:
    """(event, data) of a streamed request, read off the wire."""
    with httpx.stream("POST", server.base_url + path, json={**body, "stream": True}, headers=headers, timeout=120) as r:
        assert r.status_code == 200 and r.headers["content-type"].startswith("text/event-stream")
        text = "".join(r.iter_text())
    events = []
    for frame in text.strip().split("\n\n"):
        lines = dict(line.split(": ", 1) for line in frame.split("\n"))
        events.append((lines["event"], json.loads(lines["data"])))
    return events


def check_order(events: list[tuple[str, dict]]) -> None:
    """Anthropic's sequence: message_start; blocks 0, 1, … each start, deltas, stop;
    message_delta; message_stop; pings anywhere after the start; every name its data's type."""
    names = [name for name, data in events if name != "ping"]
    assert all(name == data["type"] for name, data in events)
    assert names[0] == "message_start" and names[-2:] == ["message_delta", "message_stop"]
    index, open_block = -1, None
    for name, data in events[1:-2]:
        if name == "content_block_start":
            assert open_block is None and data["index"] == index + 1
            index, open_block = data["index"], data["content_block"]["type"]
            if open_block == "tool_use":
                assert data["content_block"]["input"] == {} and data["content_block"]["id"].startswith("toolu_")
        elif name == "content_block_delta":
            assert data["index"] == index
            assert data["delta"]["type"] == {"text": "text_delta", "tool_use": "input_json_delta"}[open_block]
        elif name == "content_block_stop":
            assert data["index"] == index and open_block is not None
            open_block = None
        else:
            assert name == "ping", name
    assert open_block is None
    start, delta = events[0][1]["message"], events[-2][1]
    assert start["content"] == [] and start["stop_reason"] is None
    assert delta["usage"]["output_tokens"] > 0 and delta["delta"]["stop_reason"]


# -- through the server ------------------------------------------------------------------


def test_text_reply_streamed_and_not_are_the_same(server, claude):
    m = create(claude)
    assert m.id.startswith("msg_") and m.model == "claude-sonnet-4-6" and m.role == "assistant"
    assert m.stop_reason == "max_tokens" and m.stop_sequence is None
    assert [b.type for b in m.content] == ["text"] and m.usage.output_tokens == 16
    # The prompt is what was read and what was computed (and is now cached): none is left out.
    u = m.usage
    assert u.input_tokens == 0 and u.cache_creation_input_tokens > 0
    assert u.cache_read_input_tokens == u.model_extra["cache_read_hot_input_tokens"] + u.model_extra["cache_read_warm_input_tokens"]

    body = {"model": "m", "max_tokens": 16, "messages": HI, "temperature": 0}
    events = raw_events(server, body, "/v1/messages?beta=true", {"anthropic-version": "2023-06-01", "anthropic-beta": "a-1,b-2"})
    check_order(events)
    streamed = "".join(d["delta"]["text"] for name, d in events if name == "content_block_delta")
    assert streamed == text_of(m)
    final = events[-2][1]
    assert final["delta"] == {"stop_reason": "max_tokens", "stop_sequence": None}
    assert prompt_tokens(SimpleNamespace(**final["usage"])) == prompt_tokens(u)

    with claude.messages.stream(model="m", max_tokens=16, messages=HI, extra_body=GREEDY) as stream:
        assert "".join(stream.text_stream) == text_of(m)
        final_message = stream.get_final_message()
    assert final_message.content[0].text == text_of(m) and final_message.stop_reason == "max_tokens"
    assert prompt_tokens(final_message.usage) == prompt_tokens(u) and final_message.usage.output_tokens == 16


def test_a_tool_use_round_trip_reuses_the_first_turn(server, claude):
    user = {"user_id": "weather-user"}
    choice = {"type": "tool", "name": "get_weather"}
    first = create(claude, [{"role": "user", "content": "Weather in Oslo?"}], 60, tools=TOOLS, tool_choice=choice, metadata=user)
    assert first.stop_reason == "tool_use"
    (call,) = first.content
    assert call.type == "tool_use" and call.name == "get_weather" and call.id.startswith("toolu_")
    jsonschema.validate(call.input, WEATHER)

    with claude.messages.stream(
        model="m", max_tokens=60, messages=[{"role": "user", "content": "Weather in Oslo?"}], tools=TOOLS, tool_choice=choice, extra_body=GREEDY
    ) as stream:
        streamed = stream.get_final_message()
    assert [(b.name, b.input) for b in streamed.content] == [(call.name, call.input)] and streamed.stop_reason == "tool_use"

    messages = [
        {"role": "user", "content": "Weather in Oslo?"},
        {"role": "assistant", "content": [b.model_dump(exclude_none=True) for b in first.content]},
        {"role": "user", "content": [{"type": "tool_result", "tool_use_id": call.id, "content": "Sunny, 21°C."}]},
    ]
    second = create(claude, messages, 12, tools=TOOLS, tool_choice={"type": "none"}, metadata=user)
    assert second.stop_reason in ("end_turn", "max_tokens") and all(b.type == "text" for b in second.content)
    assert second.usage.cache_read_input_tokens >= prompt_tokens(first.usage) + first.usage.output_tokens - 4

    # any + disable_parallel_tool_use: exactly one call, of either tool.
    one = create(claude, max_tokens=60, tools=TOOLS, tool_choice={"type": "any", "disable_parallel_tool_use": True})
    assert one.stop_reason == "tool_use" and len(one.content) == 1 and one.content[0].name in ("get_weather", "add")


def test_stop_sequences_name_the_one_that_matched(server, claude):
    text = text_of(create(claude, max_tokens=24))
    stop = next(text[i : i + 3] for i in range(4, len(text) - 3) if text[i : i + 3].strip() and text.find(text[i : i + 3]) == i)
    m = create(claude, max_tokens=24, stop_sequences=["never-written-here", stop])
    assert m.stop_reason == "stop_sequence" and m.stop_sequence == stop
    assert text_of(m) == text[: text.index(stop)]
    events = raw_events(server, {"model": "m", "max_tokens": 24, "messages": HI, "temperature": 0, "stop_sequences": [stop]})
    check_order(events)
    assert events[-2][1]["delta"] == {"stop_reason": "stop_sequence", "stop_sequence": stop}
    # top_k 1 samples the most likely token: the greedy reply, at any temperature.
    assert text_of(create(claude, max_tokens=24, extra_body={"temperature": 1.0, "top_k": 1})) == text


def test_count_tokens_is_the_prompt_a_request_runs(claude):
    body = {
        "system": [{"type": "text", "text": "You answer with tools.", "cache_control": {"type": "ephemeral"}}],
        "messages": [{"role": "user", "content": [{"type": "text", "text": "Weather in Lima?"}]}],
        "tools": TOOLS,
    }
    counted = claude.messages.count_tokens(model="m", **body).input_tokens
    assert prompt_tokens(create(claude, max_tokens=4, **body).usage) == counted
    assert counted > claude.messages.count_tokens(model="m", messages=body["messages"]).input_tokens


def test_count_tokens_compiles_no_grammar(claude):
    """Claude Code's TaskCreate describes `metadata` with propertyNames, which constrained
    decoding cannot enforce: counting the prompt still works (no grammar is made for a count)."""
    task = {
        "name": "TaskCreate",
        "description": "Create a task.",
        "input_schema": {
            "type": "object",
            "properties": {"metadata": {"type": "object", "propertyNames": {"pattern": "^[a-z_]+$"}}},
        },
    }
    counted = claude.messages.count_tokens(model="m", messages=HI, tools=[*TOOLS, task]).input_tokens
    assert counted > claude.messages.count_tokens(model="m", messages=HI, tools=TOOLS).input_tokens


def test_a_second_turn_reads_the_whole_first_turn_from_the_cache(server, claude):
    user = {"user_id": "two-turns"}
    first = create(claude, max_tokens=12, system="Be brief.", metadata=user)
    messages = [*HI, {"role": "assistant", "content": text_of(first)}, {"role": "user", "content": "And then?"}]
    second = create(claude, messages, 12, system=[{"type": "text", "text": "Be brief."}], metadata=user)
    assert second.usage.cache_read_input_tokens >= prompt_tokens(first.usage) + first.usage.output_tokens - 4
    agents = httpx.get(server.base_url + "/v1/agents").json()["data"]
    assert "two-turns" in {a["id"] for a in agents}


@pytest.mark.parametrize(
    "body, status, words",
    [
        ({"messages": HI}, 400, "max_tokens"),  # max_tokens is required
        ({"max_tokens": 4, "messages": HI, "tools": TOOLS, "tool_choice": {"type": "tool", "name": "nope"}}, 400, "nope"),
        ({"max_tokens": 4, "messages": HI, "tool_choice": {"type": "any"}}, 400, "tool_choice"),
        (
            {"max_tokens": 4, "messages": [{"role": "user", "content": [{"type": "image", "source": {"type": "url", "url": "x"}}]}]},
            400,
            "messages.0.content",
        ),
        ({"max_tokens": 4, "messages": [*HI, {"role": "assistant", "content": "Well,"}]}, 400, "prefill"),
        ({"max_tokens": 4, "messages": HI, "tools": [{"name": "f", "input_schema": {"type": "strin"}}]}, 400, "tools.0.input_schema"),
        ({"max_tokens": 4, "messages": HI, "tools": [{"type": "web_search_20250305", "name": "web_search"}]}, 400, "tools.0"),
        ({"max_tokens": 4, "messages": [{"role": "user", "content": "x" * 2_000_000}]}, 400, "context length"),
    ],
)
def test_errors_have_anthropics_shape(server, claude, body, status, words):
    r = httpx.post(server.base_url + "/v1/messages", json={"model": "m", **body}, timeout=60)
    assert r.status_code == status, r.text
    assert r.json()["type"] == "error" and r.json()["error"]["type"] == "invalid_request_error"
    assert words in r.json()["error"]["message"], r.json()
    if "max_tokens" in body:  # the SDK itself insists on it
        with pytest.raises(anthropic.BadRequestError) as e:
            claude.messages.create(model="m", **body)
        assert e.value.body["error"]["type"] == "invalid_request_error"


def test_other_errors_on_these_routes_and_the_openai_shape_elsewhere(server):
    r = httpx.get(server.base_url + "/v1/messages")
    assert r.status_code == 405 and r.json()["type"] == "error"
    r = httpx.post(server.base_url + "/v1/messages/nothing-here", json={})
    assert r.status_code == 404 and r.json()["error"]["type"] == "not_found_error"
    r = httpx.post(server.base_url + "/v1/messages", content=b"{not json", headers={"content-type": "application/json"})
    assert r.status_code == 400 and r.json()["error"]["type"] == "invalid_request_error"
    r = httpx.post(server.base_url + "/v1/messages", content=b" " * (17 << 20), headers={"content-type": "application/json"})
    assert r.status_code == 413 and r.json()["error"]["type"] == "request_too_large"
    r = httpx.post(server.base_url + "/v1/chat/completions", json={"max_tokens": 4})
    assert r.status_code == 400 and set(r.json()["error"]) == {"message", "type", "param", "code"}


def test_keys_and_back_pressure_answer_in_anthropics_shape(tiny_model, tmp_path):
    args = ("--api-key", "sk-right", "--max-batch", "1", "--max-waiting", "2")
    with InProcessServer(tiny_model, tmp_path, *args) as s:
        with pytest.raises(anthropic.AuthenticationError) as e:
            create(sdk(s, api_key="sk-wrong"), max_tokens=2)
        assert e.value.body["error"]["type"] == "authentication_error"
        assert create(sdk(s, api_key="sk-right"), max_tokens=2).usage.output_tokens == 2  # Bearer (SDK 2.x)
        r = httpx.post(
            s.base_url + "/v1/messages",
            json={"model": "m", "max_tokens": 2, "messages": HI},
            headers={"x-api-key": "sk-right", "anthropic-version": "2023-06-01"},
            timeout=60,
        )
        assert r.status_code == 200 and r.json()["type"] == "message"
        r = httpx.post(s.base_url + "/v1/messages/count_tokens", json={"model": "m", "messages": HI})
        assert r.status_code == 401 and r.json()["error"]["type"] == "authentication_error"

        async def burst():
            client = anthropic.AsyncAnthropic(base_url=s.base_url, api_key="sk-right", max_retries=0, _strict_response_validation=True)
            long = "Tell me everything about the history of lighthouses. " * 4

            async def one(i):
                try:
                    return await client.messages.create(model="m", max_tokens=200, messages=[{"role": "user", "content": f"{i}: {long}"}])
                except anthropic.APIStatusError as e:
                    return e

            return await asyncio.gather(*(one(i) for i in range(10)))

        busy = [r for r in asyncio.run(burst()) if isinstance(r, anthropic.APIStatusError)]
        assert busy and len(busy) < 10
        for e in busy:
            assert isinstance(e, anthropic.OverloadedError) and e.status_code == 529
            assert e.body["error"]["type"] == "overloaded_error" and int(e.response.headers["retry-after"]) >= 1


# -- Claude Code -------------------------------------------------------------------------

# Claude Code's turn as recorded before v2.1.181 (research: llama.cpp #20623/#19494 shapes),
# with schemas bounded for the tiny model. Its first system block changes on every request.
CLAUDE_CODE_V2_1_42 = {
    "model": "claude-sonnet-4-5-20250929",
    "max_tokens": 32000,
    "stream": True,
    "system": [
        {"type": "text", "text": "x-anthropic-billing-header: cc_version=2.1.42.834; cc_entrypoint=cli; cch=65abc;"},
        {"type": "text", "text": "You are Claude Code, Anthropic's official CLI for Claude.", "cache_control": {"type": "ephemeral"}},
        {
            "type": "text",
            "text": "\nYou are an interactive CLI tool that helps users with software engineering tasks.\n# Environment\n"
            " - Primary working directory: /home/u/proj\n - Is a git repository: true\n",
            "cache_control": {"type": "ephemeral"},
        },
    ],
    "messages": [
        {
            "role": "user",
            "content": [
                {
                    "type": "text",
                    "text": "<system-reminder>\nAs you answer the user's questions, you can use the following context:\n"
                    "# currentDate\nToday's date is 2026-02-15.\n</system-reminder>\n\n",
                },
                {"type": "text", "text": "list the files", "cache_control": {"type": "ephemeral"}},
            ],
        }
    ],
    "tools": [
        {
            "name": "Bash",
            "description": "Executes a bash command",
            "input_schema": {
                "$schema": "https://json-schema.org/draft/2020-12/schema",
                "type": "object",
                "properties": {"command": {"type": "string", "enum": ["ls", "pwd", "git status"]}},
                "required": ["command"],
                "additionalProperties": False,
            },
            "cache_control": {"type": "ephemeral"},
        },
        {
            "name": "Read",
            "description": "Reads a file",
            "input_schema": {
                "$schema": "https://json-schema.org/draft/2020-12/schema",
                "type": "object",
                "properties": {"file_path": {"type": "string", "enum": ["README.md", "src/main.py"]}},
                "required": ["file_path"],
                "additionalProperties": False,
            },
        },
    ],
    "tool_choice": {"type": "any", "disable_parallel_tool_use": True},  # "auto" in life: a random model calls no tool
    "metadata": {"user_id": "user_7f3c00000000000000000000000000000000000000000000000000000000aa_account__session_0b7e2a64-1111-4c2e-9d53-0c5a6c1f2e90"},
    "thinking": {"type": "enabled", "budget_tokens": 31999},
    "context_management": {"edits": [{"type": "clear_thinking_20251015", "keep": "all"}]},
    "output_config": {"effort": "high"},
    "temperature": 0,
}


def with_cch(body: dict, cch: str) -> dict:
    body = copy.deepcopy(body)
    body["system"][0]["text"] = re.sub(r"cch=[0-9a-f]{5};", f"cch={cch};", body["system"][0]["text"])
    return body


def message_of(events: list[tuple[str, dict]]) -> dict:
    """The final message of a raw stream: content blocks, stop reason and usage."""
    message = events[0][1]["message"]
    for name, data in events:
        if name == "content_block_start":
            message["content"].append({**data["content_block"], "json": ""})
        elif name == "content_block_delta" and data["delta"]["type"] == "input_json_delta":
            message["content"][data["index"]]["json"] += data["delta"]["partial_json"]
        elif name == "message_delta":
            message.update(data["delta"])
            message["usage"].update(data["usage"])
    for block in message["content"]:
        if block["type"] == "tool_use":
            block["input"] = json.loads(block.pop("json") or "{}")
    return message


def test_claude_codes_billing_line_does_not_cost_the_agent_its_cache(server):
    first = message_of(raw_events(server, with_cch(CLAUDE_CODE_V2_1_42, "65abc")))
    (call,) = first["content"]
    assert first["stop_reason"] == "tool_use" and call["name"] in ("Bash", "Read")
    seen = prompt_tokens(SimpleNamespace(**first["usage"])) + first["usage"]["output_tokens"]

    # A background request of the same session in between (a title, with a system prompt of its
    # own): an agent of its own, so it does not move the main agent off its conversation.
    # max_tokens 8 is below any thinking budget Anthropic takes (at least 1024): thinking adaptive.
    title = {**copy.deepcopy(CLAUDE_CODE_V2_1_42), "stream": False, "max_tokens": 8, "tools": None, "tool_choice": None}
    title["thinking"] = {"type": "adaptive"}
    title["system"] = [title["system"][0], {"type": "text", "text": "Write a 3-word title for this conversation."}]
    assert httpx.post(server.base_url + "/v1/messages", json=with_cch(title, "0aaa9"), timeout=60).status_code == 200

    turn2 = with_cch(CLAUDE_CODE_V2_1_42, "1c8b4")  # what Claude Code sends next: a new cch
    turn2["messages"][0]["content"][1].pop("cache_control")
    # The thinking block as the server signs one (sealed with its key, for the keyless tenant "").
    signature = Sealer.from_file(server.cache_dir / "seal.key", create=False).seal("I should look.", "", THINKING)
    turn2["messages"] += [
        {"role": "assistant", "content": [{"type": "thinking", "thinking": "I should look.", "signature": signature}, call]},
        {
            "role": "user",
            "content": [{"type": "tool_result", "tool_use_id": call["id"], "content": "README.md\nsrc", "cache_control": {"type": "ephemeral"}}],
        },
    ]
    turn2["tool_choice"] = {"type": "auto"}
    turn2["max_tokens"], turn2["thinking"] = 8, {"type": "adaptive"}
    second = message_of(raw_events(server, turn2))
    assert second["usage"]["cache_read_input_tokens"] >= seen - 4, (seen, second["usage"])

    ids = {a["id"] for a in httpx.get(server.base_url + "/v1/agents").json()["data"]}
    ours = {i for i in ids if i.startswith("claude-code:0b7e2a64-1111-4c2e-9d53-0c5a6c1f2e90:")}
    assert len(ours) == 2  # the main loop and the title: one agent each


def test_claude_code_v2_1_257_system_messages_and_token_counts(server):
    """Its JSON user id, `role: "system"` messages rendered in place, a `<total_tokens>`
    countdown, and a turn resent as a string that was a list of blocks: turn 2 still reads
    turn 1 whole from the cache."""
    session = "c0cb70b6-938b-4cbb-a8e8-1b8a60b7c4d8"
    user_id = json.dumps({"device_id": "0" * 64, "account_uuid": "", "session_id": session})
    reminder = "<system-reminder>\n# currentDate\nToday's date is 2026-09-01.\n</system-reminder>\n\n"

    def body(messages, left):
        return {
            "model": "claude-opus-5",
            "max_tokens": 64000,
            "system": [
                {"type": "text", "text": "x-anthropic-billing-header: cc_version=2.1.257.1f2; cc_entrypoint=sdk-cli;"},
                {"type": "text", "text": "You are a Claude agent, built on Anthropic's Claude Agent SDK.", "cache_control": {"type": "ephemeral"}},
                {"type": "text", "text": f"\nYou are an interactive agent.\n<total_tokens>{left} tokens left</total_tokens>"},
            ],
            "messages": messages,
            "metadata": {"user_id": user_id},
            "thinking": {"type": "adaptive", "display": "omitted"},
            "temperature": 0,
        }

    agents = [{"role": "system", "content": [{"type": "text", "text": "Available agent types:\n- claude\n\n<total_tokens>150 tokens left</total_tokens>"}]}]
    turn1 = [{"role": "user", "content": [{"type": "text", "text": reminder}, {"type": "text", "text": "say hi"}]}, *agents]
    r = httpx.post(server.base_url + "/v1/messages", json={**body(turn1, 15000000), "max_tokens": 10}, timeout=60)
    first = r.json()
    turn2 = [
        turn1[0],
        {"role": "system", "content": agents[0]["content"][0]["text"]},  # resent as a string
        {"role": "assistant", "content": first["content"]},
        {"role": "user", "content": "and again"},
        {"role": "system", "content": [{"type": "text", "text": "<total_tokens>140 tokens left</total_tokens>"}]},
    ]
    second = httpx.post(server.base_url + "/v1/messages", json={**body(turn2, 14999000), "max_tokens": 4}, timeout=60).json()
    assert second["usage"]["cache_read_input_tokens"] >= prompt_tokens(SimpleNamespace(**first["usage"])) + first["usage"]["output_tokens"] - 4
    ids = {a["id"] for a in httpx.get(server.base_url + "/v1/agents").json()["data"]}
    assert any(i.startswith(f"claude-code:{session}:") for i in ids)


# -- without the model -------------------------------------------------------------------


def streamed(events, parser=None, delay: float = 0, **reply) -> tuple[list[tuple[str, dict]], Reply]:
    """The (event, data) a stream sends for scripted engine events (`delay` s before the
    first: a prefill), and the reply it built."""
    r = Reply("m", parser or ReplyReader(None, None), reply.get("clamped", False), reply.get("prewarm", False), SIGN)

    async def engine():
        await asyncio.sleep(delay)
        for event in events:
            yield event

    async def run():
        return [frame async for frame in wire.message_stream(engine(), r)]

    frames = asyncio.run(run())
    return [(f.split("\n")[0][len("event: ") :], json.loads(f.split("\n")[1][len("data: ") :])) for f in frames], r


def test_text_then_calls_then_a_cut_call_stream_as_blocks_in_order():
    call = '<tool_call>\n{"name": "add", "arguments": {"a": 1}}\n</tool_call>'
    texts = ["Let me ", "add.", call[:20], call[20:], "\n", call[:30], call[30:46]]  # the second cut at {"a":
    events, reply = streamed([*map(TextDelta, texts), Finished("length", Usage(10, 9, 4, 2))], ReplyReader(None, ToolCallParser()))
    check_order(events)
    assert [b["type"] for b in reply.content] == ["text", "tool_use", "tool_use"]
    assert reply.content[0]["text"] == "Let me add." and reply.content[1]["input"] == {"a": 1}
    assert reply.content[2]["input"] == {}  # cut off in its arguments by max_tokens
    assert events[-2][1]["delta"]["stop_reason"] == "max_tokens"
    usage = events[-2][1]["usage"]
    assert (usage["input_tokens"], usage["cache_read_input_tokens"], usage["cache_creation_input_tokens"]) == (0, 6, 4)
    assert (usage["cache_read_hot_input_tokens"], usage["cache_read_warm_input_tokens"]) == (4, 2)


def test_a_long_prefill_is_pinged_through(monkeypatch):
    monkeypatch.setattr(wire, "PING_SECONDS", 0.05)
    events, _ = streamed([TextDelta("hi"), Finished("stop", Usage(5, 2))], delay=0.3)
    check_order(events)
    names = [name for name, _ in events]
    assert names[0] == "message_start" and names[1] == "ping" and names.count("ping") >= 3
    assert events[1][1] == {"type": "ping"}


def test_a_failure_after_the_start_is_an_error_event():
    events, _ = streamed([TextDelta("Hel"), Failed("the server is shutting down", 503, "shutting_down")])
    assert [name for name, _ in events] == ["message_start", "content_block_start", "content_block_delta", "error"]
    assert events[-1][1] == {"type": "error", "error": {"type": "overloaded_error", "message": "the server is shutting down"}}


def test_stop_and_prewarm_and_context_reasons():
    stop = Finished("stop", Usage(5, 2), stop_sequence="END")
    assert streamed([TextDelta("hi"), stop])[0][-2][1]["delta"] == {"stop_reason": "stop_sequence", "stop_sequence": "END"}
    events, reply = streamed([TextDelta("hi"), Finished("length", Usage(5, 1))], prewarm=True)
    assert reply.content == [] and events[-2][1]["usage"]["output_tokens"] == 0
    events, _ = streamed([TextDelta("hi"), Finished("length", Usage(5, 1))], clamped=True)
    assert events[-2][1]["delta"]["stop_reason"] == "model_context_window_exceeded"


def test_keepalive_pings_while_waiting_and_leaving_closes_the_source():
    closed = []

    async def slow():
        try:
            await asyncio.sleep(0.25)
            yield "token"
            await asyncio.sleep(10)
            yield "never"
        finally:
            closed.append(True)

    async def leave_after_the_token():
        got = []
        async with contextlib.aclosing(with_keepalive(slow(), 0.1)) as items:
            async for item in items:
                got.append(item)
                if item == "token":
                    break
        assert closed == [True]  # as soon as the stream is left, not at the loop's end
        return got

    got = asyncio.run(leave_after_the_token())
    assert got[-1] == "token" and got[:-1] and set(got[:-1]) == {None}

    async def disconnect_while_waiting():  # the client leaves during a long prefill
        async def consume():
            async for _ in with_keepalive(slow(), 0.1):
                pass

        task = asyncio.ensure_future(consume())
        await asyncio.sleep(0.15)
        task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await task

    closed.clear()
    asyncio.run(disconnect_while_waiting())
    assert closed == [True]


def test_claude_code_ids_and_what_is_stripped():
    assert anthropic_conversation.claude_code_session(json.dumps({"device_id": "d", "session_id": "abc-123"})) == "abc-123"
    assert anthropic_conversation.claude_code_session("user_00aa_account__session_0b7e2a64-1111") == "0b7e2a64-1111"
    assert anthropic_conversation.claude_code_session("alice") is None and anthropic_conversation.claude_code_session('{"session_id": 5}') is None
    body = MessagesRequest.model_validate(
        {
            "model": "m",
            "max_tokens": 1,
            "messages": HI,
            "system": "x-anthropic-billing-header: cc_version=2.1.37.0d9; cc_entrypoint=cli; cch=fa690;\nBe brief.",
        }
    )
    assert anthropic_conversation.system_text(body.system) == "Be brief."
    blocks = MessagesRequest.model_validate(
        {"model": "m", "max_tokens": 1, "messages": HI, "system": [{"type": "text", "text": "x-anthropic-billing-header: a;"}, {"type": "text", "text": "Be brief."}]}
    )
    assert anthropic_conversation.system_text(blocks.system) == "Be brief."


def test_stop_matcher_names_the_earliest_stop():
    m = StopMatcher(["cd", "bc"])
    assert m.feed("ab") == ("a", False) and m.matched is None
    assert m.feed("cd") == ("", True) and m.matched == "bc"


def test_top_k_keeps_only_the_k_most_likely_tokens():
    import mlx.core as mx

    from agent_memory.engine.tokens.sampling import make_sampler

    logprobs = mx.log(mx.array([[0.05, 0.4, 0.3, 0.25]]))
    draws = {make_sampler(1.0, 1.0, seed, top_k=2)(logprobs).item() for seed in range(40)}
    assert draws == {1, 2}
    assert make_sampler(1.0, 1.0, 0, top_k=1)(logprobs).item() == 1


def test_a_number_past_a_floats_range_still_makes_a_json_reply():
    """`1e999` is valid JSON a model may write into a call: the tool_use input holds the largest
    float instead of infinity, which no JSON reply can carry (it was a 500)."""
    reply = Reply("m", ReplyReader(None, ToolCallParser()), False, False, SIGN)
    reply.feed(TextDelta('<tool_call>\n{"name": "f", "arguments": {"a": 1e999, "b": 2}}\n</tool_call>'))
    reply.feed(Finished("stop", Usage(10, 9)))
    block = reply.message(Finished("stop", Usage(10, 9)))["content"][0]
    assert block["type"] == "tool_use" and block["input"]["b"] == 2
    assert json.loads(json.dumps(block, allow_nan=False))["input"]["a"] > 1e308

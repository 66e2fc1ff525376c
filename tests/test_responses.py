"""The OpenAI Responses API through the official SDK's `responses` resource, on the tiny model:
stored responses continue by `previous_response_id` from the kept KV, also after a restart."""

from __future__ import annotations

import asyncio
import json

import openai
import pytest

from tests.support.chat import weather_agent
from tests.support.inprocess import InProcessServer

WEATHER = {
    "type": "object",
    "properties": {"city": {"type": "string", "enum": ["Paris", "Oslo", "Lima"]}},
    "required": ["city"],
    "additionalProperties": False,
}
TOOLS = [{"type": "function", "name": "get_weather", "description": "The forecast.", "parameters": WEATHER, "strict": True}]
INSTRUCTIONS = "You are the harbour master's assistant. Answer briefly. " * 6


def strict(server: InProcessServer) -> openai.OpenAI:
    return openai.OpenAI(
        base_url=server.base_url + "/v1", api_key="unused", max_retries=0, _strict_response_validation=True
    )


def details(r) -> dict:
    return r.usage.input_tokens_details.model_dump()


def test_a_conversation_by_previous_response_id_survives_a_restart(tiny_model, tmp_path):
    server = InProcessServer(tiny_model, tmp_path)
    with server:
        client = strict(server)
        r1 = client.responses.create(model="tiny", instructions=INSTRUCTIONS, input="When does the ferry leave?", max_output_tokens=12, temperature=0)
        assert r1.status in ("completed", "incomplete") and r1.output_text
        r2 = client.responses.create(
            model="tiny", instructions=INSTRUCTIONS, previous_response_id=r1.id, input="And the next one?", max_output_tokens=12, temperature=0
        )
        # Only the new input was sent; the earlier turn's prompt and reply came from the cache.
        assert r2.usage.input_tokens > r1.usage.input_tokens + r1.usage.output_tokens
        assert details(r2)["cached_tokens"] >= r1.usage.input_tokens + r1.usage.output_tokens - 4
        assert client.responses.retrieve(r2.id).output_text == r2.output_text
    with server:  # a restart: the stored conversation and its KV come back from disk
        client = strict(server)
        r3 = client.responses.create(
            model="tiny", instructions=INSTRUCTIONS, previous_response_id=r2.id, input="Thanks.", max_output_tokens=8, temperature=0
        )
        assert details(r3)["cached_tokens"] > 0 and details(r3)["warm_tokens"] > 0
        assert r3.previous_response_id == r2.id


def test_function_call_round_trip_and_streamed_events(server):
    client = strict(server)
    first = client.responses.create(
        model="tiny", input="Weather in Oslo?", tools=TOOLS, tool_choice="required", parallel_tool_calls=False, max_output_tokens=60, temperature=0
    )
    (call,) = [item for item in first.output if item.type == "function_call"]
    assert call.name == "get_weather" and json.loads(call.arguments)["city"] in ("Paris", "Oslo", "Lima")
    answer = client.responses.create(
        model="tiny",
        previous_response_id=first.id,
        input=[{"type": "function_call_output", "call_id": call.call_id, "output": "Sunny."}],
        tools=TOOLS,
        max_output_tokens=10,
        temperature=0,
    )
    assert answer.output_text and details(answer)["cached_tokens"] >= first.usage.input_tokens
    # The same request streamed: the SDK's stream helper assembles the same response.
    with client.responses.stream(
        model="tiny", input="Weather in Oslo?", tools=TOOLS, tool_choice="required", parallel_tool_calls=False, max_output_tokens=60, temperature=0
    ) as stream:
        kinds = [event.type for event in stream]
        final = stream.get_final_response()
    assert kinds[:3] == ["response.created", "response.in_progress", "response.output_item.added"]
    assert "response.function_call_arguments.delta" in kinds and kinds[-1] == "response.completed"
    (streamed,) = [item for item in final.output if item.type == "function_call"]
    assert (streamed.name, streamed.arguments) == (call.name, call.arguments)


def test_streamed_text_equals_the_stored_response(server):
    client = strict(server)
    deltas, final = [], None
    for event in client.responses.create(model="tiny", input="Say something.", max_output_tokens=12, temperature=0, stream=True):
        if event.type == "response.output_text.delta":
            deltas.append(event.delta)
        elif event.type in ("response.completed", "response.incomplete"):
            final = event.response
    assert "".join(deltas) == final.output_text == client.responses.retrieve(final.id).output_text
    plain = client.responses.create(model="tiny", input="Say something.", max_output_tokens=12, temperature=0)
    assert plain.output_text == final.output_text


def test_json_schema_output_and_errors(server):
    client = strict(server)
    schema = {"type": "object", "properties": {"ok": {"type": "boolean"}}, "required": ["ok"], "additionalProperties": False}
    r = client.responses.create(
        model="tiny", input="Is it fine?", max_output_tokens=20, temperature=0,
        text={"format": {"type": "json_schema", "name": "verdict", "schema": schema, "strict": True}},
    )
    assert isinstance(json.loads(r.output_text)["ok"], bool)
    with pytest.raises(openai.BadRequestError) as e:
        client.responses.create(model="tiny", input="Hi", previous_response_id="resp_nope", max_output_tokens=2)
    assert e.value.code == "previous_response_not_found" and e.value.param == "previous_response_id"
    unstored = client.responses.create(model="tiny", input="Hi", store=False, max_output_tokens=2)
    with pytest.raises(openai.NotFoundError):
        client.responses.retrieve(unstored.id)
    stored = client.responses.create(model="tiny", input="Hi", max_output_tokens=2)
    client.responses.delete(stored.id)
    with pytest.raises(openai.NotFoundError):
        client.responses.retrieve(stored.id)
    with pytest.raises(openai.BadRequestError) as e:
        client.responses.create(model="tiny", input=[{"type": "item_reference", "id": "msg_1"}], max_output_tokens=2)
    assert e.value.param == "input.0.type"


def test_the_agents_sdk_default_model_runs_on_responses(server):
    from agents import OpenAIResponsesModel, Runner

    agent, seen = weather_agent(
        OpenAIResponsesModel(model="tiny", openai_client=server.async_client()),
        max_tokens=60,
        # The tiny model's free text runs to max_tokens, which the SDK reads as a failed turn
        # under Responses: end the run with the tool's result.
        tool_use_behavior="stop_on_first_tool",
    )
    result = asyncio.run(Runner.run(agent, "What is the weather in Lima?", max_turns=4))
    assert seen and result.final_output == f"Sunny in {seen[0]}."


def test_stored_responses_are_bounded_least_recently_used_first(tmp_path):
    from agent_memory.api.responses.store import ResponseStore, StoredResponse
    from agent_memory.chat.conversation import Message

    ended = []
    store = ResponseStore(tmp_path, budget_bytes=600, end_kv=ended.append)
    for i in range(3):
        store.put(StoredResponse(f"resp_{i}", "", [Message("user", "x" * 100)], {"id": f"resp_{i}"}))
        if i == 1:
            assert store.get("", "resp_0")  # used: now the most recent
    store.close()
    assert store.get("", "resp_1") is None and store.get("", "resp_0") and store.get("", "resp_2")
    assert [key.id for key in ended] == ["resp_1"]
    reloaded = ResponseStore(tmp_path, budget_bytes=600, end_kv=ended.append)
    reloaded.load()
    assert {reloaded.get("", r) is not None for r in ("resp_0", "resp_2")} == {True}
    assert reloaded.get("other-tenant", "resp_0") is None


def test_a_streamed_reply_and_a_json_reply_are_built_alike():
    """responses.reply.Reply, fed the same text in fragments or whole: the same output items
    (text, call, then text after it as its own message), numbered events, and calls parsed."""
    from agent_memory.api.responses.reply import Reply
    from agent_memory.chat.reader import ReplyReader
    from agent_memory.chat.toolcalls import ToolCallParser
    from agent_memory.engine.requests import Finished, TextDelta, Usage

    text = 'Checking. <tool_call>\n{"name": "get_weather", "arguments": {"city": "Oslo"}}\n</tool_call> Done.'
    finished = Finished("stop", Usage(prompt_tokens=5, completion_tokens=9))

    def build(pieces: list[str]) -> tuple[list[dict], list[str], Reply]:
        output: list[dict] = []
        reply = Reply(output, ReplyReader(None, ToolCallParser()))
        frames = [f for p in pieces for f in reply.feed(TextDelta(p))] + reply.feed(finished)
        return output, frames, reply

    def shape(items: list[dict]) -> list[tuple]:
        return [(i["type"], i.get("name"), i.get("arguments"), [c["text"] for c in i.get("content", [])]) for i in items]

    whole, _, whole_reply = build([text])
    streamed, frames, streamed_reply = build([text[i : i + 3] for i in range(0, len(text), 3)])
    assert shape(streamed) == shape(whole)
    assert [i["type"] for i in whole] == ["message", "function_call", "message"]
    assert json.loads(whole[1]["arguments"]) == {"city": "Oslo"}
    assert all(i["status"] == "completed" for i in streamed)
    assert [json.loads(f.split("data: ", 1)[1])["sequence_number"] for f in frames] == list(range(len(frames)))
    assert streamed_reply.text == whole_reply.text and [c.name for c in streamed_reply.calls] == ["get_weather"]
    # A reply with nothing in it still has a message item.
    empty: list[dict] = []
    Reply(empty, ReplyReader(None, None)).feed(finished)
    assert shape(empty) == [("message", None, None, [""])]


def test_codex_tools_namespaced_and_hosted(server):
    """Codex CLI's request shape: a `namespace` of function tools is offered to the model as
    `namespace.name` and its call comes back as `name` with its `namespace` (and goes back into
    history from there); a hosted tool (`web_search`) is left out, which the response's header
    says; Codex's other fields (`include`, `client_metadata`, `reasoning.summary`) are taken."""
    agents = {
        "type": "namespace",
        "name": "multi_agent_v1",
        "description": "Tools for sub-agents.",
        "tools": [
            {"type": "function", "name": "close_agent", "strict": False, "parameters": {"type": "object", "properties": {"target": {"type": "string"}}, "required": ["target"]}},
            {"type": "function", "name": "wait_agent", "strict": False, "parameters": {"type": "object", "properties": {}}},
        ],
    }
    body = {
        "model": "tiny",
        "input": [{"type": "message", "role": "user", "content": [{"type": "input_text", "text": "Close agent 7."}]}],
        "tools": [agents, {"type": "web_search", "external_web_access": False}],
        "tool_choice": "required",
        "max_output_tokens": 48,
        "temperature": 0,
        "include": ["reasoning.encrypted_content"],
        "reasoning": {"summary": "auto"},
        "client_metadata": {"turn_id": "t1"},
        "prompt_cache_key": "codex-session",
        "store": False,
    }
    with server.http() as http:
        first = http.post("/v1/responses", json=body)
        assert first.status_code == 200 and first.headers["x-agent-memory-ignored-tools"] == "web_search"
        call = next(i for i in first.json()["output"] if i["type"] == "function_call")
        assert call["namespace"] == "multi_agent_v1" and call["name"] in ("close_agent", "wait_agent")
        followup = {**body, "tool_choice": "auto", "input": body["input"] + [call, {"type": "function_call_output", "call_id": call["call_id"], "output": "closed"}]}
        second = http.post("/v1/responses", json=followup)
    assert second.status_code == 200
    usage = first.json()["usage"]
    assert second.json()["usage"]["input_tokens_details"]["cached_tokens"] >= usage["input_tokens"] + usage["output_tokens"] - 1

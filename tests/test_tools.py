"""Tool calls and structured output through the real server and the official SDK, on the tiny
random model: whatever it would write, constrained decoding makes calls that parse and
arguments and JSON that validate."""

from __future__ import annotations

import asyncio
import json
from pathlib import Path

import httpx
import jsonschema
import pytest

from agent_memory.chat.conversation import Conversation, Message, Tool, ToolChoice
from agent_memory.chat.grammar import GrammarCompiler
from agent_memory.chat.events import CallArguments, CallCutOff, CallStart, ContentDelta
from agent_memory.chat.reader import ReplyReader
from agent_memory.chat.toolcalls import ToolCallParser
from tests.support.chat import WEATHER, weather_agent
from tests.support.inprocess import InProcessServer

ADD = {
    "type": "object",
    "properties": {"a": {"type": "integer", "minimum": 0, "maximum": 9}, "b": {"type": "integer", "minimum": 0, "maximum": 9}},
    "required": ["a", "b"],
    "additionalProperties": False,
}
TOOLS = [
    {"type": "function", "function": {"name": "get_weather", "description": "The forecast for a city.", "parameters": WEATHER}},
    {"type": "function", "function": {"name": "add", "description": "Add two digits.", "parameters": ADD}},
]
SCHEMAS = {"get_weather": WEATHER, "add": ADD}
# Qwen Code 0.24.4's `agent` tool, whose fork_turns is a oneOf (tests/data/qwen_code/README.md).
QWEN_AGENT = json.loads((Path(__file__).parent / "data" / "qwen_code" / "agent_tool.json").read_text())
QUESTION = [{"role": "system", "content": "You answer with tools."}, {"role": "user", "content": "Weather in Oslo?"}]
ANSWER = {
    "type": "object",
    "properties": {
        "answer": {"type": "string", "maxLength": 12},
        "score": {"type": "integer", "minimum": 0, "maximum": 99},
        "ok": {"type": "boolean"},
    },
    "required": ["answer", "score", "ok"],
    "additionalProperties": False,
}


def create(client, messages=QUESTION, **kw):
    kw.setdefault("max_tokens", 80)
    return client.chat.completions.create(model="tiny", messages=messages, temperature=0, **kw)


def check_calls(calls) -> None:
    assert calls
    for call in calls:
        assert call.type == "function" and call.id.startswith("call_")
        jsonschema.validate(json.loads(call.function.arguments), SCHEMAS[call.function.name])


def streamed(client, **kw) -> tuple[str, dict[int, dict], str]:
    """(content, calls by index {id, name, arguments}, finish reason) of a streamed request."""
    content, calls, finish = "", {}, None
    for chunk in create(client, stream=True, **kw):
        choice = chunk.choices[0]
        content += choice.delta.content or ""
        for delta in choice.delta.tool_calls or []:
            if delta.id is not None:  # the first delta of a call: index, id, type, name
                assert delta.index not in calls and delta.type == "function" and delta.function.name
                calls[delta.index] = {"id": delta.id, "name": delta.function.name, "arguments": ""}
            calls[delta.index]["arguments"] += delta.function.arguments or ""
        finish = choice.finish_reason or finish
    return content, calls, finish


@pytest.mark.parametrize(
    "choice, names",
    [("required", {"get_weather", "add"}), ({"type": "function", "function": {"name": "get_weather"}}, {"get_weather"})],
)
def test_required_and_named_choices_make_valid_calls_streamed_as_deltas(client, choice, names):
    r = create(client, tools=TOOLS, tool_choice=choice, parallel_tool_calls=False)
    message = r.choices[0].message
    assert r.choices[0].finish_reason == "tool_calls" and message.content is None
    assert len(message.tool_calls) == 1 and message.tool_calls[0].function.name in names
    check_calls(message.tool_calls)
    content, calls, finish = streamed(client, tools=TOOLS, tool_choice=choice, parallel_tool_calls=False)
    assert finish == "tool_calls" and content == ""
    assert [(c["name"], c["arguments"]) for c in calls.values()] == [
        (c.function.name, c.function.arguments) for c in message.tool_calls
    ]


def token_ids(tiny_model, text: str) -> list[int]:
    from tokenizers import Tokenizer

    return Tokenizer.from_file(str(tiny_model / "tokenizer.json")).encode(text, add_special_tokens=False).ids


def test_parallel_calls_get_distinct_indexes(client, tiny_model):
    # With end-of-sequence forbidden, the model must go on with more calls after the first.
    no_end = {str(i): -100 for i in token_ids(tiny_model, "<|im_end|><|endoftext|>")}
    kw = {"tools": TOOLS, "tool_choice": "required", "max_tokens": 130, "logit_bias": no_end}
    calls = create(client, **kw).choices[0].message.tool_calls
    assert len(calls) >= 2 and len({c.id for c in calls}) == len(calls)
    check_calls(calls)
    _, streamed_calls, finish = streamed(client, **kw)
    # Near max_tokens the last call is finished and the reply ended (test_ends_well.py), not cut off.
    assert finish == "tool_calls" and sorted(streamed_calls) == list(range(len(streamed_calls)))
    assert [(c["name"], c["arguments"]) for c in streamed_calls.values()][: len(calls)] == [
        (c.function.name, c.function.arguments) for c in calls
    ]
    single = create(client, **{**kw, "parallel_tool_calls": False})
    assert len(single.choices[0].message.tool_calls) == 1


def test_none_and_auto_never_return_a_malformed_call(client):
    for choice in ("none", "auto"):
        for question in ("Weather in Oslo?", "Tell me a story.", "Add 1 and 2."):
            r = create(client, messages=[{"role": "user", "content": question}], tools=TOOLS, tool_choice=choice)
            message = r.choices[0].message
            if choice == "none":
                assert not message.tool_calls and message.content
            elif message.tool_calls:
                check_calls(message.tool_calls)
            assert "<tool_call>" not in (message.content or "") or r.choices[0].finish_reason == "length"


def test_auto_constrains_a_call_once_the_model_opens_one(tiny_model):
    """The auto grammar, driven token by token with the tiny model's tokenizer: free text is
    free, but after `<tool_call>` only a valid call (and then nothing but more calls) is allowed."""
    from mlx_lm.tokenizer_utils import load as load_tokenizer

    tokenizer = load_tokenizer(tiny_model)
    compiler = GrammarCompiler(tokenizer, 2048)
    tools = [Tool("get_weather", "", WEATHER), Tool("add", "", ADD)]
    grammar = compiler.grammar(Conversation([Message("user", "hi")], tools, ToolChoice("auto")), "tools", "response_format")

    def accepts(text: str) -> bool:
        matcher = compiler.matcher(grammar)
        return all(matcher.consume_token(t) for t in tokenizer.encode(text, add_special_tokens=False))

    assert accepts("Any text at all, {even} braces.")
    assert accepts('Let me look.<tool_call>\n{"name": "add", "arguments": {"a": 1, "b": 2}}\n</tool_call>')
    assert not accepts('Let me look.<tool_call>\n{"name": "multiply"')
    assert not accepts('<tool_call>\n{"name": "add", "arguments": {"a": 12')
    assert not accepts('<tool_call>\n{"name": "add", "arguments": {"a": 1, "b": 2}}\n</tool_call> and more text')


def test_how_a_reply_ends_a_call_cut_off_before_its_name_or_in_its_arguments():
    """A reply's end, as every wire format reads it (chat/reader.py): a call cut off before
    its name was whole never started, so its text is content (its own text alone, after a
    whole call); one cut off in its arguments is a call cut off, never its markup as text."""
    whole = '<tool_call>\n{"name": "add", "arguments": {"a": 1}}\n</tool_call>\n'

    def ending(text: str) -> tuple[list, list]:
        reader = ReplyReader(None, ToolCallParser())
        outs = reader.read(text) + reader.read(None)
        return outs, reader.calls

    outs, calls = ending('Sure. <tool_call>\n{"name": "ad')
    assert outs == [ContentDelta("Sure. "), ContentDelta('<tool_call>\n{"name": "ad')] and calls == []
    outs, calls = ending(whole + '<tool_call>\n{"na')
    assert outs[-1] == ContentDelta('<tool_call>\n{"na') and [c.name for c in calls] == ["add"]
    outs, calls = ending(whole + '<tool_call>\n{"name": "add", "arguments": {"a": 2')
    assert isinstance(outs[-3], CallStart) and outs[-3].index == 1
    assert outs[-2:] == [CallArguments(1, '{"a": 2'), CallCutOff(1)] and len(calls) == 1
    assert not any(isinstance(o, ContentDelta) and "<tool_call>" in o.text for o in outs)


def test_json_object_and_json_schema_validate(client, tiny_model):
    for question in ("Rate this.", "hi", "Give me a verdict."):
        messages = [{"role": "user", "content": question}]
        fmt = {"type": "json_schema", "json_schema": {"name": "verdict", "schema": ANSWER, "strict": True}}
        r = create(client, messages=messages, response_format=fmt)
        assert r.choices[0].finish_reason == "stop"
        jsonschema.validate(json.loads(r.choices[0].message.content), ANSWER)
    # Any object: the tiny model's strings run long, so a bias helps it close them; the
    # grammar alone decides that what it writes is JSON.
    closers = {str(i): 5 for i in token_ids(tiny_model, '"}')}
    r = create(client, response_format={"type": "json_object"}, max_tokens=300, logit_bias=closers)
    assert r.choices[0].finish_reason == "stop"
    assert isinstance(json.loads(r.choices[0].message.content), dict)


def test_a_three_turn_tool_conversation_reuses_each_previous_turn(client):
    messages = list(QUESTION)
    previous = None
    for turn, choice in enumerate(["required", "required", "none"]):
        r = create(
            client,
            messages=messages,
            tools=TOOLS,
            tool_choice=choice,
            parallel_tool_calls=False,
            max_tokens=40,
            extra_body={"prompt_cache_key": "tool-user"},
        )
        usage = r.usage
        if previous is not None:
            assert usage.prompt_tokens_details.cached_tokens >= previous, (turn, usage)
        previous = usage.prompt_tokens + usage.completion_tokens
        message = r.choices[0].message
        messages.append(message.model_dump(exclude_none=True))
        for call in message.tool_calls or []:
            messages.append({"role": "tool", "tool_call_id": call.id, "content": json.dumps({"forecast": "sunny"})})
    assert [m["role"] for m in messages] == ["system", "user", "assistant", "tool", "assistant", "tool", "assistant"]


def test_eight_concurrent_constrained_and_free_requests_equal_their_solo_runs(server, client):
    kinds = [
        {"tools": TOOLS, "tool_choice": "required", "parallel_tool_calls": False},
        {"response_format": {"type": "json_schema", "json_schema": {"name": "v", "schema": ANSWER}}},
        {},
        {"tools": TOOLS, "tool_choice": {"type": "function", "function": {"name": "add"}}},
    ]
    requests = [
        (kinds[i % 4], [{"role": "user", "content": f"Question number {i}: what now?"}]) for i in range(8)
    ]

    def answer(r):
        m = r.choices[0].message
        return m.content, [(c.function.name, c.function.arguments) for c in m.tool_calls or []]

    solo = [answer(create(client, messages=msgs, max_tokens=40, **kw)) for kw, msgs in requests]

    async def together():
        aclient = server.async_client()
        rs = await asyncio.gather(
            *(
                aclient.chat.completions.create(model="tiny", messages=msgs, temperature=0, max_tokens=40, **kw)
                for kw, msgs in requests
            )
        )
        return [answer(r) for r in rs]

    assert asyncio.run(together()) == solo


@pytest.mark.parametrize(
    "body, param",
    [
        ({"tools": [{"type": "function", "function": {"name": "f", "parameters": {"type": "strin"}}}]}, "tools.0.parameters"),
        ({"tools": TOOLS, "tool_choice": {"type": "function", "function": {"name": "nope"}}}, "tool_choice"),
        ({"tools": [{"type": "retrieval"}]}, "tools.0.type"),
        ({"tools": [{"type": "function", "function": {"name": "bad name!"}}]}, "tools.0.function.name"),
        ({"tool_choice": "required"}, "tool_choice"),
        (
            {"response_format": {"type": "json_schema", "json_schema": {"name": "x", "schema": {"not": {"type": "string"}}}}},
            "response_format",
        ),
    ],
)
def test_bad_tools_and_schemas_are_400_naming_the_field(server, body, param):
    r = httpx.post(
        server.base_url + "/v1/chat/completions",
        json={"messages": [{"role": "user", "content": "hi"}], "max_tokens": 4, **body},
        timeout=60,
    )
    assert r.status_code == 400, r.text
    error = r.json()["error"]
    assert (error["param"] or "").startswith(param), error
    if "not" in json.dumps(body.get("response_format", {})):
        assert "not" in error["message"]


@pytest.mark.parametrize("choice", ["required", "auto"])
def test_an_unenforceable_tool_schema(server, choice):
    """The second tool uses propertyNames (Claude Code's TaskCreate does). A required call must
    be exact: a 400 naming that tool's parameters and the keyword in a sentence, no grammar in
    it. Under auto the request is served, its calls constrained without propertyNames."""
    loose = {"type": "object", "properties": {"m": {"type": "object", "propertyNames": {"pattern": "^[a-z]+$"}}}}
    tools = [TOOLS[0], {"type": "function", "function": {"name": "tag", "parameters": loose}}]
    r = httpx.post(
        server.base_url + "/v1/chat/completions",
        json={"messages": [{"role": "user", "content": "hi"}], "max_tokens": 8, "tools": tools, "tool_choice": choice},
        timeout=60,
    )
    if choice == "auto":
        assert r.status_code == 200, r.text
        return
    assert r.status_code == 400, r.text
    error = r.json()["error"]
    assert error["param"] == "tools.1.parameters"
    assert "propertyNames" in error["message"] and "\n" not in error["message"] and "%json" not in error["message"]


def test_qwen_codes_agent_tool_is_served_under_auto(server):
    """Qwen Code sends no tool_choice; its `agent` tool's fork_turns is a oneOf llguidance cannot
    prove disjoint. The request is served, the tool's calls constrained with oneOf as anyOf,
    said once in the log (a finished call is still checked against the whole schema)."""
    messages = [{"role": "user", "content": "Fork a helper."}]
    body = {"messages": messages, "max_tokens": 8, "tools": [QWEN_AGENT, TOOLS[0]]}
    for _ in range(2):
        r = httpx.post(server.base_url + "/v1/chat/completions", json=body, timeout=60)
        assert r.status_code == 200, r.text
    said = [line for line in server.log().splitlines() if "tool 'agent': its calls are constrained" in line]
    assert len(said) == 1 and "with oneOf as anyOf" in said[0], said


@pytest.mark.parametrize("choice", ["required", {"type": "function", "function": {"name": "agent"}}])
def test_a_required_call_to_qwen_codes_agent_tool_is_refused_in_the_users_terms(server, choice):
    """A call the client requires must follow the whole schema: a 400 naming the tool, its
    parameters and the keyword, never the grammar engine's option names."""
    messages = [{"role": "user", "content": "hi"}]
    body = {"messages": messages, "max_tokens": 8, "tools": [QWEN_AGENT], "tool_choice": choice}
    r = httpx.post(server.base_url + "/v1/chat/completions", json=body, timeout=60)
    assert r.status_code == 400, r.text
    error = r.json()["error"]
    assert error["param"] == "tools.0.parameters" and error["code"] == "invalid_schema"
    assert "tool 'agent'" in error["message"] and "oneOf" in error["message"], error
    assert "coerce" not in error["message"] and "Enable" not in error["message"] and "option" not in error["message"]


def test_a_named_call_is_constrained_by_its_own_tool_alone(server, client):
    """Naming get_weather beside Qwen Code's agent tool: only get_weather can be called, so the
    agent tool's oneOf refuses nothing."""
    named = {"type": "function", "function": {"name": "get_weather"}}
    r = create(client, tools=[QWEN_AGENT, TOOLS[0]], tool_choice=named)
    (call,) = r.choices[0].message.tool_calls
    assert call.function.name == "get_weather"
    jsonschema.validate(json.loads(call.function.arguments), WEATHER)


@pytest.mark.parametrize(
    "ref, said",
    [
        ("#/$defs/city", "its $ref '#/$defs/city' points to nothing in the schema"),
        ("https://example.com/city.json", "its $ref 'https://example.com/city.json' is outside the schema"),
    ],
)
def test_a_ref_that_leads_nowhere_is_said_in_plain_words(server, ref, said):
    parameters = {"type": "object", "properties": {"city": {"$ref": ref}}}
    r = httpx.post(
        server.base_url + "/v1/chat/completions",
        json={
            "messages": [{"role": "user", "content": "hi"}],
            "max_tokens": 4,
            "tools": [{"type": "function", "function": {"name": "weather", "parameters": parameters}}],
        },
        timeout=60,
    )
    assert r.status_code == 400, r.text
    error = r.json()["error"]
    assert error["param"] == "tools.0.parameters" and said in error["message"], error
    assert "registry" not in error["message"] and "Pointer" not in error["message"]  # not the resolver's words


def test_loosen_drops_only_what_cannot_be_enforced():
    from agent_memory.chat.loosen import loosen

    schema = {
        "type": "object",
        "properties": {
            "not": {"type": "string", "format": "made-up"},  # a property named like a keyword stays
            "m": {"type": "object", "propertyNames": {"pattern": "^a"}, "default": {"not": 1}},
        },
        "if": {"properties": {"a": {"const": 1}}},
        "then": {"required": ["m"]},
    }
    refusals = iter(['Unimplemented keys: ["if", "then"]', 'Unimplemented keys: ["propertyNames"]', "Unknown format: made-up"])
    fitted, dropped = loosen(schema, lambda s: next(refusals, None))
    assert dropped == ["if", "then", "propertyNames", "format made-up"]
    assert fitted == {
        "type": "object",
        "properties": {"not": {"type": "string"}, "m": {"type": "object", "default": {"not": 1}}},
    }
    assert loosen(schema, lambda s: "Pointer '/$defs/x' does not exist") is None


def test_loosen_enforces_one_of_as_any_of():
    from agent_memory.chat.loosen import loosen

    schema = {
        "type": "object",
        "properties": {
            "oneOf": {"oneOf": [{"const": 1}, {"type": "integer"}]},  # a property named like a keyword stays
            "both": {"anyOf": [{"type": "string"}], "oneOf": [{"minLength": 1}, {"maxLength": 3}]},
        },
        "default": {"oneOf": 1},
    }
    refusals = iter(["oneOf constraints are not supported. Enable 'coerce_one_of' option to approximate oneOf with anyOf"])
    fitted, dropped = loosen(schema, lambda s: next(refusals, None))
    assert dropped == ["oneOf as anyOf"]
    assert fitted == {
        "type": "object",
        "properties": {
            "oneOf": {"anyOf": [{"const": 1}, {"type": "integer"}]},
            "both": {"anyOf": [{"type": "string"}], "allOf": [{"anyOf": [{"minLength": 1}, {"maxLength": 3}]}]},
        },
        "default": {"oneOf": 1},
    }


def test_the_openai_agents_sdk_runs_an_agent_with_a_tool(server):
    from agents import OpenAIChatCompletionsModel, Runner

    agent, seen = weather_agent(OpenAIChatCompletionsModel(model="tiny", openai_client=server.async_client()), 64)
    result = asyncio.run(Runner.run(agent, "What is the weather in Oslo?", max_turns=4))
    assert seen and seen[0] in ("Paris", "Oslo", "Lima")
    assert isinstance(result.final_output, str)


def test_a_model_whose_template_knows_tools_gets_them_natively(tiny_model, tmp_path):
    """A copy of the tiny model whose chat template renders `tools` itself (as Qwen's does):
    the tools reach the template, not the built-in system text."""
    import shutil

    native = tmp_path / "tiny-native-tools"
    shutil.copytree(tiny_model, native)
    config_path = native / "tokenizer_config.json"
    config = json.loads(config_path.read_text())
    config["chat_template"] = (
        "{% if tools %}<|im_start|>system\nTOOLS:{% for t in tools %} {{ t.function.name }}{% endfor %}<|im_end|>\n{% endif %}"
        "{% for m in messages %}<|im_start|>{{ m.role }}\n{{ m.content }}<|im_end|>\n{% endfor %}"
        "{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}"
    )
    config_path.write_text(json.dumps(config))
    with InProcessServer(native, tmp_path / "cache") as s:
        r = create(s.client(), tools=TOOLS, tool_choice="auto", max_tokens=4)
        plain = create(s.client(), max_tokens=4)
        # The template's own short tool list, not the built-in instructions, went into the prompt.
        assert 0 < r.usage.prompt_tokens - plain.usage.prompt_tokens < 20
        # It names no call format mlx-lm knows: required calls use the built-in JSON one.
        check_calls(create(s.client(), tools=TOOLS, tool_choice="required", parallel_tool_calls=False).choices[0].message.tool_calls)

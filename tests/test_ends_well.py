"""Constrained output always ends well within max_tokens (chat/finish.py, engine/tokens/constraint.py):
a named tool_choice gives exactly one call; required and named calls and JSON answers parse and
validate at small and large budgets, on chat completions, Messages and Responses, streamed and
not, with their end reasons and never markup in the text; a budget smaller than the shortest
valid output is a 400 that says how many tokens it needs. The tiny random model samples at
temperature 1, so it writes long numbers and strings that only the planned finish closes."""

from __future__ import annotations

import json

import anthropic
import httpx
import jsonschema
import pytest

ADD = {"type": "object", "properties": {"a": {"type": "integer"}, "b": {"type": "integer"}}, "required": ["a", "b"]}
CITY = {
    "type": "object",
    "properties": {"city": {"type": "string"}, "days": {"type": "array", "items": {"type": "integer"}, "minItems": 2}},
    "required": ["city", "days"],
}
SCHEMAS = {"add_numbers": ADD, "forecast": CITY}
TOOLS = [
    {"type": "function", "function": {"name": name, "description": name, "parameters": schema}}
    for name, schema in SCHEMAS.items()
]
QUESTION = [{"role": "user", "content": "Add 2 and 3, then give me the forecast for Oslo."}]
# Small: the finish is planned from the first token. Large: past the 64 tokens before the end
# from which a finish is planned (engine/tokens/constraint.py) plus the shortest output (at most
# 45 tokens here), so the model writes freely first, then the finish closes what it opened.
BUDGETS = [64, 128]
SEEDS = [1, 2]


def sample(**kw) -> dict:
    return {"model": "tiny", "temperature": 1.0, **kw}


def check_call(name: str, arguments: str | dict) -> None:
    args = json.loads(arguments) if isinstance(arguments, str) else arguments
    jsonschema.validate(args, SCHEMAS[name])


@pytest.mark.parametrize("seed", SEEDS)
@pytest.mark.parametrize("budget", BUDGETS)
@pytest.mark.parametrize("choice", ["named", "required"])
def test_chat_completions_calls_parse_and_named_is_exactly_one(server, budget, choice, seed):
    client = server.client()
    tool_choice = {"type": "function", "function": {"name": "forecast"}} if choice == "named" else "required"
    kw = sample(messages=QUESTION, tools=TOOLS, tool_choice=tool_choice, max_tokens=budget, seed=seed)
    r = client.chat.completions.create(**kw)
    message = r.choices[0].message
    assert r.choices[0].finish_reason == "tool_calls" and not message.content
    if choice == "named":
        assert [c.function.name for c in message.tool_calls] == ["forecast"]
    for call in message.tool_calls:
        check_call(call.function.name, call.function.arguments)
    calls, content, finish = {}, "", None
    for chunk in client.chat.completions.create(**kw, stream=True):
        delta = chunk.choices[0].delta
        content += delta.content or ""
        for d in delta.tool_calls or []:
            calls.setdefault(d.index, {"name": d.function.name, "arguments": ""})["arguments"] += (
                d.function.arguments or ""
            )
        finish = chunk.choices[0].finish_reason or finish
    assert finish == "tool_calls" and content == "" and calls
    assert [c["name"] for c in calls.values()] == [c.function.name for c in message.tool_calls]
    for call in calls.values():
        check_call(call["name"], call["arguments"])


@pytest.mark.parametrize("seed, stream", list(zip(SEEDS, [False, True])))  # each budget and kind both ways
@pytest.mark.parametrize("budget", BUDGETS)
@pytest.mark.parametrize("kind", ["json_schema", "json_object"])
def test_chat_completions_json_answers_parse(server, budget, kind, seed, stream):
    fmt = (
        {"type": "json_object"}
        if kind == "json_object"
        else {"type": "json_schema", "json_schema": {"name": "f", "schema": CITY}}
    )
    kw = sample(messages=QUESTION, response_format=fmt, max_tokens=budget, seed=seed)
    if stream:
        text, finish = "", None
        for chunk in server.client().chat.completions.create(**kw, stream=True):
            text += chunk.choices[0].delta.content or ""
            finish = chunk.choices[0].finish_reason or finish
    else:
        r = server.client().chat.completions.create(**kw)
        text, finish = r.choices[0].message.content, r.choices[0].finish_reason
    assert finish == "stop"
    answer = json.loads(text)
    assert isinstance(answer, dict)
    if kind == "json_schema":
        jsonschema.validate(answer, CITY)


@pytest.mark.parametrize(
    "choice, budget, stream",  # each choice and budget, streamed or not: each both ways
    [
        ({"type": "tool", "name": "add_numbers"}, BUDGETS[0], False),
        ({"type": "tool", "name": "add_numbers"}, BUDGETS[1], True),
        ({"type": "any"}, BUDGETS[0], True),
        ({"type": "any"}, BUDGETS[1], False),
    ],
)
def test_messages_tool_use_input_validates(server, choice, budget, stream):
    client = anthropic.Anthropic(base_url=server.base_url, api_key="unused", max_retries=0)
    tools = [{"name": n, "description": n, "input_schema": s} for n, s in SCHEMAS.items()]
    kw = dict(
        model="tiny",
        messages=QUESTION,
        tools=tools,
        tool_choice=choice,
        max_tokens=budget,
        extra_body={"temperature": 1.0},
    )
    if stream:
        with client.messages.stream(**kw) as events:
            r = events.get_final_message()
    else:
        r = client.messages.create(**kw)
    uses = [b for b in r.content if b.type == "tool_use"]
    assert r.stop_reason == "tool_use" and uses and all(b.type == "tool_use" for b in r.content)
    if choice["type"] == "tool":
        assert [u.name for u in uses] == ["add_numbers"]
    for use in uses:
        check_call(use.name, use.input)


@pytest.mark.parametrize("budget", BUDGETS)
@pytest.mark.parametrize("stream", [False, True])
def test_responses_calls_and_json_complete(server, budget, stream):
    tools = [{"type": "function", "name": n, "description": n, "parameters": s} for n, s in SCHEMAS.items()]
    client = server.client()
    call = dict(
        model="tiny",
        input=QUESTION,
        tools=tools,
        tool_choice={"type": "function", "name": "add_numbers"},
        max_output_tokens=budget,
        temperature=1.0,
    )
    answer = dict(
        model="tiny",
        input=QUESTION,
        max_output_tokens=budget,
        temperature=1.0,
        text={"format": {"type": "json_schema", "name": "forecast", "schema": CITY}},
    )
    if stream:
        responses = []
        for kw in (call, answer):
            events = list(client.responses.create(**kw, stream=True))
            responses.append(next(e.response for e in events if e.type == "response.completed"))
    else:
        responses = [client.responses.create(**call), client.responses.create(**answer)]
    called, answered = responses
    assert called.status == "completed" and [i.type for i in called.output] == ["function_call"]
    assert called.output[0].name == "add_numbers"
    check_call("add_numbers", called.output[0].arguments)
    assert answered.status == "completed"
    jsonschema.validate(json.loads(answered.output_text), CITY)


def test_a_budget_below_the_shortest_valid_output_is_a_400_saying_what_it_needs(server):
    kw = sample(
        messages=QUESTION,
        tools=TOOLS,
        tool_choice={"type": "function", "function": {"name": "add_numbers"}},
        max_tokens=8,
    )
    r = httpx.post(server.base_url + "/v1/chat/completions", json=kw, timeout=60)
    assert r.status_code == 400
    error = r.json()["error"]
    assert error["param"] == "max_tokens" and "needs at least" in error["message"]
    needed = int(error["message"].split("needs at least ")[1].split()[0])
    ok = httpx.post(server.base_url + "/v1/chat/completions", json={**kw, "max_tokens": needed}, timeout=60)
    assert ok.status_code == 200 and ok.json()["choices"][0]["finish_reason"] == "tool_calls"
    check_call("add_numbers", ok.json()["choices"][0]["message"]["tool_calls"][0]["function"]["arguments"])


def test_free_text_opens_no_call_it_could_not_finish(tiny_model):
    """Under `auto`, free text may open a call (`<tool_call>`) only while the shortest call
    still fits in the tokens left; otherwise the token that would complete the opener is masked
    out, so no call is ever cut off. The grammar processor the engine runs, fed the opener a
    token at a time, with the tiny model's tokenizer."""
    import agent_memory.blas  # noqa: F401
    import mlx.core as mx
    from mlx_lm.tokenizer_utils import load as load_tokenizer

    from agent_memory.chat.conversation import Conversation, Message, Tool, ToolChoice
    from agent_memory.chat.grammar import GrammarCompiler
    from agent_memory.engine.tokens.constraint import GrammarProcessor

    tokenizer = load_tokenizer(tiny_model)
    compiler = GrammarCompiler(tokenizer, 2048)
    tools = [Tool(name, "", schema) for name, schema in SCHEMAS.items()]
    grammar = compiler.grammar(Conversation([Message("user", "hi")], tools, ToolChoice("auto")), "tools", "format")
    text = tokenizer.encode("Let me check.", add_special_tokens=False)
    opener = tokenizer.encode("<tool_call>", add_special_tokens=False)
    shortest = compiler.output(grammar, True).call_tokens
    assert shortest is not None and shortest > len(opener)

    def may_open(max_tokens: int) -> bool:
        """Whether the opener's last token is allowed after the text and the rest of it."""
        processor = GrammarProcessor(compiler.output(grammar, True), 2048, sorted(tokenizer.eos_token_ids), max_tokens)
        context, logits = [0], mx.zeros((1, 2048))
        processor(mx.array(context), logits)  # the first step: nothing generated yet
        for token in text + opener[:-1]:
            context.append(token)
            logits_out = processor(mx.array(context), logits)
        return bool(logits_out[0, opener[-1]].item() > -float("inf"))

    fed = len(text) + len(opener) - 1  # tokens sampled before the opener's last one
    assert may_open(fed + shortest + 40)
    assert not may_open(fed + shortest - len(opener) - 2)


def test_a_schema_whose_shortest_answer_is_long_is_finished_in_time(server):
    """Twelve required fields: the shortest answer alone takes more than the 64 tokens at the
    end of the budget in which a finish is usually planned, so planning starts that much earlier."""
    schema = {
        "type": "object",
        "properties": {f"field_{i}": {"type": "string"} for i in range(12)},
        "required": [f"field_{i}" for i in range(12)],
    }
    fmt = {"type": "json_schema", "json_schema": {"name": "wide", "schema": schema}}
    kw = sample(messages=QUESTION, response_format=fmt, seed=1)
    r = httpx.post(server.base_url + "/v1/chat/completions", json={**kw, "max_tokens": 1}, timeout=60)
    needed = int(r.json()["error"]["message"].split("needs at least ")[1].split()[0])
    assert needed > 64
    answer = server.client().chat.completions.create(**kw, max_tokens=needed + 40)
    assert answer.choices[0].finish_reason == "stop"
    jsonschema.validate(json.loads(answer.choices[0].message.content), schema)


ENDLESS = {"type": "object", "properties": {"next": {"$ref": "#"}}, "required": ["next"]}  # no finite instance
SHORT_LONG = {"type": "string", "minLength": 5, "maxLength": 2}
CONTRADICTION = {"type": "object", "properties": {"a": SHORT_LONG}, "required": ["a"]}


@pytest.mark.parametrize("schema, why", [(ENDLESS, "no finite instance"), (CONTRADICTION, "Unsatisfiable")])
def test_a_call_that_must_be_made_to_a_tool_no_call_fits_is_a_400_naming_it(server, schema, why):
    """Required or named, the call could never end (it was a 200 without one for ENDLESS, the
    engine logging that the grammar refused a token its mask allowed): refused before it runs,
    naming the tool, on each wire format."""
    fn = {"name": "chain", "description": "", "parameters": schema}

    def error(path: str, **body) -> dict:
        r = httpx.post(server.base_url + path, json={"model": "tiny", **body}, timeout=60)
        assert r.status_code == 400, r.text
        return r.json()["error"]

    chat = dict(messages=QUESTION, tools=[{"type": "function", "function": fn}], max_tokens=64)
    errors = [
        error("/v1/chat/completions", **chat, tool_choice="required"),
        error("/v1/chat/completions", **chat, tool_choice={"type": "function", "function": {"name": "chain"}}),
        error("/v1/responses", input=QUESTION, tools=[{"type": "function", **fn}], tool_choice="required"),
    ]
    for e in errors:
        assert e["param"] == "tools.0.parameters" and e["code"] == "invalid_schema"
    tools = [{"name": "chain", "input_schema": schema}]
    anthropic = error("/v1/messages", messages=QUESTION, tools=tools, tool_choice={"type": "any"}, max_tokens=64)
    messages = [e["message"] for e in errors] + [anthropic["message"]]
    assert all("(tool 'chain')" in m and why in m for m in messages), messages


def test_a_schema_that_may_end_its_recursion_is_served(server):
    """Recursion with a way out (the next link may be null) has finite instances."""
    link = {"anyOf": [{"$ref": "#"}, {"type": "null"}]}
    schema = {"type": "object", "properties": {"next": link}, "required": ["next"]}
    tools = [{"type": "function", "function": {"name": "chain", "description": "", "parameters": schema}}]
    kw = sample(messages=QUESTION, tools=tools, tool_choice="required", max_tokens=256, seed=1)
    r = server.client().chat.completions.create(**kw)
    assert r.choices[0].finish_reason == "tool_calls"
    jsonschema.validate(json.loads(r.choices[0].message.tool_calls[0].function.arguments), schema)

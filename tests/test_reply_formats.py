"""Each family's own tool-call and reasoning format, on tiny models that speak the real chat
templates the families publish (tests/data/chat_templates): a required call is constrained to
the family's own layout and parses and validates on all three APIs, streamed and not; reasoning
comes back apart from content; and the next turn, which sends the call and its result back,
reuses the whole previous turn from the cache (the model wrote the call exactly as its
template writes it back)."""

from __future__ import annotations

import json

import anthropic
import jsonschema
import openai
import pytest
from mlx_lm.utils import load_tokenizer

from agent_memory.api.openai.chat import conversation
from agent_memory.api.openai.schemas import ChatCompletionRequest
from agent_memory.chat.formats.reply import reply_format
from agent_memory.chat.render import template_input
from tests.support.inprocess import InProcessServer
from tests.support.templates import TEMPLATES, templated_model


WEATHER_SCHEMA = {
    "type": "object",
    "properties": {
        "city": {"type": "string", "enum": ["Paris", "Oslo", "Lima"]},
        "days": {"type": "integer", "minimum": 1, "maximum": 7},
    },
    "required": ["city"],
}
TOOLS = [
    {
        "type": "function",
        "function": {"name": "get_weather", "description": "The forecast.", "parameters": WEATHER_SCHEMA},
    }
]
MARKUP = (
    "<tool_call>",
    "</tool_call>",
    "<think>",
    "</think>",
    "[TOOL_CALLS]",
    "[ARGS]",
    "<|channel|>",
    "<|message|>",
    "<arg_key>",
    "<function=",
    "[THINK]",
    "[/THINK]",
    "<|end|>",
)
# family -> (its format, whether its prompt opens the reasoning for the model). DeepSeek-V3.1's
# template opens it and writes a call turn back without it: its round trips run with thinking off.
FAMILIES = {
    "qwen3": ("hermes", False),
    "qwen3_coder": ("qwen3_coder", False),
    "qwen3_5": ("qwen3_coder", True),
    "glm4_6": ("glm47", False),
    "gpt_oss": ("harmony", False),
    "devstral": ("mistral", False),
    "ministral3_reasoning": ("mistral", False),
    "deepseek_v3_1": ("deepseek_v3", False),
    "kimi_k2": ("kimi_k2", False),
    "llama3_1": ("llama3_json", False),
}
THINKING_OFF = {"deepseek_v3_1"}
MESSAGES = [
    {"role": "system", "content": "You answer weather questions."},
    {"role": "user", "content": "Weather in Oslo?"},
]


def turn_tokens(family: str) -> int:
    """A turn's budget. A required call is closed in time by the planned finish (chat/finish.py,
    engine/tokens/constraint.py), which closes most calls at any budget (the tiny models write
    long strings): a short budget makes the same kind of turn. Where the prompt opens the
    reasoning, a finish planned from the first token would close it empty: enough for some first.
    A next turn's reply is not read (only its prompt's reuse is), but it may not be shorter than
    its shortest valid form (30 tokens in harmony)."""
    return 96 if FAMILIES[family][1] else 48


@pytest.fixture(scope="module")
def every_format(tmp_path_factory):
    """One server serving every family's templated model (several models, each loaded on its
    first request), and each model's tokenizer by family. It speculates by lookup (the
    default): a tool loop's proposals repeat the previous call through its end token, and where
    they are refused the grammar goes back exactly to the last accepted one
    (engine/tokens/constraint.py)."""
    models = {f: templated_model(tmp_path_factory.getbasetemp() / "templated", f) for f in sorted(FAMILIES)}
    first, *rest = models.values()
    more = [arg for model in rest for arg in ("--model", str(model))]
    with InProcessServer(first, tmp_path_factory.mktemp("cache-formats"), *more) as server:
        yield server, {f: (model.name, load_tokenizer(model)) for f, model in models.items()}


class FamilyServer:
    """The shared server as one family's test sees it: its model's id and tokenizer."""

    def __init__(self, server: InProcessServer, model_id: str, tokenizer) -> None:
        self.server, self.model_id, self.tokenizer = server, model_id, tokenizer

    def __getattr__(self, name):
        return getattr(self.server, name)


@pytest.fixture(params=sorted(FAMILIES))
def family_server(request, every_format):
    server, models = every_format
    return request.param, FamilyServer(server, *models[request.param])


def whole_turn(server, family: str, messages: list[dict]) -> int:
    """The tokens of the next prompt up to the end of the assistant turn in it (the turn the
    model wrote, as its template writes it back), rendered as the server renders it: what the
    cache holds if the model wrote exactly that."""
    tok = server.tokenizer
    fmt = reply_format(tok)
    conv = conversation(ChatCompletionRequest(model="m", messages=messages, tools=TOOLS))
    rendered, tools = template_input(conv, fmt.native, fmt.describe, fmt.history_key)
    first = tok.apply_chat_template(rendered[:2], tools=tools, add_generation_prompt=True, tokenize=False)
    whole = tok.apply_chat_template(rendered, tools=tools, add_generation_prompt=True, tokenize=False)
    assert whole.startswith(first)
    end = min(i for e in TEMPLATES[family]["eos"] if (i := whole.find(e, len(first))) >= 0)
    return len(tok.encode(whole[:end], add_special_tokens=False))


def openai_turn(content: str, reasoning: str, calls: list[tuple[str, str, str]]) -> dict:
    """A turn from any API as the chat completions message that renders the same."""
    tool_calls = [{"id": i, "type": "function", "function": {"name": n, "arguments": a}} for i, n, a in calls]
    return {"role": "assistant", "content": content, "tool_calls": tool_calls, "reasoning_content": reasoning}


def tool_results(turn: dict) -> list[dict]:
    return [{"role": "tool", "tool_call_id": c["id"], "content": "Sunny, 21 C."} for c in turn["tool_calls"]]


def no_markup(text: str | None) -> bool:
    return not any(m in (text or "") for m in MARKUP)


def valid_calls(calls) -> list[dict]:
    out = []
    for name, arguments in calls:
        assert name == "get_weather"
        args = json.loads(arguments)
        jsonschema.validate(args, WEATHER_SCHEMA)
        out.append(args)
    return out


def test_chat_completions_round_trip(family_server):
    family, server = family_server
    assert reply_format(server.tokenizer).name == FAMILIES[family][0]
    client = server.client()
    ask = dict(model=server.model_id, tools=TOOLS, tool_choice="required", temperature=0)
    ask["max_tokens"] = turn_tokens(family)
    if family in THINKING_OFF:
        ask["reasoning_effort"] = "none"
    first = client.chat.completions.create(messages=MESSAGES, prompt_cache_key=f"{family}-chat", **ask)
    choice = first.choices[0]
    message = choice.message
    assert choice.finish_reason == "tool_calls", (family, message)
    calls = valid_calls((c.function.name, c.function.arguments) for c in message.tool_calls)
    assert calls and no_markup(message.content), (family, message)
    reasoning = (message.model_extra or {}).get("reasoning_content")
    assert no_markup(reasoning)
    if FAMILIES[family][1]:
        assert reasoning, "the template opened the reasoning: the reply has some"
    # Streamed: the same reply, in deltas.
    stream = client.chat.completions.create(messages=MESSAGES, stream=True, prompt_cache_key=f"{family}-stream", **ask)
    streamed_calls: dict[int, list[str]] = {}
    streamed_reasoning, finish = "", None
    for chunk in stream:
        delta = chunk.choices[0].delta
        streamed_reasoning += (delta.model_extra or {}).get("reasoning_content") or ""
        for c in delta.tool_calls or []:
            entry = streamed_calls.setdefault(c.index, ["", ""])
            entry[0] += c.function.name or ""
            entry[1] += c.function.arguments or ""
        finish = chunk.choices[0].finish_reason or finish
    assert finish == "tool_calls" and valid_calls(streamed_calls.values()) == calls
    assert streamed_reasoning == (reasoning or "")
    # The next turn sends the call and its result back: the whole first turn comes from the cache.
    turn = {
        "role": "assistant",
        "content": message.content or "",
        "tool_calls": [c.model_dump() for c in message.tool_calls],
    }
    if reasoning:
        turn["reasoning_content"] = reasoning
    results = [{"role": "tool", "tool_call_id": c.id, "content": "Sunny, 21 C."} for c in message.tool_calls]
    second = client.chat.completions.create(
        messages=MESSAGES + [turn, *results], prompt_cache_key=f"{family}-chat", **{**ask, "tool_choice": "auto"}
    )
    cached = second.usage.prompt_tokens_details.cached_tokens
    assert cached >= whole_turn(server, family, MESSAGES + [turn, *results]) > first.usage.prompt_tokens, (
        family,
        cached,
    )


def test_messages_round_trip(family_server):
    family, server = family_server
    client = anthropic.Anthropic(base_url=server.base_url, api_key="unused", max_retries=0)
    tools = [{"name": "get_weather", "description": "The forecast.", "input_schema": WEATHER_SCHEMA}]
    ask = dict(
        model=server.model_id,
        max_tokens=turn_tokens(family),
        extra_body={"temperature": 0},
        tools=tools,
        metadata={"user_id": f"{family}-messages"},
    )
    if family in THINKING_OFF:
        ask["thinking"] = {"type": "disabled"}
    first = client.messages.create(
        system="You answer weather questions.", messages=[MESSAGES[1]], tool_choice={"type": "any"}, **ask
    )
    assert first.stop_reason == "tool_use", (family, first.content)
    uses = [b for b in first.content if b.type == "tool_use"]
    assert uses and all(jsonschema.validate(b.input, WEATHER_SCHEMA) is None for b in uses)
    assert all(no_markup(b.text) for b in first.content if b.type == "text")
    assert all(no_markup(b.thinking) and b.signature for b in first.content if b.type == "thinking")
    if FAMILIES[family][1]:
        assert first.content[0].type == "thinking"
    with client.messages.stream(
        system="You answer weather questions.", messages=[MESSAGES[1]], tool_choice={"type": "any"}, **ask
    ) as stream:
        streamed = stream.get_final_message()
    # A thinking block's signature is sealed with a fresh nonce each time (api/sealing.py).
    assert [b.model_dump(exclude={"id", "signature"}) for b in streamed.content] == [
        b.model_dump(exclude={"id", "signature"}) for b in first.content
    ]
    results = [{"type": "tool_result", "tool_use_id": b.id, "content": "Sunny, 21 C."} for b in uses]
    second = client.messages.create(
        system="You answer weather questions.",
        messages=[
            MESSAGES[1],
            {"role": "assistant", "content": [b.model_dump() for b in first.content]},
            {"role": "user", "content": results},
        ],
        **ask,
    )
    thinking = "".join(b.thinking for b in first.content if b.type == "thinking")
    turn = openai_turn(
        "".join(b.text for b in first.content if b.type == "text"),
        thinking,
        [(b.id, b.name, json.dumps(b.input)) for b in uses],
    )
    read, sent = second.usage.cache_read_input_tokens, MESSAGES + [turn, *tool_results(turn)]
    assert read >= whole_turn(server, family, sent), (family, read)
    if FAMILIES[family][1]:  # the settle, on a thinking model: the turn sent back as its blocks
        assert read >= settled_length(server, sent, "Sunny, 21 C."), (family, read)


def test_responses_round_trip(family_server):
    family, server = family_server
    client = server.client()
    tools = [{"type": "function", **TOOLS[0]["function"]}]
    ask = dict(model=server.model_id, tools=tools, max_output_tokens=turn_tokens(family), temperature=0)
    if family in THINKING_OFF:
        ask["reasoning"] = {"effort": "none"}
    first = client.responses.create(
        input=MESSAGES[1]["content"], instructions=MESSAGES[0]["content"], tool_choice="required", **ask
    )
    assert first.status == "completed", (family, first.output)
    calls = [i for i in first.output if i.type == "function_call"]
    assert calls and valid_calls((c.name, c.arguments) for c in calls)
    thought = [i for i in first.output if i.type == "reasoning"]
    assert all(no_markup(c.text) for i in thought for c in i.content)
    assert first.usage.output_tokens_details.reasoning_tokens > 0 if thought else True
    if FAMILIES[family][1]:
        assert thought and first.output[0].type == "reasoning"
    with client.responses.stream(
        input=MESSAGES[1]["content"], instructions=MESSAGES[0]["content"], tool_choice="required", **ask
    ) as stream:
        streamed = stream.get_final_response()
    assert [(i.type, getattr(i, "arguments", None)) for i in streamed.output] == [
        (i.type, getattr(i, "arguments", None)) for i in first.output
    ]
    outputs = [{"type": "function_call_output", "call_id": c.call_id, "output": "Sunny, 21 C."} for c in calls]
    second = client.responses.create(
        input=outputs, previous_response_id=first.id, instructions=MESSAGES[0]["content"], **ask
    )
    text = "".join(c.text for i in first.output if i.type == "message" for c in i.content)
    reasoning = "".join(c.text for i in thought for c in i.content)
    turn = openai_turn(text, reasoning, [(c.call_id, c.name, c.arguments) for c in calls])
    cached, sent = second.usage.input_tokens_details.cached_tokens, MESSAGES + [turn, *tool_results(turn)]
    assert cached >= whole_turn(server, family, sent), (family, cached)
    if FAMILIES[family][1]:  # the settle, on a thinking model: a stored response is an agent of its own
        assert cached >= settled_length(server, sent, "Sunny, 21 C."), (family, cached)


def settled_length(server, messages: list[dict], result: str) -> int:
    """The next prompt's tokens before the content of its first tool result (`result`), less
    one: the previous turn as the template writes it back, which its settle leaves in the cache."""
    tok = server.tokenizer
    fmt = reply_format(tok)
    conv = conversation(ChatCompletionRequest(model="m", messages=messages, tools=TOOLS))
    rendered, tools = template_input(conv, fmt.native, fmt.describe, fmt.history_key)
    text = tok.apply_chat_template(rendered, tools=tools, add_generation_prompt=True, tokenize=False)
    return len(tok.encode(text[: text.rindex(result)], add_special_tokens=False)) - 1


def streamed_turn(stream) -> tuple[dict, object]:
    """A streamed chat reply as the message a client sends back, and its usage."""
    content, reasoning, calls, usage = "", "", {}, None
    for chunk in stream:
        usage = chunk.usage or usage
        if not chunk.choices:
            continue
        delta = chunk.choices[0].delta
        content += delta.content or ""
        reasoning += (delta.model_extra or {}).get("reasoning_content") or ""
        for c in delta.tool_calls or []:
            empty = {"id": c.id, "type": "function", "function": {"name": "", "arguments": ""}}
            call = calls.setdefault(c.index, empty)
            call["function"]["name"] += c.function.name or ""
            call["function"]["arguments"] += c.function.arguments or ""
    message = {"role": "assistant", "content": content, "tool_calls": list(calls.values())}
    return ({**message, "reasoning_content": reasoning} if reasoning else message), usage


def test_a_tool_loop_reuses_each_whole_turn(family_server):
    """A required-tool conversation of three turns, each next request sent as soon as the reply
    ends (the second streamed): each turn's prompt comes from the cache up to its tool result,
    the previous turn as the template writes it back (its settle: chat/continuation.py), however
    the model tokenized it, and nothing before that was lost."""
    family, server = family_server
    client = server.client()
    ask = dict(model=server.model_id, tools=TOOLS, temperature=0, parallel_tool_calls=False)
    ask["max_tokens"] = turn_tokens(family)
    ask["prompt_cache_key"] = f"{family}-loop"
    if family in THINKING_OFF:
        ask["reasoning_effort"] = "none"
    messages = list(MESSAGES)
    for turn, choice in enumerate(["required", "required", "none"]):
        if turn == 1:
            stream = client.chat.completions.create(
                messages=messages, tool_choice=choice, stream=True, stream_options={"include_usage": True}, **ask
            )
            message, usage = streamed_turn(stream)
        else:
            reply = client.chat.completions.create(messages=messages, tool_choice=choice, **ask)
            message, usage = reply.choices[0].message.model_dump(exclude_none=True), reply.usage
        if turn:
            details = usage.prompt_tokens_details
            settled = settled_length(server, messages, messages[-1]["content"])
            assert details.cached_tokens >= settled, (family, turn, settled, details)
            assert details.model_extra["cache_miss"]["lost"] == 0, (family, turn, details)
        if choice == "required":
            assert message["tool_calls"], (family, turn, message)
            result = f"Sunny, {20 + turn} C."
            results = [{"role": "tool", "tool_call_id": c["id"], "content": result} for c in message["tool_calls"]]
            messages += [message, *results]


def test_constrained_output_ends_well_in_every_format(family_server):
    """At a small max_tokens, sampled: a named call is exactly one call, a required call and a
    json_schema answer parse and validate, each in the family's own format, reasoning (where the
    model opens it) closed in time; streamed like not. Half the formats at 48 tokens, half at 128
    (tests/test_ends_well.py runs one format at both budgets and more)."""
    family, server = family_server
    budget = (48, 128)[sorted(FAMILIES).index(family) % 2]
    client = server.client()
    base = dict(model=server.model_id, messages=MESSAGES, max_tokens=budget, temperature=0.9, seed=budget)
    if family in THINKING_OFF:
        base["reasoning_effort"] = "none"
    named = {"type": "function", "function": {"name": "get_weather"}}
    reply = client.chat.completions.create(**base, tools=TOOLS, tool_choice=named)
    assert reply.choices[0].finish_reason == "tool_calls", (family, reply.choices[0].message)
    assert len(valid_calls((c.function.name, c.function.arguments) for c in reply.choices[0].message.tool_calls)) == 1
    stream = client.chat.completions.create(**base, tools=TOOLS, tool_choice="required", stream=True)
    calls: dict[int, list[str]] = {}
    finish = None
    for chunk in stream:
        for c in chunk.choices[0].delta.tool_calls or []:
            entry = calls.setdefault(c.index, ["", ""])
            entry[0] += c.function.name or ""
            entry[1] += c.function.arguments or ""
        finish = chunk.choices[0].finish_reason or finish
    assert finish == "tool_calls" and valid_calls(calls.values()), (family, calls)
    schema = {"type": "json_schema", "json_schema": {"name": "weather", "schema": WEATHER_SCHEMA}}
    answer = client.chat.completions.create(**base, response_format=schema)
    assert answer.choices[0].finish_reason == "stop", (family, answer.choices[0].message)
    jsonschema.validate(json.loads(answer.choices[0].message.content), WEATHER_SCHEMA)


@pytest.fixture(scope="module")
def thinking_server(tmp_path_factory):
    """Qwen3.5's template: its prompt opens the reasoning, and `enable_thinking` closes it."""
    model = templated_model(tmp_path_factory.getbasetemp() / "templated", "qwen3_5")
    with InProcessServer(model, tmp_path_factory.mktemp("cache-thinking")) as server:
        server.tokenizer = load_tokenizer(model)
        yield server


def test_thinking_switches_on_every_api(thinking_server):
    """Thinking is on by default for a thinking template; each API's own switch turns it off:
    `chat_template_kwargs`, `reasoning_effort: none`, Responses' `reasoning.effort`, Anthropic's
    `thinking: disabled`. Off, the reply has no reasoning and its prompt is shorter by the
    template's empty reasoning block."""
    client = thinking_server.client()
    ask = dict(model="m", messages=MESSAGES, max_tokens=24, temperature=0)
    on = client.chat.completions.create(**ask)
    assert on.choices[0].message.model_extra.get("reasoning_content")
    assert on.usage.completion_tokens_details.reasoning_tokens > 0
    for off in (
        client.chat.completions.create(**ask, extra_body={"chat_template_kwargs": {"enable_thinking": False}}),
        client.chat.completions.create(**ask, reasoning_effort="none"),
    ):
        assert not off.choices[0].message.model_extra.get("reasoning_content")
        assert off.usage.prompt_tokens > on.usage.prompt_tokens  # `<think>\n\n</think>\n\n` closes it in the prompt
    response = client.responses.create(
        model="m", input="Weather in Oslo?", max_output_tokens=24, reasoning={"effort": "none"}
    )
    assert [i.type for i in response.output] == [
        "message"
    ] and response.usage.output_tokens_details.reasoning_tokens == 0
    claude = anthropic.Anthropic(base_url=thinking_server.base_url, api_key="unused", max_retries=0)
    message = claude.messages.create(model="m", max_tokens=24, messages=[MESSAGES[1]], thinking={"type": "disabled"})
    assert [b.type for b in message.content] == ["text"]
    message = claude.messages.create(model="m", max_tokens=24, messages=[MESSAGES[1]])
    assert message.content[0].type == "thinking" and message.content[0].signature


def test_a_template_that_drops_earlier_reasoning_is_settled_before_the_next_turn(thinking_server):
    """Qwen3.5's template writes a turn before the latest user message back without its
    reasoning: the next prompt differs from the turn the model wrote from where its reply began.
    The turn's settle renders the history as the template will write it back (a user message
    after it) and computes that while the client reads the reply, so the next turn reuses all of
    it, up to the new message's text."""
    client = thinking_server.client()
    tok = thinking_server.tokenizer
    ask = dict(model="m", max_tokens=24, temperature=0, prompt_cache_key="history")
    first = client.chat.completions.create(messages=MESSAGES, **ask)
    reply = first.choices[0].message
    assert reply.model_extra.get("reasoning_content")
    turn = {
        "role": "assistant",
        "content": reply.content or "",
        "reasoning_content": reply.model_extra["reasoning_content"],
    }
    messages = MESSAGES + [turn, {"role": "user", "content": "And tomorrow?"}]
    second = client.chat.completions.create(messages=messages, **ask)
    p1 = tok.encode(
        tok.apply_chat_template(MESSAGES, add_generation_prompt=True, tokenize=False), add_special_tokens=False
    )
    text = tok.apply_chat_template(messages, add_generation_prompt=True, tokenize=False)
    p2 = tok.encode(text, add_special_tokens=False)
    changed = next(i for i, (a, b) in enumerate(zip(p1, p2)) if a != b)
    assert changed < len(p1)  # the template rewrote the turn: its opened reasoning is gone
    settled = len(tok.encode(text[: text.rindex("And tomorrow?")], add_special_tokens=False)) - 1
    assert second.usage.prompt_tokens_details.cached_tokens >= settled > changed


def test_a_format_parsed_but_not_constrained_says_so(tmp_path_factory):
    """Gemma 4 writes calls in its own non-JSON syntax, which mlx-lm parses and this server does
    not constrain: `auto` works (calls are parsed where the model writes them), and a call the
    client requires is a 400 that says why, before anything runs."""
    model = templated_model(tmp_path_factory.getbasetemp() / "templated", "gemma4")
    with InProcessServer(model, tmp_path_factory.mktemp("cache-gemma4")) as server:
        client = server.client()
        ask = dict(model="m", messages=MESSAGES, tools=TOOLS, max_tokens=16, temperature=0)
        reply = client.chat.completions.create(**ask)
        assert reply.choices[0].finish_reason in ("stop", "length", "tool_calls") and no_markup(
            reply.choices[0].message.content
        )
        with pytest.raises(openai.BadRequestError) as refused:
            client.chat.completions.create(**ask, tool_choice="required")
        assert refused.value.body["param"] == "tool_choice" and "gemma4" in refused.value.body["message"]


def test_reasoning_effort_reaches_the_template(tmp_path_factory):
    """gpt-oss's template takes its reasoning level as `reasoning_effort`: OpenAI's efforts
    reach it (`minimal` as `low`), and `chat_template_kwargs` wins over them."""
    from agent_memory.chat.conversation import effort_thinking

    tok = load_tokenizer(templated_model(tmp_path_factory.getbasetemp() / "templated", "gpt_oss"))

    def system(effort, kwargs=None) -> str:
        prompt = tok.apply_chat_template(
            MESSAGES, add_generation_prompt=True, tokenize=False, **effort_thinking(effort, kwargs or {}).kwargs()
        )
        return prompt.split("<|end|>", 1)[0]

    assert "Reasoning: medium" in system(None)
    assert "Reasoning: high" in system("high") and "Reasoning: low" in system("minimal")
    assert "Reasoning: low" in system("high", {"reasoning_effort": "low"})


def test_reasoning_comes_back_from_encrypted_content_alone(thinking_server):
    """A client that keeps no state on the server (`store: false`, Codex) asks for
    `reasoning.encrypted_content` and sends back only that: the reasoning reaches the template
    again exactly, so the next turn of the agent's tool loop reuses the whole previous one."""
    client = thinking_server.client()
    tools = [{"type": "function", **TOOLS[0]["function"]}]
    ask = dict(model="m", tools=tools, max_output_tokens=64, temperature=0, store=False, prompt_cache_key="sealed")
    ask["include"] = ["reasoning.encrypted_content"]
    first = client.responses.create(
        input=MESSAGES[1]["content"], instructions=MESSAGES[0]["content"], tool_choice="required", **ask
    )
    thought = next(i for i in first.output if i.type == "reasoning")
    call = next(i for i in first.output if i.type == "function_call")
    assert thought.encrypted_content and thought.content[0].text
    items = [
        {"type": "message", "role": "user", "content": MESSAGES[1]["content"]},
        {"type": "reasoning", "id": thought.id, "summary": [], "encrypted_content": thought.encrypted_content},
        {"type": "function_call", "call_id": call.call_id, "name": call.name, "arguments": call.arguments},
        {"type": "function_call_output", "call_id": call.call_id, "output": "Sunny, 21 C."},
    ]
    second = client.responses.create(input=items, instructions=MESSAGES[0]["content"], **ask)
    turn = openai_turn("", thought.content[0].text, [(call.call_id, call.name, call.arguments)])
    assert second.usage.input_tokens_details.cached_tokens >= whole_turn(
        thinking_server, "qwen3_5", MESSAGES + [turn, *tool_results(turn)]
    )
    damaged = {**items[1], "encrypted_content": thought.encrypted_content[:-4] + "AAAA"}
    with pytest.raises(openai.BadRequestError) as refused:  # refused, as OpenAI does, not dropped
        client.responses.create(input=[items[0], damaged, *items[2:]], instructions=MESSAGES[0]["content"], **ask)
    assert refused.value.body["param"] == "input.1.encrypted_content"


@pytest.mark.parametrize(
    "family", ["qwen3", "qwen3_coder", "qwen3_5", "glm4_6", "devstral", "deepseek_v3_1", "kimi_k2"]
)
def test_text_then_calls_read_back_as_the_template_writes_them(family, tmp_path_factory):
    """A turn of text and then calls, as the template writes it: read by the family's reader
    (the whitespace the template puts between text and calls left out of the content) and sent
    back, it renders to the very same text, so the cache keeps all of it."""
    from agent_memory.chat.events import CallArguments, CallStart, ContentDelta, ReasoningDelta

    tok = load_tokenizer(templated_model(tmp_path_factory.getbasetemp() / "templated", family))
    fmt = reply_format(tok)
    calls = [
        {"id": f"call_{i}", "type": "function", "function": {"name": "get_weather", "arguments": {"city": c}}}
        for i, c in enumerate(["Oslo", "Lima"])
    ]
    results = [{"role": "tool", "tool_call_id": c["id"], "content": "Sunny."} for c in calls]

    def rendered(turn: dict) -> str:
        conv = conversation(ChatCompletionRequest(model="m", messages=MESSAGES + [turn, *results], tools=TOOLS))
        messages, tools = template_input(conv, fmt.native, fmt.describe, fmt.history_key)
        return tok.apply_chat_template(messages, tools=tools, add_generation_prompt=False, tokenize=False)

    conv = conversation(ChatCompletionRequest(model="m", messages=MESSAGES, tools=TOOLS))
    messages, tools = template_input(conv, fmt.native, fmt.describe, fmt.history_key)
    prompt = tok.apply_chat_template(messages, tools=tools, add_generation_prompt=True, tokenize=False)
    arguments = [
        {**c, "function": {**c["function"], "arguments": json.dumps(c["function"]["arguments"])}} for c in calls
    ]
    whole = rendered({"role": "assistant", "content": "Let me check both.", "tool_calls": arguments})
    assert whole.startswith(prompt)
    end = min(i for e in TEMPLATES[family]["eos"] if (i := whole.find(e, len(prompt))) >= 0)
    reader = fmt.reader(conv.tools, fmt.started_by(prompt))
    events = reader.read(whole[len(prompt) : end]) + reader.read(None)
    content = "".join(e.text for e in events if isinstance(e, ContentDelta))
    reasoning = "".join(e.text for e in events if isinstance(e, ReasoningDelta))
    read = [[e.name, ""] for e in events if isinstance(e, CallStart)]
    for e in (e for e in events if isinstance(e, CallArguments)):
        read[e.index][1] += e.text
    assert content == "Let me check both." and [json.loads(a)["city"] for _, a in read] == ["Oslo", "Lima"]
    back = [
        {"id": c["id"], "type": "function", "function": {"name": n, "arguments": a}} for c, (n, a) in zip(calls, read)
    ]
    assert (
        rendered({"role": "assistant", "content": content, "reasoning_content": reasoning, "tool_calls": back}) == whole
    )

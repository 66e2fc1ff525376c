"""The conformance sweep: every request field the official SDKs define for the three APIs, sent
with a value a client would send, is honoured or ignored (a 200) or refused with a 400 in the
API's shape naming it, as docs/usage.md's "Every field of the published APIs" table says; a
field an SDK adds fails here until it is placed in that table."""

from __future__ import annotations

import re
from pathlib import Path

import pytest
from anthropic.types.message_create_params import MessageCreateParamsBase
from openai.types.chat.completion_create_params import CompletionCreateParamsBase
from openai.types.responses.response_create_params import ResponseCreateParamsBase

USAGE = Path(__file__).resolve().parent.parent / "docs" / "usage.md"
FUNCTION = {"name": "f", "parameters": {"type": "object", "properties": {}}}

CHAT = {
    "audio": {"voice": "alloy", "format": "wav"},
    "frequency_penalty": 0.5,
    "function_call": "auto",
    "functions": [FUNCTION],
    "logit_bias": {"50": -100},
    "logprobs": True,
    "max_completion_tokens": 4,
    "max_tokens": 4,
    "messages": [{"role": "user", "content": "hi"}],
    "metadata": {"user_id": "conformance"},
    "modalities": ["text", "audio"],
    "model": "m",
    "moderation": {"mode": "off"},
    "n": 1,
    "parallel_tool_calls": True,
    "prediction": {"type": "content", "content": "x"},
    "presence_penalty": 0.5,
    "prompt_cache_key": "conformance",
    "prompt_cache_options": {},
    "prompt_cache_retention": "24h",
    "reasoning_effort": "low",
    "response_format": {"type": "text"},
    "safety_identifier": "u1",
    "seed": 1,
    "service_tier": "auto",
    "stop": ["zz"],
    "store": False,
    "stream": False,
    "stream_options": {"include_usage": True},
    "temperature": 0.5,
    "tool_choice": "auto",
    "tools": [{"type": "function", "function": FUNCTION}],
    "top_logprobs": 0,  # alone, as OpenAI: more than 0 needs logprobs: true (test_sampling_fields.py)
    "top_p": 0.9,
    "user": "u1",
    "verbosity": "low",
    "web_search_options": {},
}
RESPONSES = {
    "access_programs": [],
    "background": True,
    "background_options": {},
    "context_management": [{"type": "compaction", "compact_threshold": 1000}],
    "conversation": "conv_1",
    "image": None,
    "include": ["reasoning.encrypted_content"],
    "input": "hi",
    "instructions": "Be brief.",
    "max_output_tokens": 16,
    "max_tool_calls": 3,
    "metadata": {"k": "v"},
    "model": "m",
    "moderation": {"mode": "off"},
    "parallel_tool_calls": True,
    "previous_response_id": None,
    "prompt": {"id": "pmpt_1"},
    "prompt_cache_key": "conformance",
    "prompt_cache_options": {},
    "prompt_cache_retention": "24h",
    "reasoning": {"effort": "low"},
    "safety_identifier": "u1",
    "service_tier": "auto",
    "store": False,
    "stream": False,
    "stream_options": {"include_obfuscation": False},
    "temperature": 0.5,
    "text": {"verbosity": "low", "format": {"type": "text"}},
    "tool_choice": "auto",
    "tools": [{"type": "function", **FUNCTION}],
    "top_logprobs": 2,
    "top_p": 0.9,
    "truncation": "auto",
    "user": "u1",
}
MESSAGES = {
    "cache_control": {"type": "ephemeral"},
    "container": "c1",
    "diagnostics": {},
    "inference_geo": "us",
    "max_tokens": 8,
    "messages": [{"role": "user", "content": "hi"}],
    "metadata": {"user_id": "conformance"},
    "model": "m",
    "output_config": {"effort": "low"},
    "service_tier": "auto",
    "speed": "standard",
    "stop_sequences": ["zz"],
    "stream": False,
    "system": "Be brief.",
    "thinking": {"type": "disabled"},
    "tool_choice": {"type": "auto"},
    "tools": [{"name": "f", "input_schema": {"type": "object", "properties": {}}}],
    "user_profile_id": "p1",
    "workspace_id": "w1",
}
# API: (its row in the table, its path, the SDK's fields, samples, the smallest valid body)
APIS = {
    "chat": (
        "chat completions",
        "/v1/chat/completions",
        CompletionCreateParamsBase,
        CHAT,
        ("model", "messages", "max_tokens"),
    ),
    "responses": (
        "Responses",
        "/v1/responses",
        ResponseCreateParamsBase,
        RESPONSES,
        ("model", "input", "max_output_tokens"),
    ),
    "messages": ("Messages", "/v1/messages", MessageCreateParamsBase, MESSAGES, ("model", "messages", "max_tokens")),
}


def documented(row: str) -> dict[str, str]:
    """field -> its column ("honoured", "ignored", "refused") in usage.md's table row `row`."""
    line = next(line for line in USAGE.read_text().splitlines() if line.startswith(f"| {row} |"))
    cells = line.strip("|").split("|")[1:]
    out = {}
    for column, cell in zip(("honoured", "ignored", "refused"), cells):
        for name in re.findall(r"(?:^|, )`([a-z_]+)`", cell.strip()):
            out.setdefault(name, column)
    return out


@pytest.mark.parametrize("api", sorted(APIS))
def test_every_sdk_field_is_in_the_table(api):
    row, _, params, samples, _ = APIS[api]
    fields = set(params.__annotations__) | {"stream"}
    table = documented(row)
    assert sorted(fields - set(table)) == [], f"fields of the SDK not in docs/usage.md's {row} row"
    assert sorted(fields - set(samples)) == [], "fields without a sample value here"


@pytest.mark.parametrize("api", sorted(APIS))
def test_every_field_does_what_the_table_says(server, api):
    row, path, params, samples, minimal = APIS[api]
    table = documented(row)
    base = {name: samples[name] for name in minimal}
    wrong = []
    with server.http() as http:
        for name in sorted(set(params.__annotations__) | {"stream"}):
            r = http.post(path, json={**base, name: samples[name]})
            body = r.json()
            error = body.get("error") or {}
            if table[name] == "refused":
                ok = r.status_code == 400 and error.get("param") == name and name in error.get("message", "")
                ok = ok and error.get("code", error.get("type")) in ("unsupported_parameter", "invalid_request_error")
            else:
                ok = r.status_code == 200
            if not ok:
                wrong.append(f"{name} ({table[name]}): {r.status_code} {r.text[:200]}")
    assert wrong == []

"""Custom (freeform) tools on the Responses API: a call's input is raw text, constrained by the
grammar the request gives (Codex's `apply_patch` Lark grammar, tests/data/freeform), returned as
a `custom_tool_call` item and taken back in history with its `custom_tool_call_output`."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest

from agent_memory.chat.conversation import Conversation, Message, ToolChoice
from agent_memory.chat.freeform import freeform_tool
from agent_memory.chat.grammar import GrammarCompiler
from agent_memory.chat.lark_regex import lark_regex
from tests.support.templates import templated_model

APPLY_PATCH = (Path(__file__).parent / "data" / "freeform" / "apply_patch.lark").read_text()
PATCH = "*** Begin Patch\n*** Update File: a.py\n@@ def f():\n-    return 1\n+    return 2\n*** End Patch\n"
NOT_PATCHES = [
    PATCH.replace("*** End Patch\n", ""),  # never ends
    "*** Begin Patch\n*** End Patch\n",  # no hunk
    PATCH.replace("+    return 2", "~    return 2"),  # a change line must start with +, - or space
]


def test_a_lark_grammar_without_recursion_is_one_regex():
    regex = lark_regex(APPLY_PATCH)
    assert re.fullmatch(regex, PATCH) and re.fullmatch(
        regex, "*** Begin Patch\n*** Add File: n.txt\n+hi\n*** End Patch"
    )
    assert not any(re.fullmatch(regex, text) for text in NOT_PATCHES)
    assert re.fullmatch(lark_regex('start: "a"i [B] (c | "-")*\nc: /[0-9]+/\nB: "b"'), "Ab12-3")
    # Not regular here: recursion, %ignore, an unknown import.
    assert lark_regex('start: "(" start ")" | "x"') is None
    assert lark_regex('start: WORD+\n%import common.WORD\n%ignore " "') is None
    assert lark_regex("start: X\n%import other.X") is None


# How each kind of format writes the call: arguments as JSON (escapes and all), or raw text.
WRITTEN = {
    "qwen3": lambda patch: (
        f"<tool_call>\n{json.dumps({'name': 'apply_patch', 'arguments': {'input': patch}})}\n</tool_call>"
    ),
    "qwen3_coder": lambda patch: (
        f"<tool_call>\n<function=apply_patch>\n<parameter=input>\n{patch}\n</parameter>\n</function>\n</tool_call>"
    ),
}


@pytest.mark.parametrize("family", sorted(WRITTEN))
def test_a_freeform_call_is_constrained_by_its_grammar(family, tmp_path_factory):
    """The call's input, as the family's format has the model write it, must be a patch."""
    from mlx_lm.tokenizer_utils import load as load_tokenizer

    tokenizer = load_tokenizer(templated_model(tmp_path_factory.mktemp("models"), family))
    compiler = GrammarCompiler(tokenizer, len(tokenizer._tokenizer))  # with the template's added tokens
    tool = freeform_tool("apply_patch", "Edit files.", "lark", APPLY_PATCH)
    conversation = Conversation([Message("user", "hi")], [tool], ToolChoice("required"))
    grammar = compiler.grammar(conversation, "tools", "text.format", started=False)

    def accepts(patch: str) -> bool:
        matcher = compiler.matcher(grammar)
        tokens = tokenizer.encode(WRITTEN[family](patch), add_special_tokens=False)
        return all(matcher.consume_token(t) for t in tokens) and matcher.is_accepting()

    assert accepts(PATCH)
    assert not any(accepts(text) for text in NOT_PATCHES)


def test_a_custom_tool_call_round_trip_streamed_and_not(server):
    """A regex-constrained custom tool named by tool_choice: its call is a custom_tool_call item
    whose input follows the regex, the same streamed (custom_tool_call_input events) as not; sent
    back with its output, the next turn reuses the first from memory."""
    tool = {
        "type": "custom",
        "name": "answer",
        "description": "Say yes or no.",
        "format": {"type": "grammar", "syntax": "regex", "definition": "(yes|no)"},
    }
    body = {
        "model": "tiny",
        "input": "Is the sky blue?",
        "tools": [tool, {"type": "tool_search", "execution": "client", "parameters": {"type": "object"}}],
        "tool_choice": {"type": "custom", "name": "answer"},
        "max_output_tokens": 48,
        "temperature": 0,
        "store": False,
        "prompt_cache_key": "freeform",
    }
    with server.http() as http:
        first = http.post("/v1/responses", json=body)
        assert first.status_code == 200, first.text
        assert first.headers["x-agent-memory-ignored-tools"] == "tool_search"
        call = next(i for i in first.json()["output"] if i["type"] == "custom_tool_call")
        assert call["name"] == "answer" and call["input"] in ("yes", "no") and call["status"] == "completed"
        assert call["id"].startswith("ctc_") and call["call_id"]
        with http.stream("POST", "/v1/responses", json={**body, "stream": True}) as stream:
            events = [json.loads(line[6:]) for line in stream.iter_lines() if line.startswith("data: ")]
        done = [e for e in events if e["type"] == "response.custom_tool_call_input.done"]
        assert [e["input"] for e in done] == [call["input"]]
        output = {"type": "custom_tool_call_output", "call_id": call["call_id"], "output": "right"}
        followup = {
            **body,
            "tool_choice": "auto",
            "input": [{"role": "user", "content": "Is the sky blue?"}, call, output],
        }
        second = http.post("/v1/responses", json=followup)
    assert second.status_code == 200, second.text
    usage = first.json()["usage"]
    assert (
        second.json()["usage"]["input_tokens_details"]["cached_tokens"]
        >= usage["input_tokens"] + usage["output_tokens"] - 1
    )

"""Finished tool calls checked against the whole schema (chat/call_check.py): what constrained
decoding could not enforce (keywords dropped under `auto`) is found once the call is whole; the
call is returned as written and the log says so, once per tool and keyword."""

from __future__ import annotations

import json
from pathlib import Path

from agent_memory.chat.call_check import check_call
from agent_memory.chat.conversation import ToolCall
from tests.support.scripted import scripted_model
from tests.support.inprocess import InProcessServer

# A task tool like Claude Code's TaskCreate, plus a rule llguidance cannot enforce either: an
# empty title needs metadata. Under `auto` the call is constrained without propertyNames, if
# and then.
CREATE = {
    "type": "object",
    "properties": {
        "title": {"type": "string"},
        "metadata": {"type": "object", "propertyNames": {"pattern": "^[a-z]+$"}},
    },
    "required": ["title"],
    "if": {"properties": {"title": {"const": ""}}},
    "then": {"required": ["metadata"]},
}


def test_a_call_is_checked_against_the_whole_schema():
    def why(arguments: dict) -> str | None:
        return check_call(ToolCall("c1", "create", json.dumps(arguments)), CREATE)

    assert why({"title": "x"}) is None and why({"title": "x", "metadata": {"ok": 1}}) is None
    assert why({"title": "x", "metadata": {"Not-OK": 1}}) == "pattern at metadata"  # a key named against propertyNames
    assert why({"title": ""}) == "required at (the arguments)"
    assert check_call(ToolCall("c1", "create", '{"title": '), CREATE) is None  # cut off: read as such elsewhere
    nowhere = {"type": "object", "properties": {"title": {"$ref": "#/$defs/missing"}}}  # refused where it is compiled
    assert check_call(ToolCall("c1", "create", '{"title": "x"}'), nowhere) is None


def test_a_call_loosened_from_one_of_is_checked_against_it():
    """Qwen Code's agent tool: under `auto` its fork_turns oneOf is enforced as anyOf; the check
    holds the call to the oneOf itself."""
    tool = json.loads((Path(__file__).parent / "data" / "qwen_code" / "agent_tool.json").read_text())
    schema = tool["function"]["parameters"]

    def why(fork_turns: str) -> str | None:
        arguments = {"description": "d", "prompt": "p", "subagent_type": "fork", "fork_turns": fork_turns}
        return check_call(ToolCall("c1", "agent", json.dumps(arguments)), schema)

    assert why("all") is None and why("3") is None
    assert why("0") is not None and why("0").endswith("at fork_turns")


def test_a_loosened_call_that_fails_its_schema_is_returned_and_said(tmp_path):
    """The scripted model calls `create` with the shortest arguments the grammar allows
    (`{"title": ""}`): valid for the loosened schema, not for the whole one."""
    model = scripted_model(tmp_path / "models", tool="create")
    tools = [{"type": "function", "function": {"name": "create", "parameters": CREATE}}]
    with InProcessServer(model, tmp_path / "cache") as server:
        client = server.client()
        r = client.chat.completions.create(
            model="m", messages=[{"role": "user", "content": "Add a task."}], tools=tools, max_tokens=64
        )
        log = server.log()
    (call,) = r.choices[0].message.tool_calls
    assert call.function.name == "create" and json.loads(call.function.arguments) == {"title": ""}
    assert r.choices[0].finish_reason == "tool_calls"
    assert "tool 'create': its calls are constrained without if, then, propertyNames" in log
    assert "tool 'create': a call does not follow its schema (required at (the arguments)" in log

"""The reply readers, fed text in pieces of every size: reasoning split off at its tags (and the
newlines that frame it, as templates write them back), harmony's channels into reasoning,
content and a call, and Mistral's calls that run to the reply's end."""

from __future__ import annotations

import json

import pytest

from agent_memory.chat.conversation import Tool
from agent_memory.chat.events import CallArguments, CallCutOff, CallStart, ContentDelta, ReasoningDelta
from agent_memory.chat.formats.harmony import HarmonyReader
from agent_memory.chat.formats.mistral import Mistral
from agent_memory.chat.formats.tagged_params import Glm, Qwen3Coder
from agent_memory.chat.formats.thinking import ThinkSplitter, ThinkTags
from agent_memory.chat.reader import ReplyReader
from agent_memory.chat.toolcalls import ToolCallParser

THINK = ThinkTags("<think>", "</think>")
WEATHER = Tool(
    "get_weather", "", {"type": "object", "properties": {"city": {"type": "string"}, "days": {"type": "integer"}}}
)


def read(reader, text: str, step: int) -> list:
    pieces = [text[i : i + step] for i in range(0, len(text), step)]
    return [e for p in pieces for e in reader.read(p)] + reader.read(None)


def joined(events) -> dict:
    """Reasoning and content joined, calls by name with their arguments."""
    out = {"reasoning": "", "content": "", "calls": [], "cut": []}
    for e in events:
        if isinstance(e, ReasoningDelta):
            out["reasoning"] += e.text
        elif isinstance(e, ContentDelta):
            out["content"] += e.text
        elif isinstance(e, CallStart):
            out["calls"].append([e.name, ""])
        elif isinstance(e, CallArguments):
            out["calls"][-1][1] += e.text
        elif isinstance(e, CallCutOff):
            out["cut"].append(e.index)
    return out


@pytest.mark.parametrize("step", [1, 2, 3, 7, 1000])
def test_think_tags_split_reasoning_from_content_and_calls(step):
    text = '<think>\nLet me see.\n\n</think>\n\nIt is <tool_call>\n{"name": "f", "arguments": {"a": 1}}\n</tool_call>'
    got = joined(read(ReplyReader(ThinkSplitter(THINK, False), ToolCallParser()), text, step))
    assert got == {"reasoning": "Let me see.", "content": "It is ", "calls": [["f", '{"a": 1}']], "cut": []}
    # A prompt that opened the reasoning: the reply starts inside it.
    got = joined(read(ReplyReader(ThinkSplitter(THINK, True), None), "\nhmm\n</think>\n\nHello", step))
    assert got["reasoning"] == "hmm" and got["content"] == "Hello"
    # No reasoning at all, and a reply cut off inside it.
    assert (
        joined(read(ReplyReader(ThinkSplitter(THINK, False), None), "Hi <think> there", step))["content"]
        == "Hi <think> there"
    )
    assert joined(read(ReplyReader(ThinkSplitter(THINK, False), None), "<think>\nstill going\n", step)) == {
        "reasoning": "still going",
        "content": "",
        "calls": [],
        "cut": [],
    }


@pytest.mark.parametrize("step", [1, 4, 1000])
def test_harmony_channels(step):
    text = (
        "<|channel|>analysis<|message|>Need weather.<|end|><|start|>assistant"
        ' to=functions.get_weather<|channel|>commentary json<|message|>{"city": "Oslo"}'
    )
    reader = HarmonyReader()
    got = joined(read(reader, text, step))
    assert got == {
        "reasoning": "Need weather.",
        "content": "",
        "calls": [["get_weather", '{"city": "Oslo"}']],
        "cut": [],
    }
    assert [c.name for c in reader.calls] == ["get_weather"]
    final = "<|channel|>analysis<|message|>Think.<|end|><|start|>assistant<|channel|>final<|message|>Hello there."
    assert joined(read(HarmonyReader(), final, step)) == {
        "reasoning": "Think.",
        "content": "Hello there.",
        "calls": [],
        "cut": [],
    }
    # The layout gpt-oss writes unconstrained, and a call cut off.
    loose = '<|channel|>commentary to=functions.get_weather <|constrain|>json<|message|>{"city": "Li'
    reader = HarmonyReader()
    got = joined(read(reader, loose, step))
    assert got["calls"] == [["get_weather", '{"city": "Li']] and got["cut"] == [0] and reader.calls == []
    assert joined(read(HarmonyReader(), "plain words", step))["content"] == "plain words"


@pytest.mark.parametrize("step", [1, 5, 1000])
def test_tagged_parameters_and_mistral_calls_are_read_whole(step):
    xml = "<tool_call>\n<function=get_weather>\n<parameter=city>\nNew York\n</parameter>\n<parameter=days>\n3\n</parameter>\n</function>\n</tool_call>"
    syntax = Qwen3Coder()
    parser = ToolCallParser(syntax.opener, syntax.end, lambda body: syntax.parse(body, [WEATHER]))
    got = joined(read(ReplyReader(None, parser), "Sure." + xml, step))
    assert got["content"] == "Sure." and [(n, json.loads(a)) for n, a in got["calls"]] == [
        ("get_weather", {"city": "New York", "days": 3})
    ]
    glm = "<tool_call>get_weather\n<arg_key>city</arg_key>\n<arg_value>Oslo</arg_value>\n<arg_key>days</arg_key>\n<arg_value>2</arg_value>\n</tool_call>"
    syntax = Glm()
    parser = ToolCallParser(syntax.opener, syntax.end, lambda body: syntax.parse(body, [WEATHER]))
    got = joined(read(ReplyReader(None, parser), glm, step))
    assert [(n, json.loads(a)) for n, a in got["calls"]] == [("get_weather", {"city": "Oslo", "days": 2})]
    syntax = Mistral()
    parser = ToolCallParser(syntax.opener, syntax.end, lambda body: syntax.parse(body, [WEATHER]))
    text = '[TOOL_CALLS]get_weather[ARGS]{"city": "Oslo"}[TOOL_CALLS]get_weather[ARGS]{"city": "Lima", "days": 1}'
    got = joined(read(ReplyReader(None, parser), text, step))
    assert [(n, json.loads(a)) for n, a in got["calls"]] == [
        ("get_weather", {"city": "Oslo"}),
        ("get_weather", {"city": "Lima", "days": 1}),
    ]


@pytest.mark.parametrize("step", [1, 2, 1000])
def test_the_lead_before_a_call_is_not_content(step):
    """Qwen3 writes a turn's text, "\\n", then its call: the "\\n" is the template's, so the
    content leaves it out; a line break that no call follows stays."""
    call = '<tool_call>\n{"name": "f", "arguments": {"a": 1}}\n</tool_call>'
    got = joined(read(ReplyReader(None, ToolCallParser(lead="\n")), "Let me see.\n" + call, step))
    assert got["content"] == "Let me see." and [n for n, _ in got["calls"]] == ["f"]
    assert joined(read(ReplyReader(None, ToolCallParser(lead="\n")), "Two\nlines\n", step))["content"] == "Two\nlines\n"

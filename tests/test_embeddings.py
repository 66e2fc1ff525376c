"""`/v1/embeddings` beside a chat model: tiny random embedding models (a Qwen3-Embedding-like
decoder and an EmbeddingGemma-like bidirectional encoder, built offline) served under
`--model NAME=…` with the tiny chat model in one server, through the OpenAI SDK, LangChain's
OpenAIEmbeddings and plain HTTP; the 400s for a model of the wrong kind; loaded on demand in
the residency's count (one model's weights at a time under the limit); /metrics."""

from __future__ import annotations

import base64

import anthropic
import httpx
import numpy as np
import openai
import pytest
from tokenizers import Tokenizer

from agent_memory.models.tiny_embedding import build_tiny_embedding
from tests.support.inprocess import InProcessServer, refused_start
from tests.support.metrics import metric


TEXTS = ["Where is Paris?", "def add(a, b):\n    return a + b", "a longer sentence " * 20, "Oslo"]


@pytest.fixture(scope="module")
def gemma_embedding(tmp_path_factory):
    return build_tiny_embedding(tmp_path_factory.mktemp("models") / "embeddinggemma", arch="embeddinggemma")


@pytest.fixture(scope="module")
def server(tiny_model, tiny_embedding, gemma_embedding, tmp_path_factory):
    # The hot budget leaves room for one model's weights at a time under the limit.
    limit = ("--memory-limit-mb", "256", "--hot-budget-mb", "240")
    models = ("--model", f"embed={tiny_embedding}", "--model", f"gemma={gemma_embedding}")
    with InProcessServer(tiny_model, tmp_path_factory.mktemp("cache"), *models, *limit) as s:
        yield s


def loaded(server) -> dict[str, bool]:
    return {m["id"]: m["loaded"] for m in httpx.get(server.base_url + "/health").json()["models"]}


def vectors(client: openai.OpenAI, model: str, inputs, **kw) -> np.ndarray:
    """The SDK asks for base64 and decodes it itself unless told a format; asked for base64, it
    hands the strings back as they came."""
    response = client.embeddings.create(model=model, input=inputs, **kw)
    assert [d.index for d in response.data] == list(range(len(response.data)))
    return np.array([_decoded(d.embedding) for d in response.data])


def _decoded(embedding) -> np.ndarray:
    return np.frombuffer(base64.b64decode(embedding), "<f4") if isinstance(embedding, str) else np.array(embedding)


def test_loaded_on_demand_in_the_residency_and_listed_by_kind(server):
    assert loaded(server) == {"tiny": True, "embed": False, "gemma": False}
    listed = {m["id"]: m for m in server.client().models.list().model_dump()["data"]}
    assert listed["tiny"]["kind"] == "chat" and listed["embed"]["kind"] == "embedding"
    assert listed["embed"]["dimensions"] == 128 and listed["gemma"]["dimensions"] == 128
    vectors(server.client(), "embed", "hello")
    # Its weights counted: the chat model, idle, left to make room (and comes back for a chat).
    assert loaded(server) == {"tiny": False, "embed": True, "gemma": False}
    assert "unloaded tiny to make room for embed" in server.log()
    chat = server.client().chat.completions.create(
        model="tiny", messages=[{"role": "user", "content": "hi"}], max_tokens=4
    )
    assert chat.usage.completion_tokens > 0 and loaded(server) == {"tiny": True, "embed": False, "gemma": False}
    assert metric(server, "agent_memory_model_unloads_total", model="embed") == 1
    assert metric(server, "agent_memory_model_loads_total", model="embed") == 1


@pytest.mark.parametrize("model", ["embed", "gemma"])
def test_vectors_are_normalized_and_the_same_alone_or_in_a_batch(server, model):
    client = server.client()
    batch = vectors(client, model, TEXTS, encoding_format="float")
    assert batch.shape == (len(TEXTS), 128)
    assert np.allclose(np.linalg.norm(batch, axis=1), 1.0, atol=1e-5)
    for text, row in zip(TEXTS, batch):
        assert np.allclose(vectors(client, model, text)[0], row, atol=1e-5)
    assert not np.allclose(batch[0], batch[3], atol=1e-2)  # different inputs, different vectors
    # base64: the same float32 values, as OpenAI encodes them.
    assert np.array_equal(vectors(client, model, TEXTS, encoding_format="base64"), batch.astype(np.float32))
    assert np.array_equal(vectors(client, model, TEXTS), batch.astype(np.float32))  # the SDK's own base64


def test_token_ids_and_usage(server, tiny_embedding):
    client = server.client()
    tokenizer = Tokenizer.from_file(str(tiny_embedding / "tokenizer.json"))
    ids = [tokenizer.encode(text).ids for text in TEXTS[:2]]
    assert all(tokens[-1] == tokenizer.token_to_id("<|endoftext|>") for tokens in ids)  # Qwen3-Embedding's end
    by_text = client.embeddings.create(model="embed", input=TEXTS[:2])
    assert by_text.usage.prompt_tokens == by_text.usage.total_tokens == sum(map(len, ids))
    assert np.allclose(vectors(client, "embed", ids), [d.embedding for d in by_text.data], atol=1e-5)
    assert np.allclose(vectors(client, "embed", ids[0])[0], by_text.data[0].embedding, atol=1e-5)
    # OpenAI's tiktoken ids (what LangChain sends by default) are not this model's: refused, with the fix.
    with pytest.raises(openai.BadRequestError) as e:
        client.embeddings.create(model="embed", input=[[50000, 60000]])
    assert "token ids must be in [0, 2048)" in e.value.message and "check_embedding_ctx_length=False" in e.value.message


def test_dimensions_where_the_model_was_trained_for_them(server):
    client = server.client()
    full = vectors(client, "embed", TEXTS)
    cut = vectors(client, "embed", TEXTS, dimensions=64)
    expected = full[:, :64] / np.linalg.norm(full[:, :64], axis=1, keepdims=True)
    assert cut.shape == (len(TEXTS), 64) and np.allclose(cut, expected, atol=1e-5)
    for model, dimensions, said in [
        ("embed", 16, "gives from 32 to 128"),
        ("embed", 256, "gives at most 128"),
        ("gemma", 64, "128: this model was not trained to be truncated"),
    ]:
        with pytest.raises(openai.BadRequestError) as e:
            client.embeddings.create(model=model, input="hi", dimensions=dimensions)
        assert e.value.param == "dimensions" and said in e.value.message


def test_a_model_of_the_wrong_kind_is_a_400_naming_it(server):
    client = server.client()
    with pytest.raises(openai.BadRequestError) as e:
        client.embeddings.create(model="tiny", input="hi")
    assert "the model 'tiny' is a chat model" in e.value.message and e.value.code == "model_not_supported"
    hi = [{"role": "user", "content": "hi"}]
    with pytest.raises(openai.BadRequestError) as e:
        client.chat.completions.create(model="embed", messages=hi, max_tokens=4)
    assert "the model 'embed' is an embedding model: it serves /v1/embeddings" in e.value.message
    with pytest.raises(openai.BadRequestError) as e:
        client.completions.create(model="gemma", prompt="hi", max_tokens=4)
    assert "the model 'gemma' is an embedding model" in e.value.message
    with pytest.raises(openai.BadRequestError) as e:
        client.responses.create(model="embed", input="hi", max_output_tokens=16)
    assert "the model 'embed' is an embedding model" in e.value.message
    messages = anthropic.Anthropic(base_url=server.base_url, api_key="unused", max_retries=0).messages
    with pytest.raises(anthropic.BadRequestError) as e:
        messages.create(model="embed", max_tokens=4, messages=hi)
    assert e.value.body["error"]["type"] == "invalid_request_error"
    assert "the model 'embed' is an embedding model" in e.value.body["error"]["message"]
    # A name no model answers to: the one model of the route's kind (clients send their own names).
    assert client.chat.completions.create(model="gpt-4o", messages=hi, max_tokens=2).model == "tiny"


@pytest.mark.parametrize(
    "body, said",
    [
        ({"input": []}, "input: an empty array"),
        ({"input": ["a", ""]}, "input.1: an empty string"),
        ({"input": [[1, 2], []]}, "input.1: an empty token array"),
        ({"input": "x " * 5000}, "maximum context length is 4096 tokens"),
        ({"input": "hi", "encoding_format": "int8"}, "encoding_format"),
    ],
)
def test_bad_input_is_a_400_in_openais_shape(server, body, said):
    r = httpx.post(server.base_url + "/v1/embeddings", json={"model": "embed", **body}, timeout=60)
    assert r.status_code == 400 and said in r.json()["error"]["message"], r.text


def test_langchain_openai_embeddings_both_ways(server, tiny_embedding):
    from langchain_openai import OpenAIEmbeddings

    expected = vectors(server.client(), "embed", TEXTS)
    common = {"model": "embed", "base_url": server.base_url + "/v1", "api_key": "unused", "max_retries": 0}
    # Text as it is: the setting for any model that is not OpenAI's.
    plain = OpenAIEmbeddings(**common, check_embedding_ctx_length=False)
    assert np.allclose(plain.embed_documents(TEXTS), expected, atol=1e-5)
    assert np.allclose(plain.embed_query(TEXTS[0]), expected[0], atol=1e-5)
    # Its default length check, counting with the model's own tokenizer instead of tiktoken
    # (which would send OpenAI's token ids): it sends each text back as text.
    checked = OpenAIEmbeddings(**common, tiktoken_enabled=False, tiktoken_model_name=str(tiny_embedding))
    assert np.allclose(checked.embed_documents(TEXTS), expected, atol=1e-5)


def test_metrics_per_model(server):
    before = metric(server, "agent_memory_embedding_inputs_total", model="gemma")
    vectors(server.client(), "gemma", TEXTS)
    assert metric(server, "agent_memory_embedding_inputs_total", model="gemma") == before + len(TEXTS)
    assert metric(server, "agent_memory_embedding_requests_total", model="gemma") >= 1
    assert metric(server, "agent_memory_embedding_tokens_total", model="gemma") > 0
    assert metric(server, "agent_memory_embedding_seconds_count", model="gemma") >= 1
    assert metric(server, "agent_memory_model_loaded", model="gemma") == 1
    assert metric(server, "agent_memory_embedding_requests_total", model="tiny") == 0
    assert "path=/v1/embeddings status=200" in server.log() and "inputs=4" in server.log()


def test_an_embedding_model_it_cannot_compute_is_refused_at_start(tiny_model, tmp_path):
    import json

    import mlx.core as mx

    bert = tmp_path / "bert"
    bert.mkdir()
    config = {"model_type": "bert", "architectures": ["BertModel"], "hidden_size": 32, "vocab_size": 64}
    (bert / "config.json").write_text(json.dumps(config))
    mx.save_safetensors(str(bert / "model.safetensors"), {"embeddings.word_embeddings.weight": mx.zeros((64, 32))})
    said = refused_start(tiny_model, tmp_path / "cache", "--model", f"bert={bert}")
    assert "bert: a bert encoder: mlx-lm has no class for it" in said and "Traceback" not in said

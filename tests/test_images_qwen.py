"""Qwen3.5 images through the engine (issue #36): the tiny Qwen3.5 VLM (models/tiny_vision.py,
gated delta-net and attention layers, its image tokens at 3-D positions: vision/positions.py)
answers as mlx-vlm's own generation does on the same folder — through a prefill chunk that ends
inside the image, and decoding in one batch beside another image's sequence — and a text-only
request answers as mlx-lm's own. The memory's checks for this family (reuse by image, the grid in
the key, cached == uncached) are tests/test_images_engine.py's, parametrised over it."""

from __future__ import annotations

import agent_memory.blas  # noqa: F401 - before MLX
import httpx
import mlx.core as mx
import pytest

from agent_memory.models.tiny_vision import build_tiny_vision
from tests.support.images import data_url, encoded
from tests.support.inprocess import InProcessServer
from tests.support.metrics import metric
from tests.support.vision import generate, picture, submit

TOKENS = 16  # generated per answer


def look(image: int, words: int = 0) -> list[dict]:
    """A user turn: `words` words of text, the image, a question."""
    before = [{"type": "text", "text": "word " * words}] if words else []
    return [{"role": "user", "content": [*before, {"type": "image"}, {"type": "text", "text": f"Picture {image}?"}]}]


@pytest.fixture(scope="module")
def folder(tmp_path_factory):
    return build_tiny_vision(tmp_path_factory.mktemp("models") / "qwen", arch="qwen3_5_vision")


@pytest.fixture(scope="module")
def server(folder, tmp_path_factory):
    with InProcessServer(folder, tmp_path_factory.mktemp("cache"), "--disk-budget-mb", "0") as s:
        yield s


def decoded(server, tokens: list[int]) -> str:
    """Greedy tokens as the engine's text: up to the end-of-turn token, special tokens left out."""
    (served,) = server.app.state.server.models.values()
    tokenizer = served.facts.tokenizer
    eos = set(tokenizer.eos_token_ids)
    kept = tokens[: next((i for i, t in enumerate(tokens) if t in eos), len(tokens))]
    return tokenizer.decode(kept, skip_special_tokens=True)


def mlx_vlm_answer(folder, answer) -> list[int]:
    """mlx-vlm's own greedy generation on the folder for the same prompt and pixels."""
    from mlx_vlm.generate.ar import generate_step
    from mlx_vlm.utils import load_model

    vlm = load_model(folder)
    pixels = {k: mx.array(v) for k, v in answer.inputs.pixels.items()}
    steps = generate_step(
        mx.array(answer.prompt)[None], vlm, pixels.pop("pixel_values"), None, **pixels,
        max_tokens=TOKENS, sampler=lambda lp: mx.argmax(lp, axis=-1), prefill_step_size=None,
    )
    return [int(t) for t, _ in steps]


def test_greedy_through_a_chunk_cut_inside_the_image_is_mlx_vlms_own(server, folder):
    words = 100  # text enough that the first 256-token chunk ends inside the image
    answer = generate(server, look(1, words), [picture((200, 30, 30), size=(256, 256), stripe=90)], max_tokens=TOKENS)
    (span,) = answer.inputs.spans
    assert span.start < 256 < span.end and answer.inputs.placement.delta == -56  # 8x8 tokens at 8 positions
    assert answer.text == decoded(server, mlx_vlm_answer(folder, answer))


def test_two_images_of_other_grids_decoded_in_one_batch_answer_as_each_alone(server, folder):
    square, wide = picture((30, 30, 200), size=(128, 128)), picture((30, 200, 30), size=(96, 64))
    both = [submit(server, look(2), [square], salt="together", max_tokens=TOKENS),
            submit(server, look(3), [wide], salt="together", max_tokens=TOKENS)]
    together = [wait() for wait in both]
    alone = [generate(server, look(2), [square], salt="alone a", max_tokens=TOKENS),
             generate(server, look(3), [wide], salt="alone b", max_tokens=TOKENS)]
    assert [a.inputs.placement.delta for a in alone] == [-12, -3]  # 16 tokens at 4 places; 3x2 at 3
    assert [a.text for a in together] == [a.text for a in alone]
    assert alone[1].text == decoded(server, mlx_vlm_answer(folder, alone[1]))


def test_a_text_only_request_answers_as_mlx_lms_own_model(server, folder):
    from mlx_lm import stream_generate
    from mlx_lm.utils import load

    messages = [{"role": "user", "content": "Hello there, who are you?"}]
    answer = generate(server, messages, [], max_tokens=TOKENS)
    model, tokenizer = load(str(folder))
    steps = stream_generate(model, tokenizer, answer.prompt, max_tokens=TOKENS, sampler=lambda lp: mx.argmax(lp, -1))
    assert answer.inputs is None and answer.text == decoded(server, [step.token for step in steps])


def test_over_http_the_same_image_next_turn_reuses_the_turn_without_the_tower(server):
    image = data_url(encoded(picture((120, 60, 200), size=(128, 96)).image))
    first_turn = [{"role": "user", "content": [{"type": "image_url", "image_url": {"url": image}},
                                               {"type": "text", "text": "What is this?"}]}]
    body = {"model": "qwen", "max_tokens": 8, "temperature": 0, "prompt_cache_key": "http"}
    first = httpx.post(f"{server.base_url}/v1/chat/completions", json={**body, "messages": first_turn}, timeout=60)
    assert first.status_code == 200, first.text
    runs = metric(server, "agent_memory_vision_tower_runs_total")
    reply = first.json()["choices"][0]["message"]
    turn = [*first_turn, {"role": "assistant", "content": reply["content"]}, {"role": "user", "content": "More?"}]
    second = httpx.post(f"{server.base_url}/v1/chat/completions", json={**body, "messages": turn}, timeout=60)
    assert second.status_code == 200, second.text
    cached = second.json()["usage"]["prompt_tokens_details"]["cached_tokens"]
    assert cached >= first.json()["usage"]["prompt_tokens"]  # the image and the reply, from memory
    assert metric(server, "agent_memory_vision_tower_runs_total") == runs

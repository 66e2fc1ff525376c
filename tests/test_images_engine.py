"""A vision model served by the engine (issue #36, the model side): the tiny Gemma 3 (window
layers) and Mistral Small 3.1 (Pixtral's tower, images of varying token counts) built offline
from mlx-vlm's classes (models/tiny_vision.py) loads by folder; a prompt's images go through its
processor (vision/prompt.py) and its vision tower into the language model's input embeddings
(vision/tower.py); each image's digest is in the key of the blocks its tokens are in, so the same
image is reused and another one of the same size is not. Prompts are prepared in the test (as the
API's serving prompt does) and given to the in-process server's engine."""

from __future__ import annotations

import json

import numpy as np
import pytest

from agent_memory.api.errors import APIError
from agent_memory.api.serving.prompt import encode_prompt
from agent_memory.models.tiny_vision import build_tiny_vision
from agent_memory.vision.processing import preparer
from agent_memory.vision.prompt import vision_prompt
from tests.support.inprocess import InProcessServer
from tests.support.metrics import metric
from tests.support.vision import generate, picture

# An image's tokens: Gemma's fixed count, Pixtral's 2x2 and marks, Qwen3.5's 2x3 merged patches.
TOKENS = {"gemma3": 4, "mistral3_vision": 6, "qwen3_5_vision": 6}
RED, BLUE = picture((200, 30, 30)), picture((30, 30, 200))  # the same size: the same tokens


def tower_runs(server) -> float:
    return metric(server, "agent_memory_vision_tower_runs_total")


def look(image_first: str = "What is in this picture?") -> list[dict]:
    return [{"role": "user", "content": [{"type": "image"}, {"type": "text", "text": image_first}]}]


@pytest.fixture(scope="module", params=list(TOKENS))
def server(request, tmp_path_factory):
    folder = build_tiny_vision(tmp_path_factory.mktemp("models") / request.param, arch=request.param)
    with InProcessServer(folder, tmp_path_factory.mktemp("cache"), "--disk-budget-mb", "0") as s:
        s.family = request.param
        yield s


def test_the_processor_expands_each_image_into_its_tokens_and_keys_them_by_digest(server):
    answer = generate(server, look(), [RED], agent="counting")
    (span,) = answer.inputs.spans
    assert span.end - span.start == TOKENS[server.family]  # the image's tokens, all in the prompt
    assert answer.finished.usage.prompt_tokens == len(answer.prompt)  # images' tokens counted
    # Qwen3.5's grid (t, h, w patches, 3 x uint16) too: it places every token after the image.
    grid = bytes([0, 1, 0, 4, 0, 6]) if server.family == "qwen3_5_vision" else b""
    assert answer.inputs.keys[0].key == bytes.fromhex(RED.digest) + grid


def test_the_processor_runs_without_mlx_as_mlx_vlms_own_would(server):
    """vision/processing.py: mlx-vlm's processor's parts, numpy only (its own call makes MLX
    arrays, off the engine thread); the same ids and arrays as its call, two sizes of image."""
    (served,) = server.app.state.server.models.values()
    vision, wide = served.facts.vision, picture((30, 200, 30), size=(90, 20))
    two = [{"role": "user", "content": [{"type": "image"}, {"type": "text", "text": "and"}, {"type": "image"}]}]
    text = served.facts.tokenizer.apply_chat_template(two, add_generation_prompt=True, tokenize=False)
    ids, arrays = vision.run(text, [RED.image, wide.image])
    theirs = vision.processor(text=[text], images=[[RED.image, wide.image]], add_special_tokens=False)
    assert ids == np.array(theirs["input_ids"]).reshape(-1).tolist()
    assert set(arrays) == set(theirs) - {"input_ids", "attention_mask"}
    for name, array in arrays.items():
        assert isinstance(array, np.ndarray) and np.array_equal(array, np.array(theirs[name])), name


def test_a_processor_that_cannot_run_without_mlx_is_not_run():
    assert preparer(object()) is None  # neither transformers' own nor one vision/processing.py expands


def test_text_only_requests_to_a_vision_model_run_no_tower(server):
    before = tower_runs(server)
    first = generate(server, [{"role": "user", "content": "Hello, who are you?"}], [], agent="text")
    again = generate(server, [{"role": "user", "content": "Hello, who are you?"}], [], agent="text")
    assert first.text == again.text and first.text
    assert again.finished.usage.cached_tokens > 0
    assert tower_runs(server) == before


def test_the_same_image_next_turn_reuses_the_whole_turn_without_the_tower(server):
    first = generate(server, look(), [RED], agent="returning")
    runs = tower_runs(server)
    turn = look() + [{"role": "assistant", "content": first.text}, {"role": "user", "content": "And its colour?"}]
    second = generate(server, turn, [RED], agent="returning")
    assert second.finished.usage.cached_tokens >= len(first.prompt)  # past the image, into the reply
    assert tower_runs(server) == runs  # the image's tokens came from memory


def test_another_image_of_the_same_size_reuses_nothing_past_its_first_token(server):
    red = generate(server, look("Describe it."), [RED], agent="red")
    blue = generate(server, look("Describe it."), [BLUE], agent="blue")
    assert red.prompt == blue.prompt  # the same token ids: only the key tells them apart
    assert blue.finished.usage.cached_tokens <= blue.inputs.spans[0].start
    assert red.text != blue.text  # the model saw the picture


def test_a_cached_answer_equals_an_uncached_one_at_16_bits(server):
    first = generate(server, look("Tell me more."), [BLUE], agent="exact")
    turn = look("Tell me more.") + [{"role": "assistant", "content": first.text}, {"role": "user", "content": "Go on."}]
    cached = generate(server, turn, [BLUE], agent="exact")
    uncached = generate(server, turn, [BLUE], salt="a namespace of its own")
    assert cached.finished.usage.cached_tokens > 0 and uncached.finished.usage.cached_tokens == 0
    assert cached.text == uncached.text


def test_more_images_than_placeholders_is_a_400_naming_the_messages(server):
    (served,) = server.app.state.server.models.values()
    text = served.facts.tokenizer.apply_chat_template(look(), add_generation_prompt=True, tokenize=False)
    with pytest.raises(APIError) as refused:
        encode_prompt(served, served.facts.tokenizer, text, [RED, BLUE], "messages")
    assert refused.value.status == 400 and refused.value.param == "messages"
    assert "2 images" in str(refused.value)  # the processor's words, or ours where it does not count


def test_an_image_repeated_in_a_new_prompt_takes_its_kept_features(server):
    first = generate(server, look("A green one."), [picture((30, 160, 30))], agent="green")
    runs, kept = tower_runs(server), metric(server, "agent_memory_vision_images_total", source="kept")
    text_first = [{"role": "user", "content": [{"type": "text", "text": "Elsewhere now:"}, {"type": "image"}]}]
    again = generate(server, text_first, [picture((30, 160, 30))], agent="green elsewhere")
    assert again.inputs.spans[0].start != first.inputs.spans[0].start  # another place: no KV to reuse
    assert again.finished.usage.cached_tokens <= again.inputs.spans[0].start
    assert tower_runs(server) == runs
    assert metric(server, "agent_memory_vision_images_total", source="kept") == kept + 1
    assert metric(server, "agent_memory_vision_feature_bytes", of="budget") == 256 << 20
    # Another namespace (a cache salt, as another tenant) never finds them: no timing tells it
    # what others sent.
    generate(server, text_first, [picture((30, 160, 30))], agent="green salted", salt="elsewhere")
    assert tower_runs(server) == runs + 1


def test_after_a_restart_the_same_image_is_reused_from_disk(tmp_path_factory):
    folder = build_tiny_vision(tmp_path_factory.mktemp("models") / "gemma3", arch="gemma3")
    cache = tmp_path_factory.mktemp("restart")
    with InProcessServer(folder, cache) as first:
        answer = generate(first, look("Remember this."), [RED], agent="remembers")
    reply = [{"role": "assistant", "content": answer.text}, {"role": "user", "content": "Well?"}]
    turn = look("Remember this.") + reply
    with InProcessServer(folder, cache) as second:
        red = generate(second, turn, [RED], agent="remembers")
        blue = generate(second, turn, [BLUE], agent="forgets")
        assert tower_runs(second) == 1  # blue's alone
    assert red.finished.usage.warm_tokens >= len(answer.prompt)
    assert blue.finished.usage.cached_tokens <= blue.inputs.spans[0].start


def test_a_family_with_3d_image_positions_other_than_qwen3_5s_is_served_text_only(tmp_path, caplog):
    rope = {"text_config": {"rope_parameters": {"mrope_section": [2, 1, 1]}}}
    qwen3_vl = {"model_type": "qwen3_vl", "vision_config": {"deepstack_visual_indexes": [1]}, **rope}
    qwen2_vl = {"model_type": "qwen2_vl", "vision_config": {"depth": 1}, **rope}
    with caplog.at_level("INFO", "agent_memory.vision.prompt"):
        assert vision_prompt(tmp_path, qwen3_vl) is None  # its folder not even read: no processor
        assert vision_prompt(tmp_path, qwen2_vl) is None
    assert "deepstack" in caplog.messages[0] and "placed only for qwen3_5" in caplog.messages[1]
    assert vision_prompt(tmp_path, {"text_config": {}}) is None  # no vision tower: text


def test_a_vision_folder_whose_processor_cannot_load_is_served_text_only(tmp_path):
    folder = build_tiny_vision(tmp_path / "gemma3", arch="gemma3")
    (folder / "preprocessor_config.json").unlink()
    config = json.loads((folder / "config.json").read_text())
    assert vision_prompt(folder, config) is None
    assert vision_prompt(folder, {**config, "model_type": "no_such_family"}) is None

"""Qwen3.5's 3-D image positions (vision/positions.py) against mlx-vlm's own: `place` is its
`get_rope_index`, `MRoPE`'s rotation is its rotary embedding's, and a model whose rope is swapped
but not steered is mlx-lm's bit for bit. On the tiny Qwen3.5 VLM's classes (no weights read)."""

from __future__ import annotations

import json

import agent_memory.blas  # noqa: F401 - before MLX
import mlx.core as mx
import mlx.nn as nn
import numpy as np
import pytest
from mlx_lm.models.cache import make_prompt_cache
from mlx_lm.utils import load_model

from agent_memory.models.tiny_vision import VISION_ARCHS, build_tiny_vision, vision_model
from agent_memory.vision.positions import MRoPE, Positions, install, place, self_check


@pytest.fixture(scope="module")
def folder(tmp_path_factory):
    return build_tiny_vision(tmp_path_factory.mktemp("models") / "qwen", arch="qwen3_5_vision")


@pytest.fixture(scope="module")
def config(folder):
    return json.loads((folder / "config.json").read_text())


def layout(rng: np.random.Generator, config: dict) -> tuple[list[int], list[tuple[int, int]], list[tuple]]:
    """Random text with 1-4 images of random grids between: (tokens, each image's run, grids)."""
    image, start, end = config["image_token_id"], config["vision_start_token_id"], config["vision_end_token_id"]
    tokens, runs, grids = [], [], []
    for _ in range(int(rng.integers(1, 5))):
        tokens += rng.integers(0, 2000, int(rng.integers(0, 6))).tolist() + [start]
        grid = (1, 2 * int(rng.integers(1, 6)), 2 * int(rng.integers(1, 6)))
        n = grid[1] * grid[2] // 4
        runs.append((len(tokens), len(tokens) + n))
        grids.append(grid)
        tokens += [image] * n + [end]
    tokens += rng.integers(0, 2000, int(rng.integers(0, 6))).tolist()
    return tokens, runs, grids


@pytest.mark.parametrize("seed", range(6))
def test_place_is_mlx_vlms_get_rope_index(config, seed):
    tokens, runs, grids = layout(np.random.default_rng(seed), config)
    vlm = vision_model(config)
    theirs, delta = vlm.language_model.get_rope_index(mx.array(tokens)[None], mx.array(grids))
    placement = place(runs, np.array(grids), 2)
    assert np.array_equal(placement.positions(0, len(tokens)), np.array(theirs)[:, 0])
    assert placement.delta == int(delta.item())
    cut = len(tokens) // 3  # any chunk's positions are the whole prompt's
    assert np.array_equal(placement.positions(cut, len(tokens)), np.array(theirs)[:, 0, cut:])


def test_a_run_that_is_not_its_grids_size_is_refused():
    with pytest.raises(ValueError, match="6 tokens for a 1×4×4"):
        place([(3, 9)], np.array([(1, 4, 4)]), 2)


def test_the_rotation_is_mlx_vlms_and_unsteered_it_is_mlx_lms_own(folder, config):
    model, _ = load_model(folder, lazy=True)
    ids = mx.array([[5, 9, 300, 12, 7]])
    before, cached = model(ids), model(ids, cache=model.make_cache())
    positions = install(model, config)
    assert mx.array_equal(model(ids), before)  # nothing set: mlx-lm's own rope, bit for bit
    with positions.rows(deltas=[0]):
        assert mx.array_equal(model(ids, cache=model.make_cache()), cached)
    ours = next(layer.self_attn.rope for layer in model.layers if hasattr(layer, "self_attn"))
    assert isinstance(ours, MRoPE)
    vlm = vision_model(config)
    theirs = next(layer.self_attn.rotary_emb for layer in vlm.language_model.model.layers if not layer.is_linear)
    tokens, runs, grids = layout(np.random.default_rng(9), config)
    pos = place(runs, np.array(grids), 2).positions(0, len(tokens))[:, None]
    x = mx.random.normal((1, 4, len(tokens), 32), key=mx.random.key(1))
    with positions.rows(explicit=pos):
        mine = ours(x)
    rotated, _ = theirs.apply_rotary(x, x, mx.array(pos))
    assert mx.allclose(mine, rotated, atol=1e-6)


def test_explicit_positions_give_a_token_the_same_bits_whatever_the_chunk(folder, config):
    """A prefilled token's KV depends on its position alone: a cached block equals a recompute."""
    model, _ = load_model(folder, lazy=True)
    rope = install(model, config)
    ours = next(layer.self_attn.rope for layer in model.layers if hasattr(layer, "self_attn"))
    pos = place([(4, 20)], np.array([(1, 8, 8)]), 2).positions(0, 40)[:, None]
    x = mx.random.normal((1, 4, 40, 32), key=mx.random.key(2))
    with rope.rows(explicit=pos):
        whole = ours(x)
    for cut in (7, 13, 33):
        with rope.rows(explicit=pos[:, :, :cut]):
            a = ours(x[:, :, :cut])
        with rope.rows(explicit=pos[:, :, cut:]):
            b = ours(x[:, :, cut:])
        assert mx.array_equal(mx.concatenate([a, b], axis=2), whole)


class Bypass(nn.Module):
    """An attention that keeps a rope but never calls it (as a fused kernel would)."""

    def __init__(self) -> None:
        super().__init__()
        self.rope = nn.RoPE(8)
        self.proj = nn.Linear(16, 16)

    def __call__(self, x, mask=None, cache=None):
        return self.proj(x)


class Layer(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.input_layernorm = nn.RMSNorm(16)
        self.self_attn = Bypass()


class Model(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.layers = [Layer()]


def test_the_tiny_models_layers_are_the_ones_it_lists(folder):
    model, _ = load_model(folder, lazy=True)
    listed = VISION_ARCHS["qwen3_5_vision"].cache_classes
    assert tuple(type(c).__name__ for c in make_prompt_cache(model)) == listed


def test_a_model_whose_attention_does_not_call_its_rope_fails_the_self_check(folder, config):
    fake = Model()
    text = {"head_dim": 8, "rope_parameters": {"rope_theta": 10000.0, "mrope_section": [2, 1, 1]}}
    assert "called its rope 0 times" in self_check(fake, install(fake, text))
    model, _ = load_model(folder, lazy=True)
    assert self_check(model, install(model, config)) is None
    assert self_check(Model(), Positions()) == "its attention layers have no rope module to place image tokens with"


def test_deltas_move_each_row_by_its_own(folder, config):
    """Decode's path: a row at delta d is the same as that row alone at offset + d."""
    model, _ = load_model(folder, lazy=True)
    positions = install(model, config)
    ours = next(layer.self_attn.rope for layer in model.layers if hasattr(layer, "self_attn"))
    x = mx.random.normal((2, 4, 1, 32), key=mx.random.key(3))
    with positions.rows(deltas=[-12, 0]):
        both = ours(x, offset=mx.array([30, 30]))
    assert mx.array_equal(both[0], ours.inner(x[:1], offset=18)[0])
    assert mx.array_equal(both[1], ours.inner(x[1:], offset=30)[0])


def test_a_speculative_verify_places_each_row_at_its_delta_as_decoding_one_token_a_step_does():
    """SpeculativeBatch verifies several tokens a row at the rows' own deltas: the tokens DecodeBatch
    gives one a step. Qwen3.5's delta-net layers keep speculation off for it, so a plain-KV model
    (mlx-lm's Qwen3, random weights) with Qwen3.5's sections is steered here."""
    from mlx_lm.models.qwen3 import Model, ModelArgs

    from agent_memory.engine.batch.decode_batch import DecodeBatch
    from agent_memory.engine.speculation.speculative_batch import SpeculativeBatch
    from agent_memory.models.tiny_archs import ARCHS

    mx.random.seed(4)
    model = Model(ModelArgs.from_dict({**ARCHS["qwen3"].config, "vocab_size": 256}))
    rope = {"rope_theta": 10000.0, "mrope_section": [6, 5, 5]}
    positions = install(model, {"head_dim": 32, "rope_parameters": rope})
    prompts = {1: [40, 41, 42, 43] * 6, 2: [50, 51, 52] * 7}  # repeats: prompt lookup proposes
    deltas = {1: -12, 2: -3}
    greedy = lambda lp: mx.argmax(lp, axis=-1)  # noqa: E731

    def answers(batch) -> dict[int, list[int]]:
        for seq_id, prompt in prompts.items():
            cache = make_prompt_cache(model)
            placed = np.broadcast_to(np.arange(len(prompt) - 1) + deltas[seq_id], (3, 1, len(prompt) - 1))
            with positions.rows(explicit=placed):
                model(mx.array(prompt[:-1])[None], cache=cache)
            batch.add(seq_id, prompt, cache, greedy, [], 12, delta=deltas[seq_id])
        out, steps = {seq_id: [] for seq_id in prompts}, 0
        while len(batch):
            steps += 1
            for token in batch.step():
                out[token.seq_id].append(token.token)
        return out, steps

    one_a_step, steps = answers(DecodeBatch(model, [], positions))
    verified, fewer = answers(SpeculativeBatch(model, [], None, positions))
    assert verified == one_a_step and fewer < steps  # some steps verified several tokens

"""How a model splits over processes (engine/loading/sharding.py `choose`), on tiny models of
real mlx-lm families loaded lazily (nothing computed, no group needed): tensor where the family
shards and its heads divide, pipeline where it pipelines, else refused with the reason."""

from __future__ import annotations

import json

import pytest
from mlx_lm.utils import load_model

from agent_memory.engine.loading.sharding import choose
from agent_memory.models.tiny import build_tiny


@pytest.fixture(scope="module")
def family(tmp_path_factory):
    """A lazily loaded tiny model of an arch, and its text config."""

    def load(arch: str):
        path = build_tiny(tmp_path_factory.mktemp("models") / arch, arch=arch)
        config = json.loads((path / "config.json").read_text())
        return load_model(path, lazy=True)[0], {**config, **(config.get("text_config") or {})}

    return load


def test_tensor_where_the_family_shards_and_its_heads_divide(family):
    model, config = family("llama")  # 4 query heads, 2 key-value heads; no pipeline in mlx-lm
    assert choose(model, config, 2, "auto") == ("tensor", None)
    assert choose(model, config, 3, "auto") == (
        None,
        "llama cannot be split over 3 processes: 2 key-value heads (4 query heads) cannot be split over 3 "
        "processes (tensor); mlx-lm gives it no pipeline parallelism",
    )
    assert choose(model, config, 2, "pipeline") == (None, "llama: mlx-lm gives it no pipeline parallelism")


def test_pipeline_where_asked_or_where_tensor_cannot(family):
    model, config = family("qwen2")
    assert choose(model, config, 2, "pipeline") == ("pipeline", None)
    assert choose(model, config, 3, "auto") == ("pipeline", None)  # its 2 key-value heads do not divide by 3
    assert choose(model, config, 3, "tensor") == (
        None,
        "qwen2: 2 key-value heads (4 query heads) cannot be split over 3 processes (tensor); try --distributed auto",
    )
    assert choose(model, config, 5, "auto")[1].endswith("its 4 layers cannot be split over 5 processes (pipeline)")


@pytest.mark.parametrize("arch", ["gemma3_text", "llama4"])
def test_families_split_neither_way_are_refused(family, arch):
    model, config = family(arch)  # Llama 4's chunked attention: mlx-lm has neither for it
    assert choose(model, config, 2, "auto") == (
        None,
        f"{config['model_type']} cannot be split over 2 processes: mlx-lm gives it neither tensor nor pipeline parallelism",
    )

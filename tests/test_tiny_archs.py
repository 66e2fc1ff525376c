"""The tiny model of every family in models/tiny_archs.py: built offline, byte-identical twice,
loaded by mlx-lm's public `load`, with the cache classes the table records, and decoding
greedily the same tokens every time; a few also quantized, as `mlx_lm.convert -q` would."""

from __future__ import annotations

import hashlib
import json
import subprocess
import sys
from pathlib import Path

import pytest

from agent_memory.models.folders import ModelError
from agent_memory.models.tiny import UnknownArchError, build_tiny
from agent_memory.models.tiny_archs import ARCHS
from agent_memory.models.tiny_embedding import EMBEDDING_ARCHS
from agent_memory.models.tiny_vision import VISION_ARCHS

pytestmark = pytest.mark.process

# Longer than the sliding window (32 tokens), so rotating caches wrap while it is read.
PROMPT = "Write a short story about a dragon and a knight who meet at a river and talk about the weather all day."
OTHER_PROMPT = "def f(x): return x"
TOKENS = 8
# sha256 of the llama tiny model's weights (names and float32 bytes), as built before there were
# other families: tests elsewhere depend on its exact outputs.
LLAMA_WEIGHTS_SHA256 = "603829b130ef410c8c4025c3d858a904516b8af3379b6e93f1f42856f41b2400"


@pytest.fixture(scope="session")
def tiny_root(tmp_path_factory) -> Path:
    return tmp_path_factory.mktemp("tiny-archs")


def _greedy(model, tokenizer, prompt: str) -> list[int]:
    import agent_memory.blas  # noqa: F401
    import mlx.core as mx
    from mlx_lm.models.cache import make_prompt_cache

    ids = tokenizer.apply_chat_template([{"role": "user", "content": prompt}], add_generation_prompt=True)
    cache, y, out = make_prompt_cache(model), mx.array([ids]), []
    for _ in range(TOKENS):
        out.append(int(mx.argmax(model(y, cache=cache)[0, -1])))
        y = mx.array([[out[-1]]])
    return out


def _load(folder: Path):
    from mlx_lm import load

    return load(str(folder))


def _cache_classes(model) -> tuple[str, ...]:
    from mlx_lm.models.cache import make_prompt_cache

    return tuple(type(c).__name__ for c in make_prompt_cache(model))


@pytest.mark.parametrize("arch", list(ARCHS))
def test_family_builds_loads_and_decodes(tiny_root, arch):
    first = build_tiny(tiny_root / arch, arch=arch)
    again = build_tiny(tiny_root / f"{arch}-again", arch=arch)
    for name in ("model.safetensors", "config.json", "tokenizer.json"):
        assert (first / name).read_bytes() == (again / name).read_bytes(), name
    assert json.loads((first / "config.json").read_text())["model_type"] == ARCHS[arch].model_type
    model, tokenizer = _load(first)
    assert _cache_classes(model) == ARCHS[arch].caches
    out = _greedy(model, tokenizer, PROMPT)
    assert out == _greedy(model, tokenizer, PROMPT)
    assert len(set(out)) > TOKENS // 2, f"greedy decoding repeats itself: {out}"
    assert out != _greedy(model, tokenizer, OTHER_PROMPT), "the continuation does not depend on the prompt"


QUANTIZED = [("qwen3", 4), ("qwen3_5", 4), ("granitemoehybrid", 8), ("gpt_oss", "mxfp4")]  # attention, hybrids, MoE


@pytest.mark.parametrize(("arch", "quantize"), QUANTIZED)
def test_quantized_family_loads_and_decodes(tiny_root, arch, quantize):
    folder = build_tiny(tiny_root / f"{arch}-q{quantize}", arch=arch, quantize=quantize)
    config = json.loads((folder / "config.json").read_text())
    mode, bits = ("mxfp4", 4) if quantize == "mxfp4" else ("affine", quantize)
    assert {k: config["quantization"][k] for k in ("bits", "mode")} == {"bits": bits, "mode": mode}
    assert config["quantization_config"] == config["quantization"]
    model, tokenizer = _load(folder)
    assert _cache_classes(model) == ARCHS[arch].caches
    out = _greedy(model, tokenizer, PROMPT)
    assert out == _greedy(model, tokenizer, PROMPT) and len(set(out)) > TOKENS // 2


def test_a_folder_holding_another_model_is_not_handed_back(tiny_root):
    folder = build_tiny(tiny_root / "qwen3", arch="qwen3")
    assert build_tiny(folder, arch="qwen3") == folder  # the same one is kept
    for other in ({"arch": "qwen3_vl"}, {"arch": "qwen3", "quantize": 4}):
        with pytest.raises(ModelError, match="already holds another model"):
            build_tiny(folder, **other)


def test_llama_weights_are_the_original_tiny_models(tiny_model):
    import agent_memory.blas  # noqa: F401
    import mlx.core as mx
    import numpy as np

    digest = hashlib.sha256()
    for name, value in sorted(mx.load(str(tiny_model / "model.safetensors")).items()):
        digest.update(name.encode() + np.array(value).tobytes())
    assert digest.hexdigest() == LLAMA_WEIGHTS_SHA256


def test_unknown_arch_and_quantization_are_refused(tmp_path):
    with pytest.raises(UnknownArchError, match="unknown arch 'llama5'.*gemma3_text.*qwen3_5"):
        build_tiny(tmp_path / "m", arch="llama5")
    with pytest.raises(ModelError, match="quantize must be one of 4, 8, mxfp4"):
        build_tiny(tmp_path / "m", arch="qwen3", quantize=3)
    assert list(tmp_path.iterdir()) == []


def test_build_tiny_cli_lists_the_families_and_refuses_an_unknown_one(tmp_path):
    def run(*args: str) -> subprocess.CompletedProcess:
        command = [sys.executable, "-m", "agent_memory", "models", "build-tiny", *args]
        return subprocess.run(command, capture_output=True, text=True)

    listed = run("--list")
    assert listed.returncode == 0, listed.stderr
    rows = {line.split()[0]: line for line in listed.stdout.splitlines()[1:]}
    assert list(rows) == list(ARCHS) + list(EMBEDDING_ARCHS) + list(VISION_ARCHS)
    assert "ArraysCache x3, KVCache" in rows["qwen3_5"]
    assert rows["gemma3"].split()[5] == "yes" and rows["qwen3_5"].split()[5] == "no"  # which take images
    qwen = rows["qwen3_5_vision"]  # attention every other layer: its images' positions tell in its answers
    assert "ArraysCache, KVCache, ArraysCache, KVCache" in qwen and " yes " in qwen
    refused = run(str(tmp_path / "m"), "--arch", "nope")
    assert refused.returncode == 1 and "unknown arch 'nope'" in refused.stderr and "gemma3_text" in refused.stderr
    assert "Traceback" not in refused.stderr and not (tmp_path / "m").exists()

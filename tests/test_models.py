"""Models, offline: the tiny model is deterministic and usable, names resolve without a hub."""

from __future__ import annotations

import subprocess
import sys

import pytest
from tokenizers import Tokenizer

from agent_memory.models.registry import ModelError, list_models, resolve_model
from agent_memory.models.tiny import build_tiny


def test_tiny_builds_byte_identical(tmp_path, tiny_model):
    again = build_tiny(tmp_path / "again")
    for name in ("model.safetensors", "tokenizer.json", "tokenizer_config.json", "config.json"):
        assert (again / name).read_bytes() == (tiny_model / name).read_bytes(), name


def test_tiny_greedy_output_depends_on_the_prompt_and_is_well_separated(tiny_model):
    import agent_memory.blas  # noqa: F401
    import mlx.core as mx
    from mlx_lm import load
    from mlx_lm.models.cache import make_prompt_cache

    model, tokenizer = load(str(tiny_model))
    outputs, gaps = [], []
    for prompt in ("hello there", "Write a short story.", "def f(x): return x"):
        ids = tokenizer.apply_chat_template([{"role": "user", "content": prompt}], add_generation_prompt=True)
        cache, y, out = make_prompt_cache(model), mx.array([ids]), []
        for _ in range(32):
            logits = model(y, cache=cache)[0, -1]
            top2 = mx.sort(logits)[-2:].tolist()
            gaps.append(top2[1] - top2[0])
            out.append(int(mx.argmax(logits)))
            y = mx.array([[out[-1]]])
        outputs.append(out)
    assert len({tuple(o) for o in outputs}) == 3
    assert all(len(set(o)) > 8 for o in outputs), "greedy decoding collapsed into a repetition"
    # Batching changes logits by ~1e-4; greedy choices must be far apart from that.
    assert min(gaps) > 1e-3


def test_tiny_chat_template_is_chatml(tiny_model):
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(str(tiny_model))
    text = tok.apply_chat_template([{"role": "user", "content": "Hi"}], tokenize=False, add_generation_prompt=True)
    assert text == "<|im_start|>system\nYou are a helpful AI assistant.<|im_end|>\n<|im_start|>user\nHi<|im_end|>\n<|im_start|>assistant\n"
    raw = Tokenizer.from_file(str(tiny_model / "tokenizer.json"))
    assert raw.decode(raw.encode("naïve café 42").ids) == "naïve café 42"


def test_resolve_model(tmp_path, tiny_model):
    assert resolve_model(str(tiny_model), tmp_path) == tiny_model.resolve()
    with pytest.raises(ModelError, match="not a model folder"):
        resolve_model(str(tmp_path / "missing"), tmp_path)
    with pytest.raises(ModelError):
        resolve_model("HuggingFaceTB/SmolLM2-135M-Instruct", tmp_path)  # a hub id is never fetched
    built = resolve_model("tiny", tmp_path)
    assert built == tmp_path / "tiny"
    assert [m.name for m in list_models(tmp_path)] == ["tiny"]


def test_models_cli(tmp_path):
    run = lambda *a: subprocess.run([sys.executable, "-m", "agent_memory", "models", *a], capture_output=True, text=True)
    built = run("build-tiny", str(tmp_path / "models" / "tiny"))
    assert built.returncode == 0, built.stderr
    listed = run("ls", "--cache-dir", str(tmp_path))
    assert listed.returncode == 0 and "tiny" in listed.stdout and "llama" in listed.stdout
    refused = run("fetch", "something-else", "--cache-dir", str(tmp_path))
    assert refused.returncode != 0

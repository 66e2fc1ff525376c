"""Tiny embedding models, built offline like the tiny chat models (models/tiny.py), in the layout
their real counterparts are published in: a bare backbone's weights (no `model.` prefix, no output
head) and sentence-transformers' files (`modules.json`, `1_Pooling/config.json`, Dense modules,
`config_sentence_transformers.json`), which is what models/embedding_layout.py reads."""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

import agent_memory.blas  # noqa: F401
import mlx.core as mx
import numpy as np
from tokenizers import Tokenizer, processors

from agent_memory.models.folders import ModelError, building, complete
from agent_memory.models.gguf import Progress
from agent_memory.models.tiny import build_tiny

ST = "sentence_transformers.models."
TOKENIZER_FILES = ("tokenizer.json", "tokenizer_config.json", "special_tokens_map.json")


@dataclass(frozen=True)
class TinyEmbedding:
    base: str  # the tiny chat family (tiny_archs.py) whose backbone it is
    architecture: str  # config.json's `architectures`, as the real one says
    pooling: str  # sentence-transformers' pooling mode flag: lasttoken, mean_tokens
    dense: tuple[int, ...] = ()  # each Dense module's output size, in order
    end_token: str | None = None  # appended to every input by the tokenizer (Qwen3-Embedding's <|endoftext|>)
    config: tuple[tuple[str, object], ...] = ()  # fields changed in the base's config
    about: str = ""


EMBEDDING_ARCHS: dict[str, TinyEmbedding] = {
    "qwen3_embedding": TinyEmbedding(
        "qwen3",
        "Qwen3ForCausalLM",
        "lasttoken",
        end_token="<|endoftext|>",
        about="Qwen3-Embedding: a Qwen3 decoder, last-token pooling, normalized; inputs end with <|endoftext|>",
    ),
    "embeddinggemma": TinyEmbedding(
        "gemma3_text",
        "Gemma3TextModel",
        "mean_tokens",
        dense=(512, 128),
        config=(("use_bidirectional_attention", True),),
        about="EmbeddingGemma: Gemma 3 as a bidirectional encoder, mean pooling, two dense layers, normalized",
    ),
}


def build_tiny_embedding(out_dir: Path, *, arch: str = "qwen3_embedding", progress: Progress | None = None) -> Path:
    """Build the embedding model folder of `arch` (the same bytes every time); a complete one of
    the same arch is kept."""
    spec = EMBEDDING_ARCHS[arch]
    if complete(out_dir):
        config = json.loads((out_dir / "config.json").read_text())
        if config.get("architectures") != [spec.architecture] or not (out_dir / "modules.json").is_file():
            raise ModelError(f"{out_dir} already holds another model; build into another folder or delete it")
        return out_dir
    with building(out_dir) as work:
        chat = build_tiny(work.parent / "chat", arch=spec.base, config=dict(spec.config), progress=progress)
        for name in TOKENIZER_FILES:
            (work / name).write_bytes((chat / name).read_bytes())
        if spec.end_token:
            _end_each_input(work / "tokenizer.json", spec.end_token)
        weights = mx.load(str(chat / "model.safetensors"))
        backbone = {k.removeprefix("model."): v for k, v in weights.items() if not k.startswith("lm_head.")}
        mx.save_safetensors(str(work / "model.safetensors"), backbone, metadata={"format": "pt"})
        config = json.loads((chat / "config.json").read_text())
        _sentence_transformers(work, spec, config["hidden_size"])
        config = {**config, "architectures": [spec.architecture], "tie_word_embeddings": True}
        (work / "config.json").write_text(json.dumps(config, indent=1))  # last: marks it complete
    return out_dir


def _end_each_input(path: Path, token: str) -> None:
    """The tokenizer appends `token` to every input, as Qwen3-Embedding's does."""
    tokenizer = Tokenizer.from_file(str(path))
    tokenizer.post_processor = processors.TemplateProcessing(
        single=f"$A {token}", special_tokens=[(token, tokenizer.token_to_id(token))]
    )
    tokenizer.save(str(path))


def _sentence_transformers(folder: Path, spec: TinyEmbedding, hidden: int) -> None:
    """modules.json and each module's folder: Transformer, Pooling, the Dense ones, Normalize."""
    modules = [{"idx": 0, "name": "0", "path": "", "type": f"{ST}Transformer"}]
    pooling = {"word_embedding_dimension": hidden, f"pooling_mode_{spec.pooling}": True}
    _module(folder, modules, "Pooling", pooling)
    rng = np.random.default_rng(len(spec.dense))
    size = hidden
    for out in spec.dense:
        dense = {"in_features": size, "out_features": out, "bias": False,
                 "activation_function": "torch.nn.modules.linear.Identity"}
        path = _module(folder, modules, "Dense", dense)
        weight = rng.normal(0.0, 1.0 / np.sqrt(size), (out, size)).astype(np.float32)
        mx.save_safetensors(str(path / "model.safetensors"), {"linear.weight": mx.array(weight)})
        size = out
    _module(folder, modules, "Normalize", None)
    (folder / "modules.json").write_text(json.dumps(modules, indent=1))
    about = {"prompts": {"query": "", "document": ""}, "default_prompt_name": None, "similarity_fn_name": "cosine"}
    (folder / "config_sentence_transformers.json").write_text(json.dumps(about, indent=1))


def _module(folder: Path, modules: list[dict], kind: str, config: dict | None) -> Path:
    idx = len(modules)
    path = folder / f"{idx}_{kind}"
    path.mkdir()
    if config is not None:
        (path / "config.json").write_text(json.dumps(config, indent=1))
    modules.append({"idx": idx, "name": str(idx), "path": path.name, "type": f"{ST}{kind}"})
    return path

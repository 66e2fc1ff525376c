"""Whether a model folder holds an embedding model, and how it turns tokens into one vector.

Read from the folder alone (no MLX): sentence-transformers' `modules.json` (its Pooling,
Dense and Normalize modules, the pooling's `1_Pooling/config.json`),
`config_sentence_transformers.json`, and config.json's `architectures` (a bare backbone such
as `Gemma3TextModel` or `BertModel` has no language-model head). What this server computes
(embeddings/model.py): a decoder's hidden states through mlx-lm's own model class (Qwen3-Embedding:
causal attention, last-token pooling), or Gemma 3 as a bidirectional encoder (EmbeddingGemma:
mean pooling, dense layers); then L2 normalization where the folder asks for it.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

# sentence-transformers' pooling modes (1_Pooling/config.json's `pooling_mode_<mode>` flags)
POOLINGS = {"lasttoken": "lasttoken", "mean_tokens": "mean", "cls_token": "cls"}
# Backbones without a language-model head, published only as encoders.
ENCODER_ARCHITECTURES = {"Gemma3TextModel", "BertModel", "XLMRobertaModel", "ModernBertModel", "NomicBertModel"}
# Families served here: their mlx-lm class computes the hidden states. BERT-style encoders
# (bert, xlm-roberta, modernbert) have no mlx-lm class and are refused at start.
BIDIRECTIONAL = {"gemma3_text"}  # run with a bidirectional mask (EmbeddingGemma's use_bidirectional_attention)
# The output sizes a family was trained to be cut to (Matryoshka representation learning),
# from the model cards: Qwen3-Embedding any size from 32 up; EmbeddingGemma 768, 512, 256, 128.
MATRYOSHKA_MIN = {"qwen3": 32}
MATRYOSHKA_SIZES = {"gemma3_text": (128, 256, 512, 768)}


class NotEmbeddingModel(ValueError):
    """The folder is an embedding model this server cannot compute (the message says why)."""


@dataclass(frozen=True)
class EmbeddingLayout:
    """How a folder's model turns a sequence of tokens into one vector."""

    model_type: str  # mlx-lm's family
    bidirectional: bool  # every token sees every other (an encoder), else causal
    pooling: str  # "lasttoken", "mean" or "cls"
    dense: tuple[Path, ...]  # sentence-transformers Dense modules' folders, applied in order after pooling
    normalize: bool  # L2-normalized at the end
    dimensions: int  # the vector's size
    context_length: int

    def truncation(self, dimensions: int) -> str | None:
        """Why the vector cannot be cut to `dimensions` (OpenAI's `dimensions`), or None."""
        if dimensions == self.dimensions:
            return None
        if dimensions > self.dimensions:
            return f"at most {self.dimensions}"
        if (low := MATRYOSHKA_MIN.get(self.model_type)) is not None:
            return None if dimensions >= low else f"from {low} to {self.dimensions}"
        sizes = tuple(s for s in MATRYOSHKA_SIZES.get(self.model_type, ()) if s < self.dimensions)
        if dimensions in sizes:
            return None
        choices = ", ".join(map(str, (*sizes, self.dimensions)))
        return f"one of {choices}" if sizes else f"{self.dimensions}: this model was not trained to be truncated"


def is_embedding_model(path: Path) -> bool:
    """Whether the folder holds an embedding model rather than a chat model."""
    return _modules(path) is not None or (path / "config_sentence_transformers.json").is_file() or bool(
        ENCODER_ARCHITECTURES.intersection(_config(path).get("architectures") or ())
    )


def embedding_layout(path: Path) -> EmbeddingLayout:
    """The layout of an embedding model's folder; NotEmbeddingModel when this server cannot compute it."""
    config = _config(path)
    text = {**config, **(config.get("text_config") or {})}
    model_type = text.get("model_type", "")
    if model_type in ("bert", "xlm-roberta", "modernbert", "nomic_bert"):
        raise NotEmbeddingModel(
            f"a {model_type} encoder: mlx-lm has no class for it (served: Qwen3, Gemma 3 and other mlx-lm families)"
        )
    modules = _modules(path) or []
    kinds = {m.get("type", "").rsplit(".", 1)[-1]: m for m in modules}
    pooling = _pooling(path, kinds.get("Pooling"), model_type)
    bidirectional = bool(text.get("use_bidirectional_attention")) or model_type in BIDIRECTIONAL and _is_encoder(config)
    if bidirectional and model_type not in BIDIRECTIONAL:
        served = ", ".join(sorted(BIDIRECTIONAL))
        raise NotEmbeddingModel(f"a bidirectional {model_type} encoder: only {served} is served as one")
    if not bidirectional and pooling != "lasttoken" and pooling != "mean":
        raise NotEmbeddingModel(f"{pooling} pooling of a causal decoder (its first token sees nothing else)")
    dense = tuple(path / m["path"] for m in modules if m.get("type", "").endswith(".Dense"))
    dimensions = int(text["hidden_size"])
    for folder in dense:
        dimensions = int(json.loads((folder / "config.json").read_text())["out_features"])
    return EmbeddingLayout(
        model_type=model_type,
        bidirectional=bidirectional,
        pooling=pooling,
        dense=dense,
        normalize="Normalize" in kinds or not modules,  # a bare backbone: normalized, as served elsewhere
        dimensions=dimensions,
        context_length=int(text.get("max_position_embeddings") or 4096),
    )


def _config(path: Path) -> dict:
    try:
        return json.loads((path / "config.json").read_text())
    except (OSError, ValueError):
        return {}


def _is_encoder(config: dict) -> bool:
    return bool(ENCODER_ARCHITECTURES.intersection(config.get("architectures") or ()))


def _modules(path: Path) -> list[dict] | None:
    """sentence-transformers' modules.json, if it has a Pooling module (else it is not an embedder)."""
    try:
        modules = json.loads((path / "modules.json").read_text())
    except (OSError, ValueError):
        return None
    if not isinstance(modules, list) or not any(str(m.get("type", "")).endswith(".Pooling") for m in modules):
        return None
    return modules


def _pooling(path: Path, module: dict | None, model_type: str) -> str:
    """The Pooling module's mode; without one, last-token for a decoder and mean for an encoder."""
    if module is None:
        return "mean" if model_type in BIDIRECTIONAL else "lasttoken"
    config = json.loads((path / module["path"] / "config.json").read_text())
    modes = [mode for flag, mode in POOLINGS.items() if config.get(f"pooling_mode_{flag}")]
    others = [k for k, v in config.items() if k.startswith("pooling_mode_") and v and k[13:] not in POOLINGS]
    if len(modes) != 1 or others:
        named = ", ".join(others or modes) or "none"
        raise NotEmbeddingModel(f"its pooling ({named}) is not one of last-token, mean or CLS")
    return modes[0]

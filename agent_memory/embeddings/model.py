"""An embedding model's forward pass, on mlx-lm's own model classes (engine thread only).

The backbone is the family's mlx-lm class without its output head (`Backbone`): the weights
load as published (Qwen3-Embedding's and EmbeddingGemma's name no `model.` prefix and hold no
head; a folder converted by mlx-lm does), quantized ones too. A batch is padded on the right, so
that a token's position and what it attends to do not depend on the batch: a causal decoder's
tokens never see the padding after them, and an encoder's mask hides it; pooling reads only the
real tokens. Hence an input embedded alone or in a batch gives the same vector (within float
rounding of different matrix shapes).
"""

from __future__ import annotations

import importlib
import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import agent_memory.blas  # noqa: F401
import mlx.core as mx
import mlx.nn as nn
import numpy as np
from mlx_lm.utils import MODEL_REMAPPING
from mlx_lm.utils import load_model as load_weights

from agent_memory.models.embedding_layout import EmbeddingLayout

BATCH_TOKENS = 8192  # padded tokens per forward pass: a batch's activations stay small
PASS_INPUTS = 64  # sequences per forward pass


def _family(config: dict) -> tuple[type, type]:
    """mlx-lm's Model and ModelArgs classes for the folder's family, as `mlx_lm.load` picks them."""
    text = config.get("text_config") or config
    model_type = text["model_type"]
    module = importlib.import_module(f"mlx_lm.models.{MODEL_REMAPPING.get(model_type, model_type)}")
    return module.Model, module.ModelArgs


def _backbone_classes(config: dict) -> tuple[type, type]:
    model_class, args_class = _family(config)

    class Backbone(nn.Module):
        """The family's model without its head: `model` holds embed_tokens, layers and norm."""

        def __init__(self, args: Any) -> None:
            super().__init__()
            self.model = model_class(args).model

        def sanitize(self, weights: dict) -> dict:
            return {
                (name if name.startswith("model.") else f"model.{name}"): value
                for name, value in weights.items()
                if not name.startswith("lm_head.")
            }

    return Backbone, args_class


@dataclass
class EmbeddingModel:
    layout: EmbeddingLayout
    backbone: Any  # Backbone
    dense: list[nn.Linear]

    @classmethod
    def load(cls, path: Path, layout: EmbeddingLayout) -> EmbeddingModel:
        backbone, _ = load_weights(path, get_model_classes=_backbone_classes)
        return cls(layout, backbone, [_dense(folder) for folder in layout.dense])

    def embed(self, batch: list[list[int]]) -> np.ndarray:
        """One vector per sequence (float32, layout.dimensions wide), in one forward pass."""
        lengths = mx.array([len(tokens) for tokens in batch])
        width = max(len(tokens) for tokens in batch)
        inputs = mx.array([tokens + [0] * (width - len(tokens)) for tokens in batch])
        real = mx.arange(width)[None, :] < lengths[:, None]  # (batch, width): not padding
        hidden = self._encode(inputs, real) if self.layout.bidirectional else self.backbone.model(inputs)
        vectors = self._pool(hidden.astype(mx.float32), real, lengths)
        for dense in self.dense:
            vectors = dense(vectors.astype(dense.weight.dtype)).astype(mx.float32)
        if self.layout.normalize:
            vectors = normalized(vectors)
        mx.eval(vectors)
        return np.array(vectors)

    def _pool(self, hidden: mx.array, real: mx.array, lengths: mx.array) -> mx.array:
        if self.layout.pooling == "lasttoken":
            return mx.take_along_axis(hidden, (lengths - 1)[:, None, None], axis=1)[:, 0]
        if self.layout.pooling == "cls":
            return hidden[:, 0]
        weights = real[..., None].astype(hidden.dtype)
        return (hidden * weights).sum(axis=1) / lengths[:, None].astype(hidden.dtype)

    def _encode(self, inputs: mx.array, real: mx.array) -> mx.array:
        """Gemma 3 as a bidirectional encoder (EmbeddingGemma; transformers' use_bidirectional_attention):
        its global layers see every real token, its sliding ones those less than a window away on
        either side; padding is seen by none."""
        inner, args = self.backbone.model, self.backbone.model.args
        h = inner.embed_tokens(inputs)
        h = h * mx.array(args.hidden_size**0.5, mx.bfloat16).astype(h.dtype)
        positions = mx.arange(inputs.shape[1])
        near = mx.abs(positions[:, None] - positions[None, :]) < args.sliding_window
        seen = real[:, None, None, :]  # (batch, head, query, key)
        masks = {True: seen, False: seen & near[None, None]}
        for i, layer in enumerate(inner.layers):
            h = layer(h, masks[i % args.sliding_window_pattern == args.sliding_window_pattern - 1], None)
        return inner.norm(h)


def normalized(vectors: mx.array) -> mx.array:
    """Each row at unit length (L2), as sentence-transformers' Normalize module."""
    return vectors / mx.maximum(mx.linalg.norm(vectors, axis=-1, keepdims=True), 1e-12)


def _dense(folder: Path) -> nn.Linear:
    """A sentence-transformers Dense module: its config.json and `linear.weight`/`linear.bias`."""
    config = json.loads((folder / "config.json").read_text())
    activation = config.get("activation_function", "torch.nn.modules.linear.Identity")
    if not activation.endswith("Identity"):
        raise ValueError(f"{folder.name}: the activation {activation} is not served (only Identity)")
    weights = mx.load(str(folder / "model.safetensors"))
    layer = nn.Linear(int(config["in_features"]), int(config["out_features"]), bias=bool(config.get("bias", True)))
    layer.load_weights([(name.removeprefix("linear."), value) for name, value in weights.items()])
    mx.eval(layer.parameters())
    return layer


def batches(lengths: list[int]) -> list[list[int]]:
    """Indices of the inputs, shortest first, in groups of at most PASS_INPUTS whose padded size
    (count × the longest) stays within BATCH_TOKENS (a longer input alone)."""
    order = sorted(range(len(lengths)), key=lambda i: lengths[i])
    groups: list[list[int]] = []
    for i in order:
        group = groups[-1] if groups else None
        if group is not None and len(group) < PASS_INPUTS and (len(group) + 1) * lengths[i] <= BATCH_TOKENS:
            group.append(i)
        else:
            groups.append([i])
    return groups

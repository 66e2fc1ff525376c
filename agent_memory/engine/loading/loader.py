"""Load a model folder with mlx-lm and describe what the cache needs to know about it."""

from __future__ import annotations

import hashlib
import json
import logging
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import agent_memory.blas  # noqa: F401
from mlx_lm.models.cache import make_prompt_cache
from mlx_lm.utils import load_model as load_weights
from mlx_lm.utils import load_tokenizer
from tokenizers import Tokenizer

from agent_memory.chat.formats.reply import reply_format
from agent_memory.engine.distributed.group import GroupError, ShardLayout, agree_layout
from agent_memory.engine.kinds import registry
from agent_memory.engine.loading import sharding
from agent_memory.engine.loading.weights_files import weights_damage
from agent_memory.engine.protocol import ModelFacts
from agent_memory.vision.positions import Positions, install, self_check
from agent_memory.vision.prompt import VisionPrompt, vision_prompt
from agent_memory.vision.tower import Features, VisionTower, load_tower

log = logging.getLogger(__name__)

# What a request that omits them samples with, when the model folder's generation_config.json
# says (as vLLM applies them); other fields of that file are not sampling settings we take.
SAMPLING_DEFAULT_KEYS = {"temperature": float, "top_p": float, "top_k": int}

# Files whose bytes decide what KV a token sequence produces.
# A vision model's processor configs too: they decide what pixels an image's tokens are computed from.
FINGERPRINT_GLOBS = (
    "*.safetensors", "config.json", "tokenizer.json", "tokenizer_config.json", "*processor_config.json"
)


class UnsupportedModelError(RuntimeError):
    pass


@dataclass
class LoadedModel:
    name: str
    path: Path
    model: Any
    tokenizer: Any  # mlx-lm TokenizerWrapper, for the API's tokenizer thread
    decoder: Tokenizer  # an independent copy, for the engine thread's detokenizing
    reply_format: Any  # how it writes calls and reasoning (chat/formats/reply.py), probed once
    hidden_tokens: frozenset[int]  # special tokens left out of a reply's text (not its format's markers)
    context_length: int
    vocab_size: int  # the width of the model's logits (may exceed the tokenizer's vocabulary)
    # The most characters one token can stand for: a text of n characters is at least
    # n / max_token_chars tokens, a bound known before tokenizing it.
    max_token_chars: int
    num_layers: int
    fingerprint: str
    # Context length at which a token's attention costs as much as its matmuls:
    # recompute cost per token grows as 1 + position / attention_tokens.
    attention_tokens: float
    sampling_defaults: dict[str, float | int]  # generation_config.json's, for fields a request omits
    tower: VisionTower | None = None  # a vision model's vision half (vision/tower.py)
    positions: Positions | None = None  # where image sequences' rows sit (vision/positions.py); None: plain
    layouts: list[ShardLayout] | None = None  # split over processes: every rank's part, by rank (else None)


def hidden_tokens(tokenizer, reply) -> frozenset[int]:
    """The special tokens a reply's text leaves out: all but the markers of the model's reply
    format (harmony's channels, Mistral's [TOOL_CALLS]), which the API reads calls and
    reasoning from and the next turn's prompt holds again."""
    markers = set(reply.markers)
    added = tokenizer._tokenizer.added_tokens_decoder
    return frozenset(i for i, t in added.items() if t.special and t.content not in markers)


def sampling_defaults(path: Path) -> dict[str, float | int]:
    """The sampling defaults the model's publisher chose (generation_config.json); fields that
    are absent or not numbers are left to the server's own defaults."""
    try:
        config = json.loads((path / "generation_config.json").read_text())
    except (OSError, ValueError):
        return {}
    if not isinstance(config, dict):
        return {}
    return {
        key: kind(value)
        for key, kind in SAMPLING_DEFAULT_KEYS.items()
        if isinstance(value := config.get(key), (int, float)) and not isinstance(value, bool) and value >= 0
    }


def fingerprint(path: Path) -> str:
    """A digest of the weights, config and tokenizer: KV from another model never matches."""
    digest = hashlib.sha256()
    for pattern in FINGERPRINT_GLOBS:
        for file in sorted(path.glob(pattern)):
            digest.update(file.name.encode())
            with open(file, "rb") as f:
                digest.update(hashlib.file_digest(f, "sha256").digest())
    return digest.hexdigest()[:32]


def refusal(model) -> str | None:
    """Why this server cannot serve the model, or None: a cache of a kind it cannot keep
    (engine/kinds/registry.py)."""
    return registry.refusal(make_prompt_cache(model))


def served(path: Path) -> str | None:
    """`refusal` for a model folder, from its config and lazily mapped weights (nothing computed)."""
    model, _ = load_weights(path, lazy=True)
    return refusal(model)


@dataclass
class ModelText:
    """A model's side that needs no weights: its tokenizer, reply format and limits. Read once;
    a model loaded on demand (cli/serve.py) is described before its weights load."""

    name: str
    path: Path
    tokenizer: Any
    reply_format: Any
    hidden_tokens: frozenset[int]
    context_length: int
    vocab_size: int
    max_token_chars: int
    sampling_defaults: dict[str, float | int]
    config: dict  # config.json's text model part (a multimodal config's text_config merged in)
    vision: VisionPrompt | None = None  # a vision model's processor (vision/prompt.py); None: text only

    def facts(self, aliases: tuple[str, ...], default_max_tokens: int | None = None) -> ModelFacts:
        """What the API knows of the model (engine/protocol.py), served also as `aliases`, its
        requests that send no limit generating at most `default_max_tokens`."""
        return ModelFacts(
            name=self.name,
            ids=(self.name, *aliases),
            tokenizer=self.tokenizer,
            context_length=self.context_length,
            vocab_size=self.vocab_size,
            max_token_chars=self.max_token_chars,
            reply_format=self.reply_format,
            sampling_defaults=self.sampling_defaults,
            default_max_tokens=default_max_tokens,
            vision=self.vision,
        )


def describe_model(path: Path, name: str | None = None, model_defaults: bool = True) -> ModelText:
    """A model folder's tokenizer, reply format and limits; refused here already when this
    server cannot keep its caches (`served`)."""
    if not (path / "config.json").is_file():
        raise UnsupportedModelError(f"{path} is not a model folder (no config.json)")
    config = json.loads((path / "config.json").read_text())
    if why := weights_damage(path) or served(path):  # damage said in plain words, not mlx's
        raise UnsupportedModelError(f"{name or path.name}: {why}")
    text = {**config, **(config.get("text_config") or {})}  # multimodal configs nest the text model's
    tokenizer = load_tokenizer(path, eos_token_ids=config.get("eos_token_id"))
    reply = reply_format(tokenizer)
    return ModelText(
        name=name or path.name,
        path=path,
        tokenizer=tokenizer,
        reply_format=reply,
        hidden_tokens=hidden_tokens(tokenizer, reply),
        context_length=int(text.get("max_position_embeddings") or text.get("max_seq_len") or 4096),
        vocab_size=int(text["vocab_size"]),
        max_token_chars=max(len(t) for t in tokenizer.get_vocab()),
        sampling_defaults=sampling_defaults(path) if model_defaults else {},
        config=text,
        vision=vision_prompt(path, config),
    )


def draft_refusal(path: Path, described: ModelText) -> str | None:
    """Why the draft model cannot propose tokens for the described model, or None: it must be a
    model folder, keep a plain KV cache in every layer (rejected drafts are trimmed off it) and
    share the model's vocabulary (its tokens are the model's)."""
    if not (path / "config.json").is_file():
        return f"{path} is not a model folder (no config.json)"
    model, _ = load_weights(path, lazy=True)
    kinds = sorted({type(c).__name__ for c in make_prompt_cache(model)})
    if kinds != ["KVCache"]:
        return f"it keeps {', '.join(kinds)}; a draft model must keep plain KV caches, which drop rejected drafts"
    if load_tokenizer(path).get_vocab() != described.tokenizer.get_vocab():
        return f"its tokenizer's vocabulary is not {described.name}'s"
    return None


def load_draft(path: Path | None) -> Any:
    """The draft model's weights (--speculation draft; checked at start by `draft_refusal`), or
    None without one."""
    return load_weights(path)[0] if path is not None else None


def load_model(
    described: ModelText,
    fingerprint_known: str | None = None,
    features: Features | None = None,
    split: sharding.Split | None = None,
) -> LoadedModel:
    """The described model's weights, loaded (on the engine thread). `fingerprint_known`: the
    digest of its files from an earlier load, not hashed again (a reload after an unload);
    `features`: a vision model's kept image features (vision/tower.py); `split`: over the
    processes of a group, this rank's part only (engine/loading/sharding.py), the layout agreed. A
    vision model whose image tokens take 3-D positions gets its rope steered (vision/positions.py),
    or is refused here."""
    path, text = described.path, described.config
    digest = fingerprint_known or fingerprint(path)
    layouts = None
    if split is None:
        model, _ = load_weights(path)
    else:
        model, _ = load_weights(path, lazy=True)
        try:
            layouts = agree_layout(split.group, sharding.split(model, text, split, digest))
        except GroupError as e:  # another model on another rank: said in one line, as a refusal
            raise UnsupportedModelError(str(e)) from None
    positions = install(model, text) if described.vision and described.vision.merge else None
    if positions is not None and (why := self_check(model, positions)):
        raise UnsupportedModelError(f"{described.name}: its images cannot be placed: {why}")
    num_layers = len(model.layers)
    # Names differ by family (Mamba's num_heads, d_model); the estimate below only needs sizes.
    hidden = text.get("hidden_size") or text.get("d_model") or 1024
    heads = text.get("num_attention_heads") or text.get("num_heads") or 8
    kv_heads = text.get("num_key_value_heads") or heads
    head_dim = text.get("head_dim") or hidden // heads
    ffn = text.get("intermediate_size") or 4 * hidden
    matmul_params = num_layers * (2 * hidden * (heads + kv_heads) * head_dim + 3 * hidden * ffn)
    return LoadedModel(
        name=described.name,
        path=path,
        model=model,
        tokenizer=described.tokenizer,
        decoder=Tokenizer.from_str(described.tokenizer.backend_tokenizer.to_str()),
        reply_format=described.reply_format,
        hidden_tokens=described.hidden_tokens,
        context_length=described.context_length,
        vocab_size=described.vocab_size,
        max_token_chars=described.max_token_chars,
        num_layers=num_layers,
        fingerprint=digest,
        # Matmuls cost ~2 FLOP per weight per token; attention ~4 per query head dim per
        # layer per earlier token.
        attention_tokens=2 * matmul_params / (4 * num_layers * heads * head_dim),
        sampling_defaults=described.sampling_defaults,
        tower=load_tower(path, model, features or Features(0)) if described.vision else None,
        positions=positions,
        layouts=layouts,
    )

"""The tiny test models: deterministic random-weight models with a locally trained tokenizer.

Built offline in a few seconds, they let tests run the real engine on real MLX, and give users
filing bugs and benchmarks one recipe for a small model of any mlx-lm text family
(`build_tiny(dir, arch="gemma3_text")`, the table in tiny_archs.py). The default, "llama", is the
model the test suite has always used, byte for byte. The weights are scaled so that greedy
decoding is well separated (the top two logits differ by far more than batching noise) and
depends on context (outputs differ between prompts and do not repeat one token), which is what
tests comparing batched/cached/uncached outputs need.
"""

from __future__ import annotations

import contextlib
import functools
import importlib
import io
import json
import logging
import sysconfig
import zlib
from dataclasses import dataclass
from pathlib import Path

import agent_memory.blas  # noqa: F401
import mlx.core as mx
import numpy as np
from mlx.utils import tree_flatten, tree_unflatten
from tokenizers import AddedToken, Tokenizer, decoders, models, pre_tokenizers, trainers

from agent_memory.models.gguf import Progress
from agent_memory.models.folders import ModelError, building, complete
from agent_memory.models.tiny_archs import ARCHS, VOCAB_SIZE, TinyArch

log = logging.getLogger(__name__)

SPECIAL_TOKENS = ["<|endoftext|>", "<|im_start|>", "<|im_end|>"]
EOS = ("<|im_end|>", "<|endoftext|>")  # the default model's end-of-turn tokens
TRAINING_BYTES = 3 << 20
SEED = 1234  # the llama's; other families' seeds also hash their name (see _seed)
STAGE = "building the tiny model"
MAX_POSITIONS = 4096  # the tests' models: a context error is a few thousand tokens away
# What `models build-tiny` and `--model tiny` build for people: room for a coding agent's
# prompt and answer (Claude Code's prompt is 19-32k tokens of this tokenizer, Codex's 15k).
SERVING_CONTEXT = 65536
CHAT_TEMPLATE = (
    "{% for message in messages %}{% if loop.first and messages[0]['role'] != 'system' %}"
    "{{ '<|im_start|>system\\nYou are a helpful AI assistant.<|im_end|>\\n' }}{% endif %}"
    "{{'<|im_start|>' + message['role'] + '\\n' + message['content'] + '<|im_end|>' + '\\n'}}"
    "{% endfor %}{% if add_generation_prompt %}{{ '<|im_start|>assistant\\n' }}{% endif %}"
)
ARCHITECTURE = ARCHS["llama"].config  # the default tiny model's
# Init scales: unit-variance embeddings, projections a little above 1/sqrt(fan_in) so every
# layer changes the residual stream, and a sharp untied output head. Tied embeddings do not
# work for a random model: large ones make it echo its input (greedy repeats 4-7 tokens), small
# ones leave the top logits near-tied.
PROJECTION_GAIN = 1.5
HEAD_GAIN = 12.0
# quantize= -> (mode, group size, bits): mlx-lm's defaults for each mode, as `mlx_lm.convert -q` writes them
QUANTIZATIONS: dict[int | str, tuple[str, int, int]] = {
    4: ("affine", 64, 4),
    8: ("affine", 64, 8),
    "mxfp4": ("mxfp4", 32, 4),
}


class UnknownArchError(ModelError):
    """`arch` names no family of the table; the message lists them."""


@dataclass(frozen=True)
class ChatTemplate:
    """A real family's chat template and the tokens it writes, so a tiny model speaks that family's
    format: each marker becomes one token id, and `special`, `bos` and `eos` are special added tokens
    (dropped by decode(skip_special_tokens=True)) while `added` ones decode as text, as in the real
    tokenizer, which is what servers parsing tool calls and reasoning depend on."""

    text: str
    special: tuple[str, ...] = ()
    added: tuple[str, ...] = ()
    bos: str | None = None
    eos: tuple[str, ...] = ()  # the end-of-generation tokens; the first is the tokenizer's eos_token


def tiny_arch(arch: str) -> TinyArch:
    """The table entry for `arch`, or an error that lists the known ones."""
    if arch not in ARCHS:
        raise UnknownArchError(f"unknown arch {arch!r}; one of: {', '.join(sorted(ARCHS))}")
    return ARCHS[arch]


def build_tiny(
    out_dir: Path,
    *,
    arch: str = "llama",
    quantize: int | str | None = None,
    config: dict | None = None,
    template: ChatTemplate | None = None,
    progress: Progress | None = None,
) -> Path:
    """Build the model folder of `arch` (same bytes every time); an existing complete one is kept.

    `quantize` (4, 8 or "mxfp4", gpt-oss's format) quantizes it with mlx-lm's own quantize_model,
    so the folder looks like a converted model: packed weights, scales and the config's
    `quantization` block. `config`: fields changed in the (text) config, e.g. a wider or deeper
    model for a benchmark where computing a prompt must cost what it does in a real one. `template`:
    a real family's chat template and its tokens, in place of the default ChatML one."""
    spec = tiny_arch(arch)
    if quantize is not None and quantize not in QUANTIZATIONS:
        raise ModelError(f"quantize must be one of {', '.join(map(str, QUANTIZATIONS))}, not {quantize!r}")
    if complete(out_dir):
        _check_kept(out_dir, spec, quantize, template)
        return out_dir
    step = progress or (lambda *_: None)
    with building(out_dir) as work:
        step(STAGE, 0, 2)
        tokenizer = _tokenizer(template)
        tokenizer.save(str(work / "tokenizer.json"))
        step(STAGE, 1, 2)
        eos = [tokenizer.token_to_id(token) for token in _eos(template)]
        config = _config(spec, tokenizer.get_vocab_size(), eos, config or {})
        text_config = config.get("text_config", config)
        _write_tokenizer_config(work, template, text_config.get("max_position_embeddings", MAX_POSITIONS))
        weights = random_weights(config, _seed(arch), embed_std=spec.embed_std)
        if quantize:
            weights, config = _quantized(config, weights, quantize)
        mx.save_safetensors(str(work / "model.safetensors"), weights, metadata={"format": "mlx"})
        (work / "generation_config.json").write_text(json.dumps({"eos_token_id": eos}, indent=1))
        (work / "config.json").write_text(json.dumps(config, indent=1))  # last: marks it complete
    step(STAGE, 2, 2)
    log.info("built the tiny %s model in %s", arch, out_dir)
    return out_dir


def _check_kept(folder: Path, spec: TinyArch, quantize: int | str | None, template: ChatTemplate | None) -> None:
    """A finished folder is kept only if it holds the family, quantization and chat template asked
    for: one built with other arguments would otherwise be handed back as if it were the one asked for."""
    config = json.loads((folder / "config.json").read_text())
    kinds = (config.get("model_type"), config.get("text_config", {}).get("model_type"))
    wanted = (spec.model_type, spec.config.get("text_config", {}).get("model_type"))
    quantization = config.get("quantization")
    have = quantization and (quantization.get("mode", "affine"), quantization.get("bits"))
    mode, _, bits = QUANTIZATIONS.get(quantize, (None, None, None))
    if kinds != wanted or have != (quantize and (mode, bits)):
        held = "/".join(filter(None, kinds)) + (f", {have[1]}-bit {have[0]}" if have else ", not quantized")
        raise ModelError(f"{folder} already holds another model ({held}); build into another folder or delete it")
    chat_template = json.loads((folder / "tokenizer_config.json").read_text()).get("chat_template")
    added = json.loads((folder / "tokenizer.json").read_text())["added_tokens"]
    markers = {token["content"]: token["special"] for token in added}
    if chat_template != (template.text if template else CHAT_TEMPLATE) or markers != _markers(template):
        raise ModelError(f"{folder} already holds another chat template or its tokens; build into another folder")


def _config(spec: TinyArch, vocab_size: int, eos: list[int], changes: dict) -> dict:
    """The table's config with `changes` and the tokenizer's vocabulary (inside `text_config`
    where the family nests one, as mistral3 and qwen3_vl checkpoints do) and the end-of-turn tokens."""
    config = json.loads(json.dumps(spec.config))  # a deep copy: model args may edit what they are given
    if "text_config" in config:
        config["text_config"].update(changes, vocab_size=vocab_size)
        return {**config, "eos_token_id": eos}
    return {**config, **changes, "vocab_size": vocab_size, "eos_token_id": eos}


def _model(config: dict):
    """mlx-lm's own model class for the config, as `mlx_lm.load` picks it (model_type remapped)."""
    from mlx_lm.utils import MODEL_REMAPPING

    model_type = config["model_type"]
    module = importlib.import_module(f"mlx_lm.models.{MODEL_REMAPPING.get(model_type, model_type)}")
    return module.Model(module.ModelArgs.from_dict(json.loads(json.dumps(config))))


def _markers(template: ChatTemplate | None) -> dict[str, bool]:
    """The tokenizer's added tokens, each with whether it is special: the trained ones, then the template's."""
    markers = dict.fromkeys(SPECIAL_TOKENS, True)
    if template:
        for token in (*template.special, *([template.bos] if template.bos else []), *template.eos):
            markers.setdefault(token, True)
        for token in template.added:
            markers.setdefault(token, False)
    return markers


def _eos(template: ChatTemplate | None) -> tuple[str, ...]:
    """A template that names no end tokens keeps the default ones, which every tokenizer has."""
    return template.eos if template and template.eos else EOS


def _tokenizer(template: ChatTemplate | None) -> Tokenizer:
    """The trained tokenizer, with the template's markers added (to a copy: the trained one is cached)."""
    if template is None:
        return _train_tokenizer()
    tokenizer = Tokenizer.from_str(_train_tokenizer().to_str())
    new = [(token, special) for token, special in _markers(template).items() if token not in SPECIAL_TOKENS]
    tokenizer.add_special_tokens([AddedToken(t, special=True, normalized=False) for t, special in new if special])
    tokenizer.add_tokens([AddedToken(t, special=False, normalized=False) for t, special in new if not special])
    return tokenizer


@functools.cache
def _train_tokenizer() -> Tokenizer:
    """Trained once per process (deterministic, and shared by every family)."""
    tokenizer = Tokenizer(models.BPE())
    tokenizer.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tokenizer.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=VOCAB_SIZE,
        special_tokens=SPECIAL_TOKENS,
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tokenizer.train(_training_files(), trainer)
    return tokenizer


def _training_files() -> list[str]:
    """A fixed, sorted slice of the standard library's sources: local text, code and English."""
    stdlib = Path(sysconfig.get_paths()["stdlib"])
    files, total = [], 0
    for path in sorted(stdlib.glob("*.py")):
        files.append(str(path))
        total += path.stat().st_size
        if total > TRAINING_BYTES:
            break
    return files


def _write_tokenizer_config(folder: Path, template: ChatTemplate | None, context: int) -> None:
    bos, eos = (template.bos if template else None), _eos(template)[0]
    special = {"bos_token": bos, "eos_token": eos, "pad_token": "<|endoftext|>", "unk_token": "<|endoftext|>"}
    (folder / "special_tokens_map.json").write_text(json.dumps(special, indent=1))
    config = {
        **special,
        "tokenizer_class": "PreTrainedTokenizerFast",
        "chat_template": template.text if template else CHAT_TEMPLATE,
        "clean_up_tokenization_spaces": False,
        "model_max_length": context,  # else transformers warns of every longer prompt
    }
    (folder / "tokenizer_config.json").write_text(json.dumps(config, indent=1))


def _seed(arch: str) -> int:
    """Families whose parameters have the same names and shapes (mistral, qwen2 and llama at
    hidden 128) would otherwise get the same weights and answer alike, hiding which one a
    server really loaded."""
    return SEED if arch == "llama" else SEED + zlib.crc32(arch.encode())


def random_weights(config: dict, seed: int = SEED, *, embed_std: float = 1.0) -> dict[str, mx.array]:
    """Float32 weights for every parameter of the model, named as mlx-lm names them (which
    every family's `sanitize` loads unchanged), drawn in sorted-name order from one seed."""
    shapes = tree_flatten(_model(config).parameters())
    rng = np.random.default_rng(seed)
    return {
        name: mx.array(_initial(name, np.array(like), rng, embed_std).astype(np.float32))
        for name, like in sorted(shapes)
    }


def _initial(name: str, like: np.ndarray, rng: np.random.Generator, embed_std: float) -> np.ndarray:
    """One parameter's value. Matrices (projections, experts, convolutions, routers) are random;
    vectors keep the model's own initial values (norm weights, D, sinks, layer scalars), except
    biases (zero) and the state-space decay and step size, drawn as mamba initializes them so
    recurrent layers remember tens of tokens and the decoding depends on them."""
    if name.endswith("A_log"):
        return np.log(rng.uniform(1.0, 16.0, like.shape))
    if name.endswith("dt_bias"):
        step = np.exp(rng.uniform(np.log(1e-3), np.log(1e-1), like.shape))
        return step + np.log(-np.expm1(-step))  # softplus(dt_bias) == step
    if name.endswith("bias"):
        return np.zeros(like.shape)
    if like.ndim < 2:
        return like
    if "embed" in name:
        return rng.normal(0.0, embed_std, like.shape)
    fan_in = int(np.prod(like.shape[1:])) if "conv" in name else like.shape[-1]
    gain = HEAD_GAIN if name.endswith("lm_head.weight") else PROJECTION_GAIN
    return rng.normal(0.0, gain / np.sqrt(fan_in), like.shape)


def _quantized(config: dict, weights: dict[str, mx.array], quantize: int | str) -> tuple[dict[str, mx.array], dict]:
    """Quantize as `mlx_lm.convert -q` does (the model's own quant_predicate picks what stays
    in full precision or 8 bits, e.g. MoE routers); returns the weights and the config with its
    `quantization` block."""
    from mlx_lm.utils import quantize_model

    mode, group_size, bits = QUANTIZATIONS[quantize]
    model = _model(config)
    model.update(tree_unflatten(list(weights.items())))
    with contextlib.redirect_stdout(io.StringIO()):  # it prints the bits per weight
        model, config = quantize_model(model, config, group_size, bits, mode=mode)
    return dict(sorted(tree_flatten(model.parameters()))), config

"""The tiny test model: a deterministic random-weight llama with a locally trained tokenizer.

Built offline in a few seconds, it lets tests run the real engine on real MLX. The weights are
scaled so that greedy decoding is well separated (the top two logits differ by far more than
batching noise) and depends on context (outputs differ between prompts and do not repeat one
token), which is what tests comparing batched/cached/uncached outputs need.
"""

from __future__ import annotations

import json
import logging
import sysconfig
import tempfile
from pathlib import Path

import agent_memory.blas  # noqa: F401
import mlx.core as mx
import numpy as np
from mlx.utils import tree_flatten
from mlx_lm.models import llama
from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

from agent_memory.models.gguf import Progress
from agent_memory.models.registry import complete, move_into_place

log = logging.getLogger(__name__)

SPECIAL_TOKENS = ["<|endoftext|>", "<|im_start|>", "<|im_end|>"]
VOCAB_SIZE = 2048
TRAINING_BYTES = 3 << 20
SEED = 1234
STAGE = "building the tiny model"
CHAT_TEMPLATE = (
    "{% for message in messages %}{% if loop.first and messages[0]['role'] != 'system' %}"
    "{{ '<|im_start|>system\\nYou are a helpful AI assistant.<|im_end|>\\n' }}{% endif %}"
    "{{'<|im_start|>' + message['role'] + '\\n' + message['content'] + '<|im_end|>' + '\\n'}}"
    "{% endfor %}{% if add_generation_prompt %}{{ '<|im_start|>assistant\\n' }}{% endif %}"
)
ARCHITECTURE = {
    "model_type": "llama",
    "hidden_size": 256,
    "num_hidden_layers": 4,
    "intermediate_size": 512,
    "num_attention_heads": 4,
    "num_key_value_heads": 2,
    "head_dim": 64,
    "rms_norm_eps": 1e-5,
    "rope_theta": 10000.0,
    "max_position_embeddings": 4096,
    "tie_word_embeddings": False,
}
# Init scales: unit-variance embeddings, projections a little above 1/sqrt(fan_in) so every
# layer changes the residual stream, and a sharp untied output head. Tied embeddings do not
# work for a random model: large ones make it echo its input (greedy repeats 4-7 tokens), small
# ones leave the top logits near-tied.
PROJECTION_GAIN = 1.5
HEAD_GAIN = 12.0


def build_tiny(out_dir: Path, *, progress: Progress | None = None) -> Path:
    """Build the model folder (same bytes every time); an existing complete one is kept."""
    if complete(out_dir):
        return out_dir
    out_dir.parent.mkdir(parents=True, exist_ok=True)
    step = progress or (lambda *_: None)
    with tempfile.TemporaryDirectory(dir=out_dir.parent, prefix=f".{out_dir.name}-") as tmp:
        work = Path(tmp) / "model"
        work.mkdir()
        step(STAGE, 0, 2)
        tokenizer = _train_tokenizer()
        tokenizer.save(str(work / "tokenizer.json"))
        _write_tokenizer_config(work)
        step(STAGE, 1, 2)
        eos = [tokenizer.token_to_id("<|im_end|>"), tokenizer.token_to_id("<|endoftext|>")]
        config = {**ARCHITECTURE, "vocab_size": tokenizer.get_vocab_size(), "eos_token_id": eos}
        mx.save_safetensors(str(work / "model.safetensors"), _random_weights(config), metadata={"format": "mlx"})
        (work / "generation_config.json").write_text(json.dumps({"eos_token_id": eos}, indent=1))
        (work / "config.json").write_text(json.dumps(config, indent=1))  # last: marks it complete
        move_into_place(work, out_dir)
        step(STAGE, 2, 2)
    log.info("built the tiny model in %s", out_dir)
    return out_dir


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


def _train_tokenizer() -> Tokenizer:
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


def _write_tokenizer_config(folder: Path) -> None:
    special = {"bos_token": None, "eos_token": "<|im_end|>", "pad_token": "<|endoftext|>", "unk_token": "<|endoftext|>"}
    (folder / "special_tokens_map.json").write_text(json.dumps(special, indent=1))
    config = {
        **special,
        "tokenizer_class": "PreTrainedTokenizerFast",
        "chat_template": CHAT_TEMPLATE,
        "clean_up_tokenization_spaces": False,
        "model_max_length": ARCHITECTURE["max_position_embeddings"],
    }
    (folder / "tokenizer_config.json").write_text(json.dumps(config, indent=1))


def _random_weights(config: dict) -> dict[str, mx.array]:
    shapes = tree_flatten(llama.Model(llama.ModelArgs.from_dict(config)).parameters())
    rng = np.random.default_rng(SEED)
    weights = {}
    for name, like in sorted(shapes):
        if name.endswith("norm.weight"):
            value = np.ones(like.shape, np.float32)
        elif "embed_tokens" in name:
            value = rng.normal(0.0, 1.0, like.shape)
        else:
            gain = HEAD_GAIN if name == "lm_head.weight" else PROJECTION_GAIN
            value = rng.normal(0.0, gain / np.sqrt(like.shape[1]), like.shape)
        weights[name] = mx.array(value.astype(np.float32))
    return weights

"""Convert a llama-architecture GGUF (the demo model's Q4_1 file) into an mlx-lm model folder.

`mx.load` reads GGUF quantized tensors as MLX affine (weight, scales, biases) triples in groups
of 32 (Q4_1 as 4 bits, Q8_0 as 8 bits). We map llama.cpp's tensor names back to Hugging
Face's, undo the row permutation llama.cpp applies to the q/k projections, and rebuild the
tokenizer and chat template from the GGUF metadata with the `tokenizers` library, so
`mlx_lm.load` needs nothing from a hub.
"""

from __future__ import annotations

import json
import logging
from collections.abc import Callable
from pathlib import Path

import agent_memory.blas  # noqa: F401
import mlx.core as mx
from tokenizers import AddedToken, Tokenizer, decoders, models, pre_tokenizers

log = logging.getLogger(__name__)

Progress = Callable[[str, int, int], None]

LAYER_NAMES = {
    "attn_q": "self_attn.q_proj",
    "attn_k": "self_attn.k_proj",
    "attn_v": "self_attn.v_proj",
    "attn_output": "self_attn.o_proj",
    "ffn_gate": "mlp.gate_proj",
    "ffn_up": "mlp.up_proj",
    "ffn_down": "mlp.down_proj",
    "attn_norm": "input_layernorm",
    "ffn_norm": "post_attention_layernorm",
}
CONTROL_TOKEN = 3  # llama.cpp's token type for special tokens
GGUF_BLOCK = 32  # Q4_0, Q4_1 and Q8_0 quantize in blocks of 32: MLX's group size
DEFAULT_BITS = 4  # Q4_1; modules with other bits (the Q8_0 embedding) get their own entry


def _int(meta: dict, key: str) -> int:
    return int(meta[key].item())


def _float(meta: dict, key: str) -> float:
    """GGUF stores float32: 1e-5 reads back as 9.9999997e-06; keep float32's precision only."""
    return float(f"{meta[key].item():.7g}")


def _hf_name(gguf_name: str) -> str:
    if gguf_name == "token_embd":
        return "model.embed_tokens"
    if gguf_name == "output_norm":
        return "model.norm"
    if gguf_name == "output":
        return "lm_head"
    blk, layer, part = gguf_name.split(".", 2)
    if blk != "blk" or part not in LAYER_NAMES:
        raise ValueError(f"unexpected GGUF tensor {gguf_name!r}")
    return f"model.layers.{layer}.{LAYER_NAMES[part]}"


def _unpermute(w: mx.array, heads: int) -> mx.array:
    """Invert llama.cpp's q/k permutation, which stores each head's rows as interleaved rotary
    pairs (d/2, 2); mlx-lm's RoPE expects Hugging Face's two halves one after the other (2, d/2).
    Only rows move, so this works on packed weights, scales and biases alike."""
    rows = w.shape[0]
    return w.reshape(heads, rows // heads // 2, 2, *w.shape[1:]).swapaxes(1, 2).reshape(w.shape)


def _bits(parts: dict[str, mx.array]) -> int:
    """Each group of 32 values packs into `bits` uint32 words."""
    return parts["weight"].shape[-1] * 32 // (parts["scales"].shape[-1] * GGUF_BLOCK)


def _config(meta: dict, tied: bool) -> dict:
    if meta.get("general.architecture") != "llama":
        raise ValueError(f"only llama GGUF files are supported, not {meta.get('general.architecture')!r}")
    return {
        "model_type": "llama",
        "architectures": ["LlamaForCausalLM"],
        "hidden_size": _int(meta, "llama.embedding_length"),
        "intermediate_size": _int(meta, "llama.feed_forward_length"),
        "num_hidden_layers": _int(meta, "llama.block_count"),
        "num_attention_heads": _int(meta, "llama.attention.head_count"),
        "num_key_value_heads": _int(meta, "llama.attention.head_count_kv"),
        "head_dim": _int(meta, "llama.rope.dimension_count"),
        "max_position_embeddings": _int(meta, "llama.context_length"),
        "rms_norm_eps": _float(meta, "llama.attention.layer_norm_rms_epsilon"),
        "rope_theta": _float(meta, "llama.rope.freq_base"),
        "vocab_size": len(meta["tokenizer.ggml.tokens"]),
        "tie_word_embeddings": tied,
        "hidden_act": "silu",
        "bos_token_id": _int(meta, "tokenizer.ggml.bos_token_id"),
        "eos_token_id": _int(meta, "tokenizer.ggml.eos_token_id"),
        "torch_dtype": "float32",
    }


def convert_gguf(
    gguf_path: Path, out_dir: Path, *, keep_quantized: bool = False, progress: Progress | None = None
) -> None:
    """Write an mlx-lm folder; float32 by default, since that is what decodes fast on a CPU."""
    weights, meta = mx.load(str(gguf_path), return_metadata=True)
    config = _config(meta, tied="output.weight" not in weights)
    heads = {"attn_q": config["num_attention_heads"], "attn_k": config["num_key_value_heads"]}
    out_dir.mkdir(parents=True, exist_ok=True)
    (out_dir / "config.json").unlink(missing_ok=True)  # written last: marks the folder complete
    bases = sorted({k.rsplit(".", 1)[0] for k in weights})
    out: dict[str, mx.array] = {}
    quantization: dict = {"group_size": GGUF_BLOCK, "bits": DEFAULT_BITS}
    for i, base in enumerate(bases):
        name = _hf_name(base)
        parts = {s: weights[f"{base}.{s}"] for s in ("weight", "scales", "biases") if f"{base}.{s}" in weights}
        kind = base.rsplit(".", 1)[-1]
        if kind in heads:
            parts = {s: _unpermute(a, heads[kind]) for s, a in parts.items()}
        if "scales" not in parts:
            converted = {f"{name}.weight": parts["weight"].astype(mx.float32)}
        elif keep_quantized:
            converted = {f"{name}.{s}": a for s, a in parts.items()}
            if _bits(parts) != DEFAULT_BITS:
                quantization[name] = {"group_size": GGUF_BLOCK, "bits": _bits(parts)}
        else:
            scales, biases = (parts[s].astype(mx.float32) for s in ("scales", "biases"))
            dense = mx.dequantize(parts["weight"], scales, biases, GGUF_BLOCK, _bits(parts))
            converted = {f"{name}.weight": dense}
        mx.eval(converted)
        out.update(converted)
        if progress:
            progress("converting weights", i + 1, len(bases))
    if keep_quantized:
        config["quantization"] = quantization
    mx.save_safetensors(str(out_dir / "model.safetensors"), out, metadata={"format": "mlx"})
    _write_tokenizer(meta, out_dir)
    generation = {"bos_token_id": config["bos_token_id"], "eos_token_id": config["eos_token_id"]}
    (out_dir / "generation_config.json").write_text(json.dumps(generation, indent=1))
    (out_dir / "config.json").write_text(json.dumps(config, indent=1))
    log.info("converted %s into %s (%d tensors)", gguf_path.name, out_dir, len(out))


def _write_tokenizer(meta: dict, out_dir: Path) -> None:
    """GPT-2 style byte-level BPE with single digits, as llama.cpp's 'smollm' pre-tokenizer."""
    if meta.get("tokenizer.ggml.model") != "gpt2":
        raise ValueError(f"only byte-level BPE tokenizers are supported, not {meta.get('tokenizer.ggml.model')!r}")
    tokens = meta["tokenizer.ggml.tokens"]
    types = meta["tokenizer.ggml.token_type"].tolist()
    merges = [tuple(m.split(" ", 1)) for m in meta["tokenizer.ggml.merges"]]
    tokenizer = Tokenizer(models.BPE(vocab={t: i for i, t in enumerate(tokens)}, merges=merges))
    tokenizer.pre_tokenizer = pre_tokenizers.Sequence(
        [pre_tokenizers.Digits(individual_digits=True), pre_tokenizers.ByteLevel(add_prefix_space=False)]
    )
    tokenizer.decoder = decoders.ByteLevel()
    special_tokens = [t for t, kind in zip(tokens, types) if kind == CONTROL_TOKEN]
    tokenizer.add_special_tokens([AddedToken(t, special=True, normalized=False) for t in special_tokens])
    tokenizer.save(str(out_dir / "tokenizer.json"))

    def token(key: str) -> str | None:
        return tokens[_int(meta, key)] if key in meta else None

    special = {
        "bos_token": token("tokenizer.ggml.bos_token_id"),
        "eos_token": token("tokenizer.ggml.eos_token_id"),
        "pad_token": token("tokenizer.ggml.padding_token_id"),
        "unk_token": token("tokenizer.ggml.unknown_token_id"),
    }
    (out_dir / "special_tokens_map.json").write_text(json.dumps(special, indent=1))
    tokenizer_config = {
        **special,
        "tokenizer_class": "PreTrainedTokenizerFast",
        "chat_template": meta["tokenizer.chat_template"],
        "add_bos_token": bool(meta["tokenizer.ggml.add_bos_token"].item()),
        "clean_up_tokenization_spaces": False,
        "model_max_length": _int(meta, "llama.context_length"),
    }
    (out_dir / "tokenizer_config.json").write_text(json.dumps(tokenizer_config, indent=1))

"""Convert a llama-architecture GGUF (the demo model's Q4_1 file) into an mlx-lm model folder.

`mx.load` reads GGUF quantized tensors as MLX affine (weight, scales, biases) triples. We map
llama.cpp's tensor names back to Hugging Face's, undo the row permutation llama.cpp applies to
the q/k projections (it stores rotary pairs interleaved), and rebuild the tokenizer and chat
template from the GGUF metadata with the `tokenizers` library, so `mlx_lm.load` needs nothing
from a hub.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path

import agent_memory.blas  # noqa: F401
import mlx.core as mx
from tokenizers import AddedToken, Tokenizer, decoders, models, pre_tokenizers

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
CONTROL_TOKEN = 3  # llama.cpp token type of special tokens
GGUF_BLOCK = 32  # Q4_0, Q4_1 and Q8_0 quantize in blocks of 32: MLX's group size


def _int(meta: dict, key: str) -> int:
    return int(meta[key].item())


def _hf_name(gguf_name: str) -> str:
    if gguf_name == "token_embd":
        return "model.embed_tokens"
    if gguf_name == "output_norm":
        return "model.norm"
    if gguf_name == "output":
        return "lm_head"
    _, layer, part = gguf_name.split(".", 2)
    return f"model.layers.{layer}.{LAYER_NAMES[part]}"


def _unpermute(w: mx.array, heads: int) -> mx.array:
    """llama.cpp stores each head's q/k rows as interleaved rotary pairs (d/2, 2); Hugging
    Face's layout, which mlx-lm's RoPE expects, is the two halves one after the other (2, d/2)."""
    rows = w.shape[0]
    return w.reshape(heads, rows // heads // 2, 2, *w.shape[1:]).swapaxes(1, 2).reshape(w.shape)


def convert_gguf(gguf_path: Path, out_dir: Path, *, keep_quantized: bool = False, progress: Progress | None = None) -> None:
    weights, meta = mx.load(str(gguf_path), return_metadata=True)
    if meta.get("general.architecture") != "llama":
        raise ValueError(f"{gguf_path.name}: only llama GGUF files are supported")
    heads, kv_heads = _int(meta, "llama.attention.head_count"), _int(meta, "llama.attention.head_count_kv")
    config = {
        "model_type": "llama",
        "architectures": ["LlamaForCausalLM"],
        "hidden_size": _int(meta, "llama.embedding_length"),
        "intermediate_size": _int(meta, "llama.feed_forward_length"),
        "num_hidden_layers": _int(meta, "llama.block_count"),
        "num_attention_heads": heads,
        "num_key_value_heads": kv_heads,
        "head_dim": _int(meta, "llama.rope.dimension_count"),
        "max_position_embeddings": _int(meta, "llama.context_length"),
        "rms_norm_eps": float(meta["llama.attention.layer_norm_rms_epsilon"].item()),
        "rope_theta": float(meta["llama.rope.freq_base"].item()),
        "vocab_size": len(meta["tokenizer.ggml.tokens"]),
        "tie_word_embeddings": "output.weight" not in weights,
        "hidden_act": "silu",
        "bos_token_id": _int(meta, "tokenizer.ggml.bos_token_id"),
        "eos_token_id": _int(meta, "tokenizer.ggml.eos_token_id"),
        "torch_dtype": "float32",
    }
    bases = sorted({k.rsplit(".", 1)[0] for k in weights})
    out: dict[str, mx.array] = {}
    quantization: dict = {}
    for i, base in enumerate(bases):
        name = _hf_name(base)
        w = weights[f"{base}.weight"]
        if f"{base}.scales" in weights:
            scales, biases = weights[f"{base}.scales"], weights[f"{base}.biases"]
            group = GGUF_BLOCK
            bits = w.shape[-1] // scales.shape[-1]  # packed uint32s per group of 32 = bits
            dense = mx.dequantize(w, scales, biases, group_size=group, bits=bits).astype(mx.float32)
            if base.endswith(("attn_q", "attn_k")):
                dense = _unpermute(dense, heads if base.endswith("attn_q") else kv_heads)
            if keep_quantized:
                packed = mx.quantize(dense, group_size=group, bits=bits)
                out.update(zip((f"{name}.weight", f"{name}.scales", f"{name}.biases"), packed))
                quantization[name] = {"group_size": group, "bits": bits}
            else:
                out[f"{name}.weight"] = dense
        else:
            out[f"{name}.weight"] = w.astype(mx.float32)
        mx.eval(list(out.values())[-3:])
        if progress:
            progress("converting weights", i + 1, len(bases))
    if keep_quantized:
        config["quantization"] = {"group_size": GGUF_BLOCK, "bits": 4, **quantization}
    out_dir.mkdir(parents=True, exist_ok=True)
    mx.save_safetensors(str(out_dir / "model.safetensors"), out, metadata={"format": "mlx"})
    _write_tokenizer(meta, out_dir)
    (out_dir / "generation_config.json").write_text(
        json.dumps({"bos_token_id": config["bos_token_id"], "eos_token_id": config["eos_token_id"]}, indent=1)
    )
    (out_dir / "config.json").write_text(json.dumps(config, indent=1))  # last: marks the folder complete


def _write_tokenizer(meta: dict, out_dir: Path) -> None:
    tokens = meta["tokenizer.ggml.tokens"]
    types = meta["tokenizer.ggml.token_type"].tolist()
    merges = [tuple(m.split(" ", 1)) for m in meta["tokenizer.ggml.merges"]]
    tokenizer = Tokenizer(models.BPE(vocab={t: i for i, t in enumerate(tokens)}, merges=merges))
    tokenizer.pre_tokenizer = pre_tokenizers.Sequence(
        [pre_tokenizers.Digits(individual_digits=True), pre_tokenizers.ByteLevel(add_prefix_space=False)]
    )
    tokenizer.decoder = decoders.ByteLevel()
    tokenizer.add_special_tokens([AddedToken(t, special=True, normalized=False) for t, k in zip(tokens, types) if k == CONTROL_TOKEN])
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
    (out_dir / "tokenizer_config.json").write_text(
        json.dumps(
            {
                **special,
                "tokenizer_class": "PreTrainedTokenizerFast",
                "chat_template": meta["tokenizer.chat_template"],
                "add_bos_token": bool(meta["tokenizer.ggml.add_bos_token"].item()),
                "clean_up_tokenization_spaces": False,
                "model_max_length": _int(meta, "llama.context_length"),
            },
            indent=1,
        )
    )

"""One small config per mlx-lm text family, for `build_tiny(arch=...)` (models/tiny.py).

Each entry is the config.json a real checkpoint of that family would have, shrunk: 4 layers
(enough to show the family's layer kinds: hybrids have recurrent and attention layers,
sliding-window families a window of 32 and a full-attention layer), hidden size 128, 2-4 small
experts for MoE families, and an untied output head wherever the family allows one (a random
model with tied embeddings tends to echo its input). Neutral values stand in for the real
multipliers (Granite's, Falcon-H1's µP ones), which the random weights do not need. `caches` is
what the model's own `make_cache` (through mlx-lm's `make_prompt_cache`) gives, one class name
per cache, so the table documents each family's layer kinds and tests/test_tiny_archs.py checks
it against mlx-lm.

The vocabulary size is not written here: the builder sets `vocab_size` (in `text_config` when
the family nests one) from the shared trained tokenizer, which has VOCAB_SIZE tokens.
"""

from __future__ import annotations

from dataclasses import dataclass

VOCAB_SIZE = 2048


@dataclass(frozen=True)
class TinyArch:
    """One family's tiny model: what to build and what mlx-lm must make of it."""

    config: dict
    caches: tuple[str, ...]  # class names of make_prompt_cache(model), in order
    about: str  # the real models of the family, and what the tiny one shows of it
    # Embeddings' standard deviation: below 1 where the embeddings would otherwise dominate the
    # residual stream (tied ones, or scaled up by the model) and greedy decoding repeats itself.
    embed_std: float = 1.0

    @property
    def model_type(self) -> str:
        return self.config["model_type"]


KV, ROT, ARR, LST, CHK = "KVCache", "RotatingKVCache", "ArraysCache", "CacheList", "ChunkedKVCache"
WINDOW = 32  # a sliding window's tokens, and a chunked-attention layer's chunk
# Gemma multiplies its embeddings by sqrt(hidden size): at unit variance they would swamp every
# layer's output in the residual stream (and greedy decoding would cycle through a few tokens).
GEMMA_EMBED_STD = 128**-0.5

# The shared shape of the attention layers; families override what they name differently.
_ATTENTION = {
    "hidden_size": 128,
    "num_hidden_layers": 4,
    "intermediate_size": 256,
    "num_attention_heads": 4,
    "num_key_value_heads": 2,
    "head_dim": 32,
    "rms_norm_eps": 1e-5,
    "rope_theta": 10000.0,
    "max_position_embeddings": 4096,
    "tie_word_embeddings": False,
}
_DELTA = {  # Qwen3.5 / Qwen3-Next gated delta-net layers
    "linear_num_value_heads": 4,
    "linear_num_key_heads": 2,
    "linear_key_head_dim": 32,
    "linear_value_head_dim": 32,
    "linear_conv_kernel_dim": 4,
    "full_attention_interval": 4,
}
_MLA = {  # DeepSeek-V3's multi-head latent attention, and its MoE
    **_ATTENTION,
    "num_key_value_heads": 4,
    "moe_intermediate_size": 64,
    "n_shared_experts": 1,
    "n_routed_experts": 4,
    "num_experts_per_tok": 2,
    "routed_scaling_factor": 1.0,
    "kv_lora_rank": 64,
    "q_lora_rank": 96,
    "qk_rope_head_dim": 16,
    "qk_nope_head_dim": 32,
    "v_head_dim": 32,
    "topk_method": "noaux_tc",
    "scoring_func": "sigmoid",
    "norm_topk_prob": True,
    "n_group": 1,
    "topk_group": 1,
    "moe_layer_freq": 1,
    "first_k_dense_replace": 1,
    "attention_bias": False,
}
_DSA = {"index_head_dim": 32, "index_n_heads": 4, "index_topk": 16}  # DeepSeek sparse attention's indexer
_MAMBA2 = {"mamba_n_heads": 8, "mamba_d_head": 32, "mamba_d_state": 16, "mamba_d_conv": 4, "mamba_n_groups": 1}
_LLAMA_256 = {  # the original tiny model: its config must not change (tests depend on its outputs)
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

ARCHS: dict[str, TinyArch] = {
    "llama": TinyArch(_LLAMA_256, (KV,) * 4, "Llama 3 and the original tiny test model (hidden 256)"),
    "mistral": TinyArch(
        {"model_type": "mistral", **_ATTENTION, "sliding_window": None}, (KV,) * 4, "Mistral 7B: llama layers"
    ),
    "qwen2": TinyArch({"model_type": "qwen2", **_ATTENTION}, (KV,) * 4, "Qwen2/2.5: q/k/v biases"),
    "qwen3": TinyArch({"model_type": "qwen3", **_ATTENTION}, (KV,) * 4, "Qwen3: q/k norms"),
    "phi3": TinyArch(  # transformers' default pad_token_id (32000) is outside the vocabulary
        {"model_type": "phi3", **_ATTENTION, "pad_token_id": 0}, (KV,) * 4, "Phi-3/4: fused qkv and gate_up"
    ),
    "olmo3": TinyArch(
        {"model_type": "olmo3", **_ATTENTION, "sliding_window": WINDOW},
        (ROT, ROT, ROT, KV),
        "Olmo 3: three sliding-window layers to one full",
    ),
    "exaone4": TinyArch(
        {"model_type": "exaone4", **_ATTENTION, "rope_scaling": None, "sliding_window": WINDOW,
         "sliding_window_pattern": "LLLG",
         "layer_types": ["sliding_attention"] * 3 + ["full_attention"]},  # transformers' config needs them
        (ROT, ROT, ROT, KV),
        "EXAONE 4: local (LLL) and global (G) layers, q/k norms after the residual",
    ),
    "gemma3_text": TinyArch(
        {"model_type": "gemma3_text", **_ATTENTION, "query_pre_attn_scalar": 32, "rope_local_base_freq": 10000.0,
         "sliding_window": WINDOW, "sliding_window_pattern": 4},
        (ROT, ROT, ROT, KV),
        "Gemma 3 (text): sliding-window layers and one global, an untied head",
        embed_std=GEMMA_EMBED_STD,
    ),
    "gemma4_text": TinyArch(
        {"model_type": "gemma4_text", **_ATTENTION, "num_key_value_heads": 1, "global_head_dim": 64,
         "layer_types": ["sliding_attention", "full_attention", "sliding_attention", "full_attention"],
         "sliding_window": WINDOW, "num_kv_shared_layers": 2, "hidden_size_per_layer_input": 16,
         "vocab_size_per_layer_input": VOCAB_SIZE},
        (ROT, KV),
        "Gemma 4 E2B/E4B: per-layer inputs, the last 2 layers reuse earlier layers' K/V (no cache of their own)",
        embed_std=GEMMA_EMBED_STD,
    ),
    "cohere2": TinyArch(
        {"model_type": "cohere2", **_ATTENTION, "layer_norm_eps": 1e-5, "logit_scale": 4.0,
         "sliding_window": WINDOW, "sliding_window_pattern": 4},
        (ROT, ROT, ROT, KV),
        "Command R7B / Command A: sliding layers and one global without rope; tied embeddings",
        embed_std=0.25,
    ),
    "gpt_oss": TinyArch(
        {"model_type": "gpt_oss", **_ATTENTION, "intermediate_size": 128, "num_local_experts": 4,
         "num_experts_per_tok": 2, "sliding_window": WINDOW,
         "layer_types": ["sliding_attention", "full_attention"] * 2},
        (ROT, KV, ROT, KV),
        "gpt-oss: alternating sliding/full attention with sinks, 4 experts",
    ),
    "glm4_moe": TinyArch(
        {"model_type": "glm4_moe", **_ATTENTION, "moe_intermediate_size": 64, "norm_topk_prob": True, "n_group": 1,
         "topk_group": 1, "n_shared_experts": 1, "n_routed_experts": 4, "routed_scaling_factor": 1.0,
         "num_experts_per_tok": 2, "first_k_dense_replace": 1, "rope_scaling": None, "use_qk_norm": True,
         "attention_bias": True, "partial_rotary_factor": 0.5},
        (KV,) * 4,
        "GLM-4.5/4.6: a dense first layer, then 4 routed experts and a shared one",
    ),
    "deepseek_v3": TinyArch(
        {"model_type": "deepseek_v3", **_MLA}, (KV,) * 4, "DeepSeek-V3/R1, Kimi K2: MLA and a dense first layer"
    ),
    "deepseek_v32": TinyArch(
        {"model_type": "deepseek_v32", **_MLA, **_DSA},
        (LST,) * 4,
        "DeepSeek-V3.2: MLA with the sparse-attention indexer (each layer caches its KV and the indexer's keys)",
    ),
    "glm_moe_dsa": TinyArch(
        {"model_type": "glm_moe_dsa", **_MLA, **_DSA,
         "rope_parameters": {"rope_theta": 10000.0, "rope_type": "default"}},
        (LST,) * 4,
        "GLM-5: DeepSeek-V3.2's sparse attention",
    ),
    "qwen3_5": TinyArch(
        {"model_type": "qwen3_5",
         "text_config": {"model_type": "qwen3_5_text", **_ATTENTION, **_DELTA,
                         "rope_parameters": {"rope_type": "default", "rope_theta": 10000.0,
                                             "partial_rotary_factor": 0.25, "mrope_section": [2, 1, 1]}}},
        (ARR, ARR, ARR, KV),
        "Qwen3.5: three gated delta-net layers to one gated attention layer; config nests text_config",
    ),
    "qwen3_next": TinyArch(
        {"model_type": "qwen3_next", **_ATTENTION, **_DELTA, "partial_rotary_factor": 0.25, "num_experts": 4,
         "num_experts_per_tok": 2, "decoder_sparse_step": 1, "moe_intermediate_size": 64,
         "shared_expert_intermediate_size": 64, "mlp_only_layers": [], "norm_topk_prob": True},
        (ARR, ARR, ARR, KV),
        "Qwen3-Next: gated delta-net and gated attention layers, 4 experts and a shared one",
    ),
    "kimi_linear": TinyArch(
        {"model_type": "kimi_linear", **_ATTENTION, "num_key_value_heads": 4, "model_max_length": 4096,
         "linear_attn_config": {"kda_layers": [1, 2, 3], "full_attn_layers": [4], "num_heads": 4, "head_dim": 32,
                                "short_conv_kernel_size": 4},
         "num_experts": 4, "num_experts_per_token": 2, "num_shared_experts": 1, "moe_intermediate_size": 64,
         "first_k_dense_replace": 1, "kv_lora_rank": 64, "qk_nope_head_dim": 32, "qk_rope_head_dim": 16,
         "v_head_dim": 32, "mla_use_nope": True,
         "pad_token_id": 0, "bos_token_id": None},  # transformers' defaults are outside the vocabulary
        (ARR, ARR, ARR, KV),
        "Kimi-Linear: three Kimi delta-attention layers to one MLA layer without rope",
    ),
    "lfm2": TinyArch(
        {"model_type": "lfm2", **_ATTENTION, "norm_eps": 1e-5, "conv_bias": False, "conv_L_cache": 3,
         "block_dim": 128, "block_ff_dim": 256, "block_multiple_of": 64, "block_ffn_dim_multiplier": 1.0,
         "block_auto_adjust_ff_dim": False, "layer_types": ["conv", "conv", "full_attention", "conv"]},
        (ARR, ARR, KV, ARR),
        "LFM2: gated short-convolution layers and attention; tied embeddings",
    ),
    "mamba2": TinyArch(
        {"model_type": "mamba2", "hidden_size": 128, "num_hidden_layers": 4, "intermediate_size": 256,
         "num_heads": 8, "head_dim": 32, "state_size": 16, "n_groups": 1, "conv_kernel": 4,
         "layer_norm_epsilon": 1e-5, "use_bias": False, "use_conv_bias": True, "tie_word_embeddings": False,
         "time_step_limit": [0.0, 1000.0], "time_step_rank": "auto"},
        (ARR,) * 4,
        "Mamba-2 (Codestral Mamba): recurrent layers only",
    ),
    "granitemoehybrid": TinyArch(
        {"model_type": "granitemoehybrid", **_ATTENTION, **_MAMBA2, "attention_bias": False,
         "embedding_multiplier": 1.0, "attention_multiplier": 32**-0.5, "logits_scaling": 1.0,
         "residual_multiplier": 1.0, "position_embedding_type": "nope",
         "layer_types": ["mamba", "mamba", "mamba", "attention"], "mamba_proj_bias": False,
         "mamba_conv_bias": True, "num_local_experts": 4, "num_experts_per_tok": 2, "shared_intermediate_size": 256},
        (ARR, ARR, ARR, KV),
        "Granite 4.0-H: mamba-2 and attention (no rope) layers, 4 experts and a shared MLP",
    ),
    "nemotron_h": TinyArch(
        {"model_type": "nemotron_h", **_ATTENTION, "attention_bias": False, "mamba_num_heads": 8,
         "mamba_head_dim": 32, "mamba_proj_bias": False, "ssm_state_size": 16, "conv_kernel": 4, "n_groups": 1,
         "mlp_bias": False, "layer_norm_epsilon": 1e-5, "use_bias": False, "use_conv_bias": True,
         "hybrid_override_pattern": "M*-E", "n_routed_experts": 4, "num_experts_per_tok": 2,
         "moe_intermediate_size": 64, "moe_shared_expert_intermediate_size": 64, "n_shared_experts": 1,
         "n_group": 1, "topk_group": 1, "norm_topk_prob": True, "routed_scaling_factor": 1.0},
        (ARR, KV),
        "Nemotron-H / Nemotron 3: one mixer per layer, mamba (M), attention (*), MLP (-), MoE (E); only M and * cache",
    ),
    "falcon_h1": TinyArch(
        {"model_type": "falcon_h1", **_ATTENTION, "mamba_d_ssm": 256, "mamba_n_heads": 8, "mamba_d_head": 32,
         "mamba_d_state": 16, "mamba_d_conv": 4, "mamba_n_groups": 1, "mamba_chunk_size": 32,
         "embedding_multiplier": 1.0, "lm_head_multiplier": 1.0, "attention_out_multiplier": 1.0,
         "key_multiplier": 1.0, "ssm_in_multiplier": 1.0, "ssm_out_multiplier": 1.0,
         "mlp_multipliers": [1.0, 1.0], "ssm_multipliers": [1.0] * 5},
        (LST,) * 4,
        "Falcon-H1: attention and mamba-2 side by side in every layer (one cache list of both per layer)",
    ),
    "mistral3": TinyArch(
        {"model_type": "mistral3", "text_config": {"model_type": "mistral", **_ATTENTION}},
        (KV,) * 4,
        "Mistral Small 3.1/3.2: llama layers; the config nests text_config beside the vision tower's",
    ),
    "ministral3": TinyArch(
        {"model_type": "mistral3",
         "text_config": {"model_type": "ministral3", **_ATTENTION,
                         "rope_parameters": {"rope_type": "yarn", "rope_theta": 10000.0, "factor": 4.0,
                                             "original_max_position_embeddings": 1024, "beta_fast": 32.0,
                                             "beta_slow": 1.0, "mscale": 1.0, "mscale_all_dim": 1.0,
                                             "llama_4_scaling_beta": 0.1}}},
        (KV,) * 4,
        "Ministral 3: yarn rope with llama-4 attention scaling; nested in a mistral3 config as shipped",
    ),
    "llama4": TinyArch(
        {"model_type": "llama4",
         "text_config": {"model_type": "llama4_text", **_ATTENTION, "attention_bias": False,
                         "attention_chunk_size": WINDOW, "interleave_moe_layer_step": 2,
                         "intermediate_size": 64, "intermediate_size_mlp": 256, "num_local_experts": 4,
                         "num_experts_per_tok": 1, "rope_scaling": None, "use_qk_norm": True}},
        (CHK, CHK, CHK, KV),
        "Llama 4 Scout/Maverick, text only: three chunked-attention layers (chunks of 32) to one global "
        "layer without rope, MoE every second layer (one of 4 experts and a shared one); nests text_config",
    ),
    "qwen3_vl": TinyArch(
        {"model_type": "qwen3_vl",
         "text_config": {"model_type": "qwen3_vl_text", **_ATTENTION,
                         "rope_scaling": {"rope_type": "default", "mrope_section": [8, 4, 4],
                                          "mrope_interleaved": True}}},
        (KV,) * 4,
        "Qwen3-VL, text only: qwen3 layers; the config nests text_config",
    ),
}


def caches_summary(caches: tuple[str, ...]) -> str:
    """Runs of the same class folded: "ArraysCache x3, KVCache"."""
    runs: list[list] = []
    for name in caches:
        if runs and runs[-1][0] == name:
            runs[-1][1] += 1
        else:
            runs.append([name, 1])
    return ", ".join(name if count == 1 else f"{name} x{count}" for name, count in runs)

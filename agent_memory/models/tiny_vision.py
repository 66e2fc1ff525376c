"""Tiny random vision models (`models build-tiny --arch gemma3`), built offline from mlx-vlm's own
classes: a tiny text model of the family (tiny_archs.py, drawn as models/tiny.py draws it) with a
small vision tower and projector beside it, the processor's files (the image processor's config and
the tokenizer's image tokens) and a chat template that writes the family's image placeholder for an
`{"type": "image"}` content item, as the real checkpoint's does. The folder is what an mlx-vlm
checkpoint of the family looks like: mlx-lm loads its language half, mlx-vlm its vision half and
processor (agent_memory/vision/)."""

from __future__ import annotations

import json
import logging
from dataclasses import dataclass, field
from pathlib import Path

import agent_memory.blas  # noqa: F401
import mlx.core as mx
import numpy as np
from mlx.utils import tree_flatten

from agent_memory.models.folders import ModelError, building, complete
from agent_memory.models.gguf import Progress
from agent_memory.models.tiny import (
    ChatTemplate,
    _initial,
    _seed,
    _tokenizer,
    _write_tokenizer_config,
    random_weights,
)
from agent_memory.models.tiny_archs import ARCHS

log = logging.getLogger(__name__)

STAGE = "building the tiny vision model"
# Gemma 3's turn format, an image item written as its placeholder (the processor expands it).
GEMMA3_TEMPLATE = (
    "{{ bos_token }}{% for message in messages %}"
    "{% set role = 'model' if message['role'] == 'assistant' else message['role'] %}"
    "{{ '<start_of_turn>' + role + '\\n' }}"
    "{% if message['content'] is string %}{{ message['content'] }}"
    "{% else %}{% for item in message['content'] %}"
    "{% if item['type'] == 'image' %}{{ '<start_of_image>' }}"
    "{% elif item['type'] == 'text' %}{{ item['text'] }}{% endif %}"
    "{% endfor %}{% endif %}{{ '<end_of_turn>\\n' }}{% endfor %}"
    "{% if add_generation_prompt %}{{ '<start_of_turn>model\\n' }}{% endif %}"
)
IMAGE_SIDE = 28  # pixels: two 14-pixel patches a side, so an image is 4 patches
# Mistral's turn format (Mistral Small 3.1's, shortened), an image item written as [IMG].
MISTRAL3_TEMPLATE = (
    "{{ bos_token }}{% for message in messages %}"
    "{% if message['role'] == 'assistant' %}{{ message['content'] + eos_token }}"
    "{% else %}{{ '[INST]' }}{% if message['content'] is string %}{{ message['content'] }}"
    "{% else %}{% for item in message['content'] %}"
    "{% if item['type'] == 'image' %}{{ '[IMG]' }}{% elif item['type'] == 'text' %}{{ item['text'] }}{% endif %}"
    "{% endfor %}{% endif %}{{ '[/INST]' }}{% endif %}{% endfor %}"
)
LONGEST_EDGE = 56  # pixels: at most four 14-pixel patches a side, merged 2x2 into image tokens
# Qwen3.5's turn format (ChatML), an image item written as its vision start, placeholder and end.
QWEN3_5_TEMPLATE = (
    "{% for message in messages %}{{ '<|im_start|>' + message['role'] + '\\n' }}"
    "{% if message['content'] is string %}{{ message['content'] }}"
    "{% else %}{% for item in message['content'] %}"
    "{% if item['type'] == 'image' %}{{ '<|vision_start|><|image_pad|><|vision_end|>' }}"
    "{% elif item['type'] == 'text' %}{{ item['text'] }}{% endif %}"
    "{% endfor %}{% endif %}{{ '<|im_end|>\\n' }}{% endfor %}"
    "{% if add_generation_prompt %}{{ '<|im_start|>assistant\\n' }}{% endif %}"
)
# Pixels an image is resized within (Qwen's smart resize, by 32-pixel steps): 64x64 at least, so an
# image's tokens span rows and columns (its 3-D positions differ from its indices), 256x256 at most.
QWEN_MIN_PIXELS, QWEN_MAX_PIXELS = 64 * 64, 256 * 256


@dataclass(frozen=True)
class TinyVision:
    """One vision family's tiny model: its text family (tiny_archs.py), vision tower and processor."""

    text_arch: str
    config: dict  # the checkpoint's config beside `text_config` (vision_config, image token fields)
    image_tokens: dict[str, str]  # the tokenizer's named image tokens (Gemma's boi_token, image_token, eoi_token)
    token_ids: dict[str, str]  # config.json's token id fields, by the token each names
    template: ChatTemplate
    preprocessor: dict  # preprocessor_config.json
    processor: dict  # processor_config.json
    about: str
    text: dict = field(default_factory=dict)  # over the text family's tiny config (tiny_archs.py)
    caches: tuple[str, ...] = ()  # make_prompt_cache's classes where `text` changes the family's

    @property
    def cache_classes(self) -> tuple[str, ...]:
        return self.caches or ARCHS[self.text_arch].caches


VISION_ARCHS: dict[str, TinyVision] = {
    "gemma3": TinyVision(
        text_arch="gemma3_text",
        config={
            "model_type": "gemma3",
            "mm_tokens_per_image": 4,
            "vision_config": {
                "model_type": "siglip_vision_model", "hidden_size": 32, "intermediate_size": 64,
                "num_hidden_layers": 1, "num_attention_heads": 2, "image_size": IMAGE_SIDE, "patch_size": 14,
            },
        },
        image_tokens={
            "boi_token": "<start_of_image>", "image_token": "<image_soft_token>", "eoi_token": "<end_of_image>"
        },
        token_ids={
            "boi_token_index": "<start_of_image>", "image_token_index": "<image_soft_token>",
            "eoi_token_index": "<end_of_image>",
        },
        template=ChatTemplate(
            text=GEMMA3_TEMPLATE,
            special=("<start_of_turn>", "<end_of_turn>", "<start_of_image>", "<end_of_image>", "<image_soft_token>"),
            bos="<bos>",
            eos=("<end_of_turn>",),
        ),
        preprocessor={
            "image_processor_type": "Gemma3ImageProcessor", "processor_class": "Gemma3Processor",
            "do_resize": True, "size": {"height": IMAGE_SIDE, "width": IMAGE_SIDE}, "resample": 2,
            "do_rescale": True, "rescale_factor": 1 / 255, "do_normalize": True,
            "image_mean": [0.5, 0.5, 0.5], "image_std": [0.5, 0.5, 0.5],
            "do_convert_rgb": True, "do_pan_and_scan": False,
        },
        processor={"processor_class": "Gemma3Processor", "image_seq_length": 4},
        about="Gemma 3 (vision): a SigLIP tower, 4 tokens an image; window layers and one global",
    ),
    "mistral3_vision": TinyVision(
        text_arch="mistral3",
        config={
            "model_type": "mistral3",
            "spatial_merge_size": 2,
            "vision_config": {
                "model_type": "pixtral", "hidden_size": 32, "head_dim": 16, "intermediate_size": 64,
                "num_hidden_layers": 1, "num_attention_heads": 2, "image_size": LONGEST_EDGE, "patch_size": 14,
                "rope_theta": 10000.0,
            },
        },
        image_tokens={},
        token_ids={"image_token_index": "[IMG]"},
        template=ChatTemplate(
            text=MISTRAL3_TEMPLATE,
            special=("[INST]", "[/INST]", "[IMG]", "[IMG_BREAK]", "[IMG_END]"),
            bos="<s>",
            eos=("</s>",),
        ),
        preprocessor={
            "image_processor_type": "PixtralImageProcessor", "processor_class": "Mistral3Processor",
            "size": {"longest_edge": LONGEST_EDGE}, "patch_size": {"height": 14, "width": 14}, "resample": 3,
            "do_resize": True, "do_rescale": True, "rescale_factor": 1 / 255, "do_normalize": True,
            "image_mean": [0.5, 0.5, 0.5], "image_std": [0.5, 0.5, 0.5], "do_convert_rgb": True,
        },
        processor={
            "processor_class": "Mistral3Processor", "image_token": "[IMG]", "image_break_token": "[IMG_BREAK]",
            "image_end_token": "[IMG_END]", "spatial_merge_size": 2, "patch_size": 14,
        },
        about="Mistral Small 3.1 (vision): a Pixtral tower, rows of [IMG] tokens by the image's size; llama layers",
    ),
    "qwen3_5_vision": TinyVision(
        text_arch="qwen3_5",
        config={
            "model_type": "qwen3_5",
            "vision_config": {
                "model_type": "qwen3_5", "depth": 1, "hidden_size": 32, "intermediate_size": 64,
                "out_hidden_size": 128, "num_heads": 2, "patch_size": 16, "spatial_merge_size": 2,
                "temporal_patch_size": 2, "num_position_embeddings": 64, "in_channels": 3,
                "deepstack_visual_indexes": [],
            },
        },
        image_tokens={},
        token_ids={
            "image_token_id": "<|image_pad|>", "video_token_id": "<|video_pad|>",
            "vision_start_token_id": "<|vision_start|>", "vision_end_token_id": "<|vision_end|>",
        },
        template=ChatTemplate(
            text=QWEN3_5_TEMPLATE,
            special=("<|im_start|>", "<|im_end|>", "<|vision_start|>", "<|vision_end|>", "<|image_pad|>",
                     "<|video_pad|>"),
            eos=("<|im_end|>",),
        ),
        preprocessor={
            "image_processor_type": "Qwen2VLImageProcessorFast", "processor_class": "Qwen3VLProcessor",
            "patch_size": 16, "temporal_patch_size": 2, "merge_size": 2,
            "size": {"shortest_edge": QWEN_MIN_PIXELS, "longest_edge": QWEN_MAX_PIXELS},
            "image_mean": [0.5, 0.5, 0.5], "image_std": [0.5, 0.5, 0.5], "do_rescale": True,
            "rescale_factor": 1 / 255, "do_normalize": True, "do_convert_rgb": True,
        },
        processor={"processor_class": "Qwen3VLProcessor"},
        about="Qwen3.5 (vision): a Qwen3-VL tower, 2x2 merged patches an image token at 3-D (mrope) positions; "
        "gated delta-net and attention layers",
        # Half the head rotated in interleaved t/h/w sections, attention every other layer: an
        # image's positions change the greedy tokens after it.
        text={"partial_rotary_factor": 0.5, "mrope_section": [4, 2, 2], "full_attention_interval": 2},
        caches=("ArraysCache", "KVCache", "ArraysCache", "KVCache"),
    ),
}


def build_tiny_vision(out_dir: Path, *, arch: str, context: int = 4096, progress: Progress | None = None) -> Path:
    """Build the folder of vision family `arch` (same bytes every time); a complete one is kept."""
    spec = VISION_ARCHS[arch]
    if complete(out_dir):
        if json.loads((out_dir / "config.json").read_text()).get("model_type") != spec.config["model_type"]:
            raise ModelError(f"{out_dir} already holds another model; build into another folder or delete it")
        return out_dir
    step = progress or (lambda *_: None)
    with building(out_dir) as work:
        step(STAGE, 0, 2)
        tokenizer = _tokenizer(spec.template)
        tokenizer.save(str(work / "tokenizer.json"))
        _write_tokenizer_config(work, spec.template, context)
        tokenizer_config = json.loads((work / "tokenizer_config.json").read_text())
        tokenizer_config["extra_special_tokens"] = spec.image_tokens
        (work / "tokenizer_config.json").write_text(json.dumps(tokenizer_config, indent=1))
        (work / "preprocessor_config.json").write_text(json.dumps(spec.preprocessor, indent=1))
        (work / "processor_config.json").write_text(json.dumps(spec.processor, indent=1))
        if spec.processor["processor_class"] == "Qwen3VLProcessor":  # else mlx-vlm looks for it on the hub
            (work / "video_preprocessor_config.json").write_text(json.dumps(spec.preprocessor, indent=1))
        step(STAGE, 1, 2)
        config = _config(spec, tokenizer, context)
        seed = _seed(arch)
        weights = random_weights(config, seed, embed_std=ARCHS[spec.text_arch].embed_std)
        weights.update(_vision_weights(config, seed))
        mx.save_safetensors(str(work / "model.safetensors"), dict(sorted(weights.items())), metadata={"format": "mlx"})
        eos = config["eos_token_id"]
        (work / "generation_config.json").write_text(json.dumps({"eos_token_id": eos}, indent=1))
        (work / "config.json").write_text(json.dumps(config, indent=1))  # last: marks it complete
    step(STAGE, 2, 2)
    log.info("built the tiny %s vision model in %s", arch, out_dir)
    return out_dir


def _config(spec: TinyVision, tokenizer, context: int) -> dict:
    """The text family's config nested as `text_config`, the image tokens' ids, the vocabulary."""
    vocab = tokenizer.get_vocab_size()
    family = json.loads(json.dumps(ARCHS[spec.text_arch].config))
    text = family.get("text_config", family)  # mistral3's table entry nests it already
    text.update(vocab_size=vocab, max_position_embeddings=context)
    rope = text.get("rope_parameters", {})
    for name, value in spec.text.items():
        (rope if name in rope else text)[name] = value
    if "mm_tokens_per_image" in spec.config:
        text["mm_tokens_per_image"] = spec.config["mm_tokens_per_image"]
    ids = {name: tokenizer.token_to_id(token) for name, token in spec.token_ids.items()}
    eos = [tokenizer.token_to_id(token) for token in spec.template.eos]
    return {
        **json.loads(json.dumps(spec.config)),
        "text_config": text,
        **ids,
        "hidden_size": text["hidden_size"],
        "vocab_size": vocab,
        "pad_token_id": tokenizer.token_to_id("<|endoftext|>"),
        "eos_token_id": eos,
    }


def vision_model(config: dict):
    """mlx-vlm's own model class for the config, as mlx-vlm's `load_model` configures it."""
    from mlx_vlm.utils import get_model_and_args, update_module_configs

    family, _ = get_model_and_args(config=config)
    model_config = family.ModelConfig.from_dict(config)
    modules = ["text", "vision", "perceiver", "projector", "audio"]
    return family.Model(update_module_configs(model_config, family, config, modules))


def _vision_weights(config: dict, seed: int) -> dict[str, mx.array]:
    """Every parameter outside the language model, drawn as the text model's are (models/tiny.py)."""
    shapes = [(n, p) for n, p in tree_flatten(vision_model(config).parameters()) if not n.startswith("language_model.")]
    rng = np.random.default_rng(seed + 1)
    return {
        name: mx.array(_initial(name, np.array(like), rng, 1.0).astype(np.float32)) for name, like in sorted(shapes)
    }

"""A vision model's processor run without MLX, on the tokenizer thread: the rendered text with
each image's placeholder expanded to its image's tokens, and the images' arrays in numpy.

mlx-vlm's own processors (Gemma 3's, Mistral 3's, Qwen3.5's, ...) end by turning every output into an MLX
array, whatever `return_tensors` asks, and MLX runs on the engine thread only. So for those the
processor's parts are used as its `__call__` uses them — its image processor (numpy), the family's
expansion of the placeholder (from the processor's own tokens and sizes), its tokenizer — and the
result is checked against the processor's in tests/test_images_engine.py. A processor that is
transformers' own takes `return_tensors="np"`. Any other family's processor is not run here:
`preparer` says None and the model is served text only.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import numpy as np

# (processor, rendered text, PIL images in order) → (expanded text, the images' arrays by input name)
Expand = Callable[[Any, str, list], tuple[str, dict[str, np.ndarray]]]
TEXT_OUTPUTS = ("input_ids", "attention_mask", "token_type_ids")  # a processor's outputs that are the text's


def gemma3(processor: Any, text: str, images: list) -> tuple[str, dict[str, np.ndarray]]:
    """Gemma 3: a fixed run of image tokens for each `boi_token` (mlx-vlm's Gemma3Processor)."""
    found = text.count(processor.boi_token)
    if found != len(images):
        raise ValueError(f"Prompt contained {found} image tokens but received {len(images)} images.")
    inputs = processor.image_processor([images], return_tensors="np")
    if np.any(np.asarray(inputs.get("num_crops", 0))):  # pan and scan, off unless the folder turns it on
        raise ValueError("pan-and-scan crops are not taken")
    return text.replace(processor.boi_token, processor.full_image_sequence), {"pixel_values": inputs["pixel_values"]}


def mistral3(processor: Any, text: str, images: list) -> tuple[str, dict[str, np.ndarray]]:
    """Mistral 3 (Pixtral's tower): per image, rows of `image_token` as many as its resized size
    gives in merged patches, `image_break_token` between rows, `image_end_token` last
    (mlx-vlm's Mistral3Processor)."""
    parts = text.split(processor.image_token)
    if len(parts) - 1 != len(images):
        raise ValueError(f"Prompt contained {len(parts) - 1} image tokens but received {len(images)} images.")
    patch = processor.patch_size * processor.spatial_merge_size
    inputs = processor.image_processor([images], patch_size=patch)
    sizes = [(int(h), int(w)) for h, w in inputs["image_sizes"]]
    out = parts[0]
    for (h, w), after in zip(sizes, parts[1:]):
        rows = [processor.image_token * (w // patch)] * (h // patch)
        out += processor.image_break_token.join(rows) + processor.image_end_token + after
    return out, {"pixel_values": np.asarray(inputs["pixel_values"]), "image_sizes": np.array(sizes)}


def qwen3_vl(processor: Any, text: str, images: list) -> tuple[str, dict[str, np.ndarray]]:
    """Qwen3.5 (mlx-vlm's Qwen3VLProcessor): each `image_token` repeated once per merged patch
    of its image's grid (`image_grid_thw`: t·h·w patches, merged merge² into a token)."""
    parts = text.split(processor.image_token)
    if len(parts) - 1 != len(images):
        raise ValueError(f"Prompt contained {len(parts) - 1} image tokens but received {len(images)} images.")
    inputs = processor.image_processor([images])
    merged = processor.image_processor.merge_size**2
    out = parts[0]
    for grid, after in zip(inputs["image_grid_thw"], parts[1:]):
        out += processor.image_token * int(np.prod(grid) // merged) + after
    return out, {"pixel_values": inputs["pixel_values"], "image_grid_thw": inputs["image_grid_thw"]}


EXPANDERS: dict[str, Expand] = {"Gemma3Processor": gemma3, "Mistral3Processor": mistral3, "Qwen3VLProcessor": qwen3_vl}


def preparer(processor: Any) -> Callable[[str, list], tuple[list[int], dict[str, np.ndarray]]] | None:
    """How to run `processor` without MLX: (text, images) → (token ids, arrays); None where it
    cannot be (an mlx-vlm processor with no expansion here)."""
    if type(processor).__module__.startswith("transformers."):
        return lambda text, images: _whole(processor, text, images)
    expand = EXPANDERS.get(type(processor).__name__) if type(processor).__module__.startswith("mlx_vlm.") else None
    if expand is None:
        return None

    def prepare(text: str, images: list) -> tuple[list[int], dict[str, np.ndarray]]:
        expanded, arrays = expand(processor, text, images)
        return list(processor.tokenizer(expanded, add_special_tokens=False)["input_ids"]), arrays

    return prepare


def _whole(processor: Any, text: str, images: list) -> tuple[list[int], dict[str, np.ndarray]]:
    """A processor of transformers' own, run whole: it makes numpy when asked."""
    out = processor(text=[text], images=[images], add_special_tokens=False, return_tensors="np")
    arrays = {k: np.asarray(v) for k, v in out.items() if k not in TEXT_OUTPUTS and v is not None}
    return np.asarray(out["input_ids"]).reshape(-1).tolist(), arrays

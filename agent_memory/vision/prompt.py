"""A vision model's prompt: the rendered text (one placeholder per image, as the chat template
writes it) and its images, made by the model's own processor (mlx-vlm's, from the model folder's
files) into the expanded token ids and pixel arrays, and one `SpanKey` per image over its tokens.

The key is the image's digest (chat/images.py `ChatImage.digest`: its decoded pixels), so two
images whose placeholder tokens are the same never share KV, and the same picture at the same
place always does (memory/hashing.py). A family whose image tokens take 3-D positions (Qwen3.5:
vision/positions.py) also has each image's grid in its key, since the grid (from the pixels and the
processor's resize settings) decides where every later token sits; and its inputs carry the
prompt's `Placement`. Runs on the model's tokenizer thread, in numpy: the
processor is run without MLX (vision/processing.py), which the engine thread alone runs.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from agent_memory.memory.hashing import SpanKey
from agent_memory.vision.positions import MROPE_FAMILIES, Placement, place
from agent_memory.vision.processing import preparer

log = logging.getLogger(__name__)

# The tokens within an image's run beside its placeholder, by the processor's names (Pixtral's).
IMAGE_MARKS = ("image_break_token", "image_end_token")


class VisionPromptError(ValueError):
    """The rendered prompt and the images do not agree (a placeholder count, a processor's refusal)."""


@dataclass(frozen=True)
class ImageSpan:
    """Where one image's tokens are in the prompt, and the digest that names it."""

    start: int
    end: int
    digest: str  # hex (chat/images.py)
    grid: tuple[int, int, int] | None = None  # (t, h, w) patches, for a family with 3-D positions

    @property
    def key(self) -> SpanKey:
        grid = b"".join(n.to_bytes(2, "big") for n in self.grid) if self.grid else b""
        return SpanKey(self.start, self.end, bytes.fromhex(self.digest) + grid)


@dataclass(frozen=True, eq=False)
class VisionInputs:
    """What the engine needs to put a prompt's images into the language model: the processor's
    image arrays (numpy, as the model's `get_input_embeddings` takes them) and each image's span."""

    pixels: dict[str, np.ndarray] = field(default_factory=dict)
    spans: tuple[ImageSpan, ...] = ()
    placement: Placement | None = None  # where its tokens sit, for a family with 3-D positions

    @property
    def keys(self) -> tuple[SpanKey, ...]:
        """What the request's `extra_keys` are: one per image, over its tokens."""
        return tuple(s.key for s in self.spans)


@dataclass(frozen=True)
class VisionPrompt:
    """A vision model's processor and its image token: `prepare` on the tokenizer thread."""

    processor: Any  # mlx-vlm's (transformers' ProcessorMixin): tokenizer + image processor
    image_token_ids: frozenset[int]  # an image's tokens: its placeholder's, and Pixtral's row breaks and end
    run: Callable[[str, list], tuple[list[int], dict[str, np.ndarray]]]  # the processor without MLX (processing.py)
    merge: int | None = None  # patches merged a side into a token, for a family with 3-D positions

    def prepare(self, text: str, images: list) -> tuple[list[int], VisionInputs]:
        """The prompt's token ids with each image's placeholder expanded to its tokens, and its
        inputs; `images`: ChatImages (`image`: a PIL image, `digest`) in the prompt's order."""
        try:
            tokens, pixels = self.run(text, [i.image for i in images])
        except (ValueError, TypeError) as e:
            raise VisionPromptError(f"the model's processor refused the images: {e}") from e
        runs = image_runs(tokens, self.image_token_ids)
        if len(runs) != len(images):
            raise VisionPromptError(f"the prompt holds {len(runs)} images' tokens for {len(images)} images")
        if self.merge is None:
            return tokens, VisionInputs(pixels, tuple(ImageSpan(s, e, i.digest) for (s, e), i in zip(runs, images)))
        try:
            placement = place(runs, pixels["image_grid_thw"], self.merge)
        except (KeyError, ValueError) as e:
            raise VisionPromptError(f"the model's processor made no grid for the images' tokens: {e}") from e
        spans = tuple(ImageSpan(s, e, i.digest, (t, h, w)) for (s, e, t, h, w), i in zip(placement.images, images))
        return tokens, VisionInputs(pixels, spans, placement)


def image_runs(tokens: list[int], image_token_ids: frozenset[int]) -> list[tuple[int, int]]:
    """Each maximal run of image tokens: one image's tokens, in order."""
    runs, start = [], None
    for i, t in enumerate([*tokens, -1]):
        if t in image_token_ids and start is None:
            start = i
        elif t not in image_token_ids and start is not None:
            runs.append((start, i))
            start = None
    return runs


def vision_prompt(path: Path, config: dict) -> VisionPrompt | None:
    """The folder's processor, when its config names a vision tower mlx-vlm has; None: text only,
    which is also what a folder whose processor cannot load is served as, and a family whose image
    tokens take 3-D (mrope) positions other than Qwen3.5's (vision/positions.py), said once."""
    if not config.get("vision_config"):
        return None
    if why := positions_refusal(config):
        log.info("%s: served text only: %s", path.name, why)
        return None
    from mlx_vlm.utils import get_model_and_args, load_processor

    try:  # mlx-vlm's family and processor, or the model serves text as it always did
        get_model_and_args(config=config)
        processor = load_processor(path, add_detokenizer=False)
    except Exception as e:  # noqa: BLE001 - any of a processor's many ways to fail to load
        log.warning("%s: served text only: mlx-vlm cannot take its images (%s)", path.name, e)
        return None
    run = preparer(processor)
    if run is None:
        log.warning("%s: served text only: its processor (%s) makes MLX arrays, which only the engine thread may",
                    path.name, type(processor).__name__)
        return None
    token = config.get("image_token_index", config.get("image_token_id"))
    if token is None:
        token = processor.tokenizer.convert_tokens_to_ids(processor.image_token)
    marks = [getattr(processor, name, None) for name in IMAGE_MARKS]
    ids = {processor.tokenizer.convert_tokens_to_ids(mark) for mark in marks if isinstance(mark, str)}
    merge = config["vision_config"].get("spatial_merge_size", 2) if mrope(config) else None
    return VisionPrompt(processor, frozenset({int(token), *ids}), run, merge)


def mrope(config: dict) -> bool:
    """Whether the model's image tokens take 3-D (mrope) positions."""
    text = config.get("text_config") or config
    return "mrope_section" in (text.get("rope_parameters") or text.get("rope_scaling") or {})


def positions_refusal(config: dict) -> str | None:
    """Why a family with 3-D image positions cannot take images here, or None."""
    if not mrope(config):
        return None
    if config["vision_config"].get("deepstack_visual_indexes"):
        return "its vision features also enter inner layers (Qwen3-VL's deepstack), which mlx-lm's model does not take"
    if config.get("model_type") not in MROPE_FAMILIES:
        return f"its image tokens' 3-D (mrope) positions are placed only for {', '.join(MROPE_FAMILIES)} here"
    return None

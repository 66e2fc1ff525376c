"""3-D (mrope) positions for Qwen3.5's image tokens, in mlx-lm's language model unchanged.

Qwen3.5 (mlx-vlm's `get_rope_index`) places text at (i, i, i) and an image's merged-patch tokens
at (s, s + row, s + column) from where the image starts; the text after an image continues from
the image's largest position + 1, so every token after it sits at `index + delta` (delta < 0: a
4×4-token image takes 16 tokens and 4 positions). mlx-lm's attention places a token at its cache
offset: `self.rope(x, offset=cache.offset)`. Each attention layer's `rope` becomes an `MRoPE`
(mlx's public `Module.update_modules`, as mlx-lm's LoRA swaps its layers; no mlx-lm code is
changed), which rotates by what the engine says the forward pass's rows are (`Positions`, set
around each model call on the engine thread):

- nothing said: mlx-lm's own rope, bit for bit (text-only sequences, probes);
- `deltas` (one per row): mlx-lm's rope at `offset + delta` (decode and speculative verify);
- `explicit` (3, B, L) positions: the interleaved mrope rotation (every prefill chunk of a
  sequence with images: a token's KV then depends on its position alone, so a cached block is
  the same bits as a recompute, whatever the chunking).

`self_check` proves at start that the model routes its rope through the swapped module; where it
does not, the model is served text only (vision/prompt.py), never with wrong positions.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass

import agent_memory.blas  # noqa: F401
import mlx.core as mx
import mlx.nn as nn
import numpy as np

# Families whose image tokens take interleaved 3-D positions and whose language half is mlx-lm's
# text model with its attention's rope swappable (Qwen3-VL needs deepstack features too: not these).
MROPE_FAMILIES = ("qwen3_5", "qwen3_5_moe")


class Positions:
    """Where the next forward pass's rows are placed; the engine sets it around each model call."""

    def __init__(self) -> None:
        self.deltas: mx.array | None = None  # (B,): position = cache offset + delta
        self.explicit: mx.array | None = None  # (3, B, L): each token's (t, h, w)
        self.calls = 0  # rope calls while set (the self-check counts them)

    @contextmanager
    def rows(self, deltas: list[int] | None = None, explicit: np.ndarray | None = None) -> Iterator[None]:
        self.deltas = None if deltas is None else mx.array(np.asarray(deltas, np.int32))
        self.explicit = None if explicit is None else mx.array(np.asarray(explicit, np.int32))
        try:
            yield
        finally:
            self.deltas = self.explicit = None


class MRoPE(nn.Module):
    """An attention layer's rope: mlx-lm's own (`inner`) unless the engine placed the rows."""

    def __init__(self, inner: nn.Module, positions: Positions, dims: int, base: float, section: list[int]) -> None:
        super().__init__()
        self.inner = inner
        self.positions = positions
        self.dims = dims  # the rotated dimensions (head_dim × partial_rotary_factor); the rest pass
        self._inv = mx.array(1.0 / (base ** (np.arange(0, dims, 2, dtype=np.float32) / dims)))
        # Interleaved sections (Qwen3-VL, 3.5): frequency i reads h when i % 3 == 1 (i < 3·section[1]),
        # w when i % 3 == 2 (i < 3·section[2]), else t.
        axis = np.zeros(dims // 2, np.int32)
        for a in (1, 2):
            axis[a : 3 * section[a] : 3] = a
        self._axis = mx.array(axis)
        self.freeze()

    def __call__(self, x: mx.array, offset=0) -> mx.array:
        p = self.positions
        if p.explicit is not None:
            p.calls += 1
            return self._rotate(x, p.explicit)
        if p.deltas is not None:
            p.calls += 1
            return self.inner(x, offset=offset + p.deltas)  # mx.fast.rope takes an offset per row
        return self.inner(x, offset=offset)

    def _rotate(self, x: mx.array, pos: mx.array) -> mx.array:
        """x (B, heads, L, head_dim) rotated at pos (3, B, L): cos/sin by each frequency's axis,
        rotate-half layout, as mlx-vlm's Qwen3.5 rotary embedding."""
        shape = (*pos.shape[1:], self._axis.size)
        chosen = mx.take_along_axis(pos.transpose(1, 2, 0), mx.broadcast_to(self._axis, shape), axis=-1)
        freqs = chosen.astype(mx.float32) * self._inv
        emb = mx.concatenate([freqs, freqs], axis=-1)[:, None]  # (B, 1, L, dims)
        cos, sin = mx.cos(emb).astype(x.dtype), mx.sin(emb).astype(x.dtype)
        r, rest = x[..., : self.dims], x[..., self.dims :]
        half = self.dims // 2
        rotated = mx.concatenate([-r[..., half:], r[..., :half]], axis=-1)
        return mx.concatenate([r * cos + rotated * sin, rest], axis=-1)


def install(model: nn.Module, config: dict) -> Positions:
    """An `MRoPE` as the rope of every attention layer of mlx-lm's `model`; the `Positions`
    that steers them. `config`: config.json (its `text_config`'s rope parameters)."""
    text = config.get("text_config") or config
    rope = text.get("rope_parameters") or text.get("rope_scaling") or {}
    head = text.get("head_dim") or text["hidden_size"] // text["num_attention_heads"]
    dims = int(head * rope.get("partial_rotary_factor", text.get("partial_rotary_factor", 1.0)))
    base = rope.get("rope_theta", text.get("rope_theta", 10000.0))
    positions = Positions()
    for layer in model.layers:
        attention = getattr(layer, "self_attn", None)
        if attention is not None and hasattr(attention, "rope"):
            attention.update_modules({"rope": MRoPE(attention.rope, positions, dims, base, rope["mrope_section"])})
    return positions


def self_check(model: nn.Module, positions: Positions) -> str | None:
    """Why the installed positions would not reach the model's attention, or None: one attention
    layer run on two random tokens at delta 0 and at delta 1000 must call its rope twice (queries
    and keys) and answer differently. One layer's weights are read, not the model's."""
    from mlx_lm.models.cache import KVCache

    attention = next((layer.self_attn for layer in model.layers if hasattr(layer, "self_attn")), None)
    if attention is None or not isinstance(getattr(attention, "rope", None), MRoPE):
        return "its attention layers have no rope module to place image tokens with"
    hidden = model.layers[0].input_layernorm.weight.shape[0]
    x = mx.random.normal((1, 2, hidden), key=mx.random.key(0))
    outs = []
    for delta in (0, 1000):
        positions.calls = 0
        with positions.rows(deltas=[delta]):
            outs.append(attention(x, mask=None, cache=KVCache()))
            mx.eval(outs[-1])
        if positions.calls != 2:
            return f"its attention called its rope {positions.calls} times, not twice (queries, keys)"
    if mx.array_equal(outs[0], outs[1]):
        return "its attention's output does not depend on the positions its rope was given"
    return None


@dataclass(frozen=True)
class Placement:
    """A prompt's images as its positions see them: each image's (start, end) tokens and grid
    (t, h, w) in patches, merged `merge`×`merge` into tokens."""

    images: tuple[tuple[int, int, int, int, int], ...]  # (start, end, t, h, w), in prompt order
    merge: int

    def _shift(self, t: int, h: int, w: int) -> int:
        """How far one image moves what follows it: its positions (the largest side) less its tokens."""
        gh, gw = h // self.merge, w // self.merge
        return max(t, gh, gw) - t * gh * gw

    @property
    def delta(self) -> int:
        """Every token after the last image sits at its index + delta (decoding too)."""
        return sum(self._shift(t, h, w) for _, _, t, h, w in self.images)

    def positions(self, a: int, b: int) -> np.ndarray:
        """Tokens [a, b)'s (t, h, w) positions, (3, b - a): mlx-vlm's `get_rope_index` for them."""
        index = np.arange(a, b)
        pos = np.broadcast_to(index, (3, b - a)).copy()
        moved = 0  # the shift of the images before the one at hand
        for start, end, t, h, w in self.images:
            inside = (index >= start) & (index < end)
            if inside.any():
                gh, gw = h // self.merge, w // self.merge
                k = index[inside] - start
                grid = np.stack([k // (gh * gw), k // gw % gh, k % gw])
                pos[:, inside] = start + moved + grid
            moved += self._shift(t, h, w)
            pos[:, index >= end] = index[index >= end] + moved
        return pos


def place(runs: list[tuple[int, int]], grids: np.ndarray, merge: int) -> Placement:
    """The placement of images whose tokens are `runs` (start, end) and whose processor grids
    (`image_grid_thw`, one row per image) are `grids`; a run that is not its grid's size is refused."""
    images = []
    for (start, end), (t, h, w) in zip(runs, np.asarray(grids).tolist(), strict=True):
        if end - start != t * (h // merge) * (w // merge):
            raise ValueError(f"an image of {end - start} tokens for a {t}×{h}×{w} grid of patches")
        images.append((start, end, t, h, w))
    return Placement(tuple(images), merge)

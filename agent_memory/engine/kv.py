"""Block payloads <-> per-sequence KV caches.

A block payload holds a run of tokens' KV for every layer, stacked: `k`/`v` of shape
(layers, kv_heads, tokens, head_dim) at full precision, or for a quantized tier the three
parts of each (`k.q`, `k.scales`, `k.biases`, same for `v`) as `mx.quantize` makes them.
Quantization groups run along head_dim, so payloads of one precision concatenate and slice
along the token axis exactly. The same names are the tensors of a block file on disk.
"""

from __future__ import annotations

from dataclasses import dataclass

import agent_memory.blas  # noqa: F401
import mlx.core as mx
from mlx_lm.models.cache import KVCache, QuantizedKVCache

QUANT_PARTS = ("q", "scales", "biases")


@dataclass(frozen=True)
class KVPrecision:
    """The KV precision of a tier: bits 16 means unquantized, in the model's dtype."""

    bits: int = 16
    group_size: int = 64

    @property
    def quantized(self) -> bool:
        return self.bits < 16

    def tensor_names(self) -> list[str]:
        if not self.quantized:
            return ["k", "v"]
        return [f"{kv}.{part}" for kv in "kv" for part in QUANT_PARTS]


Payload = dict[str, mx.array]


def new_cache(num_layers: int, precision: KVPrecision) -> list:
    if precision.quantized:
        return [QuantizedKVCache(precision.group_size, precision.bits) for _ in range(num_layers)]
    return [KVCache() for _ in range(num_layers)]


def payload_nbytes(payload: Payload) -> int:
    return sum(a.nbytes for a in payload.values())


def cut(cache: list, start: int, end: int) -> Payload:
    """Copy tokens [start, end) of a single-sequence cache out as a block payload."""
    if isinstance(cache[0], QuantizedKVCache):
        return {
            f"{kv}.{part}": mx.stack([getattr(c, name)[i][0, :, start:end] for c in cache])
            for kv, name in (("k", "keys"), ("v", "values"))
            for i, part in enumerate(QUANT_PARTS)
        }
    return {
        "k": mx.stack([c.keys[0, :, start:end] for c in cache]),
        "v": mx.stack([c.values[0, :, start:end] for c in cache]),
    }


def append(cache: list, parts: list[tuple[Payload, int]]) -> None:
    """Append the first n tokens of each payload, in order, to a single-sequence cache."""
    if not parts:
        return
    joined = {
        name: mx.concatenate([p[name][:, :, :n] for p, n in parts], axis=2) for name in parts[0][0]
    }
    added = sum(n for _, n in parts)
    for layer, c in enumerate(cache):
        if isinstance(c, QuantizedKVCache):
            new_k = tuple(joined[f"k.{p}"][layer][None] for p in QUANT_PARTS)
            new_v = tuple(joined[f"v.{p}"][layer][None] for p in QUANT_PARTS)
            if c.keys is not None:
                new_k = tuple(mx.concatenate([a[..., : c.offset, :], b], axis=2) for a, b in zip(c.keys, new_k))
                new_v = tuple(mx.concatenate([a[..., : c.offset, :], b], axis=2) for a, b in zip(c.values, new_v))
            c.keys, c.values = new_k, new_v
        else:
            new_k, new_v = joined["k"][layer][None], joined["v"][layer][None]
            if c.keys is not None:
                new_k = mx.concatenate([c.keys[..., : c.offset, :], new_k], axis=2)
                new_v = mx.concatenate([c.values[..., : c.offset, :], new_v], axis=2)
            c.keys, c.values = new_k, new_v
        c.offset += added
    mx.eval([c.state for c in cache])

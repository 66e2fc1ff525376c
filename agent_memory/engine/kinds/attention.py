"""The attention kind: layers that keep every token's KV (mlx-lm's `KVCache`, or
`QuantizedKVCache` when decoding attends to quantized KV). Their KV is kept in blocks.

A block payload holds a run of tokens' KV for a group of such layers of one shape, stacked:
`k`/`v` of shape (layers, kv_heads, tokens, head_dim) at full precision, or for a quantized
tier the three parts of each (`k.q`, `k.scales`, `k.biases`, same for `v`) as `mx.quantize`
makes them. Quantization groups run along head_dim, so payloads of one precision concatenate
and slice along the token axis exactly. The same names are the tensors of a block file on disk;
a model whose attention layers have several shapes prefixes the later groups' names (layers.py).
Its caches join the decode batch by mlx-lm's `merge` (`BatchKVCache`), Q4/Q8 ones by ours
(engine/batch/quantized.py).
"""

from __future__ import annotations

from dataclasses import dataclass

import agent_memory.blas  # noqa: F401
import mlx.core as mx
import numpy as np
from mlx_lm.models.cache import KVCache, QuantizedKVCache

from agent_memory.engine.batch.quantized import BatchQuantizedKVCache
from agent_memory.precision import KVPrecision

name = "attention"
cache_classes = (KVCache, QuantizedKVCache)
snapshot = False
joins = True

QUANT_PARTS = ("q", "scales", "biases")


Payload = dict[str, mx.array]


def new_layer(precision: KVPrecision):
    """A fresh attention layer's cache at the working precision."""
    return QuantizedKVCache(precision.group_size, precision.bits) if precision.quantized else KVCache()


def batched(cache: KVCache | QuantizedKVCache):
    """A sequence's layer as a batch of one: float KV by mlx-lm's merge, Q4/Q8 KV by ours."""
    return (BatchQuantizedKVCache if isinstance(cache, QuantizedKVCache) else KVCache).merge([cache])


def payload_nbytes(payload: Payload) -> int:
    return sum(a.nbytes for a in payload.values())


@dataclass(frozen=True)
class BlockKV:
    """A hot block's KV and the precision it is held at: the working precision it was computed
    at while its agent is active (exact), the hot tier's --kv-bits once it cooled (quantized)."""

    arrays: Payload
    precision: KVPrecision

    @property
    def nbytes(self) -> int:
        return payload_nbytes(self.arrays)

    def at(self, precision: KVPrecision) -> Payload:
        return convert(self.arrays, self.precision, precision)

    def tensors(self, precision: KVPrecision) -> dict:
        """A block file's tensors at a tier's precision."""
        return to_numpy(self.at(precision))


def in_group(name: str, prefix: str) -> bool:
    """Whether a payload tensor belongs to the group named by `prefix` ("" for the first)."""
    return name.startswith(prefix) if prefix else "/" not in name


def cut(cache: list, start: int, end: int, prefix: str = "") -> Payload:
    """Copy tokens [start, end) of a group of single-sequence caches out as a block payload."""
    if isinstance(cache[0], QuantizedKVCache):
        return {
            f"{prefix}{kv}.{part}": mx.stack([getattr(c, name)[i][0, :, start:end] for c in cache])
            for kv, name in (("k", "keys"), ("v", "values"))
            for i, part in enumerate(QUANT_PARTS)
        }
    return {
        f"{prefix}k": mx.stack([c.keys[0, :, start:end] for c in cache]),
        f"{prefix}v": mx.stack([c.values[0, :, start:end] for c in cache]),
    }


@dataclass(frozen=True)
class StoredRun:
    """Tokens [start, end) of a running sequence, as the cached block KV they came from."""

    start: int
    end: int
    kv: BlockKV


def cut_at(groups: dict[str, list], start: int, end: int, stored: list[StoredRun], working: KVPrecision) -> BlockKV:
    """Tokens [start, end) of a sequence's cache as a block. Within one restored run, the
    block keeps that run's stored KV (its bits, its precision: quantizing dequantized values
    again would drift); anything else is cut from the working cache exactly as the sequence
    attended to it, so that a repeat of the request, reading it back, attends to the same."""
    for run in stored:
        if run.start <= start and end <= run.end:
            kept = {
                name: mx.contiguous(a[:, :, start - run.start : end - run.start]) for name, a in run.kv.arrays.items()
            }
            return BlockKV(kept, run.kv.precision)
    return BlockKV(
        {name: a for prefix, cache in groups.items() for name, a in cut(cache, start, end, prefix).items()}, working
    )


def demote(block: BlockKV, precision: KVPrecision) -> BlockKV:
    """The block at the hot tier's rest precision, evaluated (its exact arrays can go)."""
    cooled = BlockKV(block.at(precision), precision)
    mx.eval(cooled.arrays)
    return cooled


def append(cache: list, parts: list[tuple[BlockKV, int]], working: KVPrecision, prefix: str = "") -> None:
    """Append the first n tokens of each block, in order, to a group of single-sequence caches
    at `working` precision. Runs of one precision are joined before they are converted, so the
    concatenation copies the small quantized tensors, not dequantized ones."""
    if not parts:
        return
    runs: list[tuple[KVPrecision, list[Payload]]] = []
    for block, n in parts:
        piece = {name[len(prefix) :]: a[:, :, :n] for name, a in block.arrays.items() if in_group(name, prefix)}
        if runs and runs[-1][0] == block.precision:
            runs[-1][1].append(piece)
        else:
            runs.append((block.precision, [piece]))
    converted = [
        convert({name: mx.concatenate([p[name] for p in pieces], axis=2) for name in pieces[0]}, precision, working)
        for precision, pieces in runs
    ]
    joined = (
        converted[0]
        if len(converted) == 1
        else {name: mx.concatenate([c[name] for c in converted], axis=2) for name in converted[0]}
    )
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


# -- moving payloads between tiers -------------------------------------------------------

SAFETENSORS_DTYPES = {mx.float32: "F32", mx.float16: "F16", mx.bfloat16: "BF16", mx.uint32: "U32"}
VIEW_AS = {mx.bfloat16: mx.uint16}  # numpy has no bfloat16: its bytes travel as uint16


@dataclass(frozen=True)
class KVShape:
    """What one token's KV looks like in a group of attention layers of one shape, probed once at load."""

    layers: int
    kv_heads: int
    k_dim: int
    v_dim: int
    dtype: mx.Dtype


def shape_of(caches: list) -> KVShape:
    """The shape of a group of full-precision attention caches that have seen a token."""
    k, v = caches[0].keys, caches[0].values
    return KVShape(len(caches), k.shape[1], k.shape[3], v.shape[3], k.dtype)


def convert(payload: Payload, src: KVPrecision, dst: KVPrecision) -> Payload:
    """Change a payload's precision (every group's); only tier moves do this."""
    if src == dst:
        return payload
    out = {}
    for prefix in sorted({name[: name.index("/") + 1] if "/" in name else "" for name in payload}):
        for kv in (f"{prefix}k", f"{prefix}v"):
            full = (
                mx.dequantize(*(payload[f"{kv}.{p}"] for p in QUANT_PARTS), group_size=src.group_size, bits=src.bits)
                if src.quantized
                else payload[kv]
            )
            if dst.quantized:
                parts = mx.quantize(full, group_size=dst.group_size, bits=dst.bits)
                out.update(zip((f"{kv}.{p}" for p in QUANT_PARTS), parts))
            else:
                out[kv] = full
    return out


def to_numpy(payload: Payload) -> dict:
    """Tensors for a block file: name -> (safetensors dtype, numpy array). The arrays own
    their memory, so nothing of MLX travels to the writer thread."""
    mx.eval(payload)
    return {
        name: (SAFETENSORS_DTYPES[a.dtype], np.array(a.view(VIEW_AS.get(a.dtype, a.dtype)), copy=True))
        for name, a in payload.items()
    }


def block_layout(n: int, shape: KVShape, precision: KVPrecision, prefix: str = "") -> dict:
    """The tensors a block file of n tokens must hold for one group at this precision."""
    dtype = SAFETENSORS_DTYPES[shape.dtype]
    dims = {"k": shape.k_dim, "v": shape.v_dim}
    lead = (shape.layers, shape.kv_heads, n)
    if not precision.quantized:
        return {f"{prefix}{kv}": (dtype, (*lead, d)) for kv, d in dims.items()}
    out = {}
    for kv, d in dims.items():
        out[f"{prefix}{kv}.q"] = ("U32", (*lead, d * precision.bits // 32))
        out[f"{prefix}{kv}.scales"] = (dtype, (*lead, d // precision.group_size))
        out[f"{prefix}{kv}.biases"] = (dtype, (*lead, d // precision.group_size))
    return out

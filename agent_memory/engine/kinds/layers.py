"""A model's layers by kind: the one place that knows which kind each of its caches is.

mlx-lm gives every model its working cache (`make_prompt_cache`): one cache per layer, or a
`CacheList` of several for a layer that keeps more than one. Each cache is of one kind:
- attention (attention.py, `KVCache`): every token's KV, kept in blocks that a prefix names;
  caches of different shapes (MLA's latent beside an indexer's keys) are kept as groups whose
  tensors are named apart (`g1/k`, ...);
- window (window.py, `RotatingKVCache`) and recurrent (recurrent.py, `ArraysCache`): a state
  at a position, kept as a `Snapshot` at the positions agents come back to.
A request resumes at a position P when blocks cover [0, P) and, if the model has state layers,
a snapshot was taken exactly at P (memory/index/store.py). A cache class not listed here is
refused at start, by name: adding one is a module like window.py and a line in STATE_KINDS.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from types import ModuleType

import agent_memory.blas  # noqa: F401
import mlx.core as mx
import numpy as np
from mlx_lm.models.cache import CacheList, KVCache, make_prompt_cache

from agent_memory.engine.kinds import attention, recurrent, window
from agent_memory.engine.kinds.attention import SAFETENSORS_DTYPES, BlockKV, KVShape, Payload, StoredRun
from agent_memory.memory.warm.blockfile import layout_bytes
from agent_memory.precision import KVPrecision, Precisions

STATE_KINDS: dict[type, ModuleType] = {window.CACHE_CLASS: window, recurrent.CACHE_CLASS: recurrent}


@dataclass(frozen=True)
class Slot:
    """Where one cache sits in a model's cache list: a layer, and its place in a CacheList."""

    index: int
    sub: int | None = None

    def get(self, cache: list):
        c = cache[self.index]
        return c if self.sub is None else c.caches[self.sub]

    def put(self, cache: list, value) -> None:
        if self.sub is None:
            cache[self.index] = value
        else:
            subs = list(cache[self.index].caches)
            subs[self.sub] = value
            cache[self.index].caches = tuple(subs)


@dataclass(frozen=True)
class Snapshot:
    """The state layers' caches at one position, never quantized: per state slot n, its
    arrays `s{n}.{i}` and the integers it is rebuilt with, `s{n}.meta`."""

    arrays: Payload

    @property
    def nbytes(self) -> int:
        return attention.payload_nbytes(self.arrays)

    def tensors(self, precision: KVPrecision) -> dict:
        """A snapshot file's tensors: the same at every tier precision."""
        return attention.to_numpy(self.arrays)


def _slots(cache: list) -> list[tuple[Slot, object]]:
    out = []
    for i, c in enumerate(cache):
        if isinstance(c, CacheList):
            out.extend((Slot(i, j), sub) for j, sub in enumerate(c.caches))
        else:
            out.append((Slot(i), c))
    return out


def refusal(cache: list) -> str | None:
    """Why a model whose working cache is `cache` cannot be served, or None (nothing computed)."""
    unknown = sorted(
        {type(c).__name__ for _, c in _slots(cache) if type(c) is not KVCache and type(c) not in STATE_KINDS}
    )
    if not unknown:
        return None
    kept = ", ".join(k.__name__ for k in (KVCache, *STATE_KINDS))
    return f"its layers keep {', '.join(unknown)} caches, a kind this server cannot keep (it keeps {kept})"


class ModelLayers:
    def __init__(self, model) -> None:
        """Sort the model's caches into kinds and probe their shapes with one token (a model
        `refusal` names is refused before this)."""
        self.model = model
        self.states = []
        attention_slots = [slot for slot, c in _slots(make_prompt_cache(model)) if type(c) is KVCache]
        probe = make_prompt_cache(model)
        model(mx.array([[0]]), cache=probe)
        mx.eval([c.state for _, c in _slots(probe) if type(c) is KVCache])
        by_shape: dict[KVShape, list[Slot]] = {}
        for slot in attention_slots:
            by_shape.setdefault(attention.shape_of([slot.get(probe)]), []).append(slot)
        self.groups = [
            ("" if g == 0 else f"g{g}/", slots, replace(shape, layers=len(slots)))
            for g, (shape, slots) in enumerate(by_shape.items())
        ]
        for slot, c in _slots(probe):
            kind = STATE_KINDS.get(type(c))
            if kind is not None:
                self.states.append((slot, kind, c, len(kind.take(c)[1])))
        self.has_state = bool(self.states)
        self.kinds = sorted({type(c).__name__ for _, c in _slots(probe)})

    def attach(self, model) -> None:
        """The model's weights, loaded again after `detach` (the same model: the same kinds)."""
        self.model = model

    def detach(self) -> None:
        """The weights are unloaded (engine/parts.py): the kinds and shapes stay known, so the
        warm tier keeps reading and deleting this model's files."""
        self.model = None

    # -- working caches -----------------------------------------------------------------

    def new_cache(self, working: KVPrecision) -> list:
        """A sequence's working cache: the model's own, attention layers at `working`."""
        cache = make_prompt_cache(self.model)
        if working.quantized:
            for _, slots, _ in self.groups:
                for slot in slots:
                    slot.put(cache, attention.new_layer(working))
        return cache

    def group_size_for(self, precisions: Precisions) -> int | None:
        """A quantization group size that divides every attention head size (mlx quantizes
        along it): the one asked for, else the largest of 128, 64, 32 that does; None if none."""
        dims = {d for _, _, shape in self.groups for d in (shape.k_dim, shape.v_dim)}
        asked = precisions.hot.group_size
        return next((g for g in (asked, 128, 64, 32) if all(d % g == 0 for d in dims)), None)

    @property
    def plain(self) -> bool:
        """Every layer keeps one plain KV cache: no window or recurrent state, no list of caches."""
        return not self.has_state and all(s.sub is None for _, slots, _ in self.groups for s in slots)

    def quantized_refusal(self, working: KVPrecision) -> str | None:
        """Why decoding cannot attend to quantized KV in this model (--decode-quantized), or None."""
        if not self.plain or len(self.groups) > 1:
            kinds = ", ".join(self.kinds)
            return f"--decode-quantized needs every layer to keep one plain KV cache; this model's layers keep {kinds}"
        try:
            self.model(mx.array([[0]]), cache=self.new_cache(working))
        except Exception as e:  # noqa: BLE001 - MLA's latent cache, for one, is not attention K/V
            return f"--decode-quantized: this model's attention cannot read quantized KV ({type(e).__name__}: {e})"
        return None

    def _attention_of(self, cache: list) -> dict[str, list]:
        return {prefix: [slot.get(cache) for slot in slots] for prefix, slots, _ in self.groups}

    # -- attention: blocks ------------------------------------------------------------------

    def cut_at(self, cache: list, start: int, end: int, stored: list[StoredRun], working: KVPrecision) -> BlockKV:
        return attention.cut_at(self._attention_of(cache), start, end, stored, working)

    def append(self, cache: list, parts: list[tuple[BlockKV, int]], working: KVPrecision) -> None:
        for prefix, caches in self._attention_of(cache).items():
            attention.append(caches, parts, working, prefix)
        mx.eval([c.state for caches in self._attention_of(cache).values() for c in caches])

    def block_layout(self, n: int, precision: KVPrecision) -> dict:
        """The tensors a block file of n tokens holds: every attention group's."""
        return {
            name: spec
            for prefix, _, shape in self.groups
            for name, spec in attention.block_layout(n, shape, precision, prefix).items()
        }

    def bytes_per_token(self, precision: KVPrecision) -> int:
        """One token's KV in every attention layer at this precision."""
        return layout_bytes(self.block_layout(1, precision))

    def block_from_numpy(self, arrays: dict, precision: KVPrecision) -> BlockKV:
        return BlockKV(self._from_numpy(arrays, self.block_layout(1, precision)), precision)

    # -- state: snapshots -------------------------------------------------------------------

    def take_snapshot(self, cache: list) -> Snapshot:
        """The state layers' caches where the cache is now (evaluated: it outlives the step)."""
        arrays = {}
        for n, (slot, kind, _, _) in enumerate(self.states):
            values, meta = kind.take(slot.get(cache))
            arrays.update({f"s{n}.{i}": a for i, a in enumerate(values)})
            arrays[f"s{n}.meta"] = mx.array(meta, dtype=mx.uint32)
        mx.eval(arrays)
        return Snapshot(arrays)

    def restore(self, cache: list, snapshot: Snapshot) -> None:
        """Put a snapshot's states into a working cache (its attention layers are not touched)."""
        for n, (slot, kind, _, _) in enumerate(self.states):
            prefix = f"s{n}."
            indexed = [
                (int(name[len(prefix) :]), a)
                for name, a in snapshot.arrays.items()
                if name.startswith(prefix) and name[len(prefix) :].isdigit()
            ]
            values = [a for _, a in sorted(indexed, key=lambda pair: pair[0])]
            slot.put(cache, kind.restore(values, snapshot.arrays[f"s{n}.meta"].tolist()))

    def state_bytes(self) -> int:
        """The most a sequence's window and recurrent layers hold: a snapshot's size once every
        window is full."""
        if not self.has_state:
            return 0
        layout = self.snapshot_layout(1 << 30)  # past any window
        return layout_bytes(layout)

    def snapshot_layout(self, position: int) -> dict:
        """The tensors a snapshot file at `position` holds."""
        out = {}
        for n, (_, kind, probed, meta_len) in enumerate(self.states):
            for i, (dtype, shape) in enumerate(kind.layout(probed, position)):
                out[f"s{n}.{i}"] = (SAFETENSORS_DTYPES[dtype], shape)
            out[f"s{n}.meta"] = ("U32", (meta_len,))
        return out

    def snapshot_from_numpy(self, arrays: dict, position: int) -> Snapshot:
        return Snapshot(self._from_numpy(arrays, self.snapshot_layout(position)))

    @staticmethod
    def _from_numpy(arrays: dict[str, np.ndarray], layout: dict) -> Payload:
        """MLX arrays from a file's numpy ones; bfloat16 travelled as its raw bytes (attention.VIEW_AS)."""
        out = {}
        for name, a in arrays.items():
            arr = mx.array(a)
            if layout.get(name, ("",))[0] == "BF16":
                arr = arr.view(mx.bfloat16)
            out[name] = arr
        return out

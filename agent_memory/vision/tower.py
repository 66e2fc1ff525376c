"""The vision half of a vision model, on the engine thread: mlx-vlm's model of the family, whose
vision tower and projector make an image's tokens' input embeddings. The language half is the
engine's own (mlx-lm's class, which takes `input_embeddings`), so a vision model keeps every layer
kind, snapshot and tier a text model has; the two share the token embedding table.

A prefill chunk with an image's tokens in it is computed from input embeddings: the chunk's token
embeddings with each image's rows put in (`chunk_embeddings`); any other chunk from its ids, as
for a text model. An image's rows depend on its pixels alone, not on where it is, so they are kept
by digest within a namespace (`Features`, within --vision-cache-mb: a tenant or cache salt never
finds another's): a prompt that repeats a recent image, anywhere, runs no vision tower for it; a prompt whose image tokens all come from cached KV runs none at all.
"""

from __future__ import annotations

import weakref
from collections import OrderedDict
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import agent_memory.blas  # noqa: F401
import mlx.core as mx

from agent_memory.vision.prompt import VisionInputs


@dataclass
class Features:
    """Recent images' input embeddings by digest, the least recently used dropped over the budget;
    its counts are /metrics' (engine/observability/metrics.py)."""

    budget_bytes: int
    rows: OrderedDict[str, mx.array] = field(default_factory=OrderedDict)
    nbytes: int = 0
    kept_images: int = 0  # images a prompt found here
    computed_images: int = 0  # images the tower computed
    tower_runs: int = 0  # vision tower passes (one per prompt whose images were not all here)

    def get(self, digest: str) -> mx.array | None:
        found = self.rows.get(digest)
        if found is not None:
            self.rows.move_to_end(digest)
        return found

    def put(self, digest: str, rows: mx.array) -> None:
        if digest in self.rows:
            self.nbytes -= self.rows.pop(digest).nbytes
        self.rows[digest] = rows
        self.nbytes += rows.nbytes
        while self.nbytes > self.budget_bytes:
            self.nbytes -= self.rows.popitem(last=False)[1].nbytes

    def clear(self) -> None:
        """The weights unloaded: the rows go with them (the counts stay)."""
        self.rows.clear()
        self.nbytes = 0


class VisionTower:
    def __init__(self, vlm: Any, features: Features) -> None:
        self.vlm = vlm  # mlx-vlm's Model: its language layers never evaluated (lazy), so never loaded
        self.features = features
        # Each prompt's images' rows while its request lives: a prompt's later chunks never run
        # the tower again, whatever the budget dropped meanwhile.
        self.held: weakref.WeakKeyDictionary[VisionInputs, dict[str, mx.array]] = weakref.WeakKeyDictionary()

    def chunk_embeddings(
        self, tokens: list[int], start: int, end: int, inputs: VisionInputs, scope: str | None
    ) -> mx.array | None:
        """The input embeddings of tokens[start:end] (1, n, hidden) when an image's tokens are among
        them, else None (its ids do). `scope`: the request's namespace (tenant, cache salt): kept
        features are found only within it, so no tenant learns from timing what another sent."""
        spans = [s for s in inputs.spans if s.start < end and s.end > start]
        if not spans:
            return None
        rows = self._rows(tokens, inputs, scope)
        embeds = self.vlm.get_input_embeddings(mx.array(tokens[start:end])[None]).inputs_embeds
        for s in spans:
            a, b = max(s.start, start), min(s.end, end)
            embeds[0, a - start : b - start] = rows[s.digest][a - s.start : b - s.start].astype(embeds.dtype)
        return embeds

    def _rows(self, tokens: list[int], inputs: VisionInputs, scope: str | None) -> dict[str, mx.array]:
        """The prompt's images' rows by digest: held, kept, or every image through the tower."""
        held = self.held.get(inputs)
        if held is None:
            kept = {s.digest: self.features.get(f"{scope}:{s.digest}") for s in inputs.spans}
            if all(r is not None for r in kept.values()):
                self.features.kept_images += len(kept)
                held = kept
            else:
                held = self._run(tokens, inputs, kept, scope)
            self.held[inputs] = held
        return held

    def _run(
        self, tokens: list[int], inputs: VisionInputs, kept: dict[str, mx.array | None], scope: str | None
    ) -> dict[str, mx.array]:
        """Every image of the prompt through the tower and projector, each one's rows kept by digest."""
        ids = mx.array(tokens)[None]
        arrays = {k: mx.array(v) for k, v in inputs.pixels.items()}
        embeds = self.vlm.get_input_embeddings(ids, mask=mx.ones(ids.shape, mx.int32), **arrays).inputs_embeds
        self.features.tower_runs += 1
        self.features.kept_images += sum(r is not None for r in kept.values())
        self.features.computed_images += sum(r is None for r in kept.values())
        rows = {s.digest: mx.contiguous(embeds[0, s.start : s.end]) for s in inputs.spans}  # not the prompt's buffer
        mx.eval(list(rows.values()))
        for digest, r in rows.items():
            self.features.put(f"{scope}:{digest}", r)
        return rows


def load_tower(path: Path, language_model: Any, features: Features) -> VisionTower:
    """The folder's vision half (mlx-vlm), sharing `language_model`'s token embeddings (mlx-lm's
    model of the same folder) so the table is held once."""
    from mlx_vlm.utils import load_model

    vlm = load_model(path, lazy=True)
    mine, theirs = _embeddings_holder(vlm), _embeddings_holder(language_model)
    if mine is not None and theirs is not None:
        mine.embed_tokens = theirs.embed_tokens
    return VisionTower(vlm, features)


def _embeddings_holder(model: Any) -> Any:
    """The module holding the token embeddings, as mlx-vlm's and mlx-lm's multimodal classes
    nest it (`language_model.model.embed_tokens`), or None."""
    inner = getattr(getattr(model, "language_model", None), "model", None)
    return inner if hasattr(inner, "embed_tokens") else None

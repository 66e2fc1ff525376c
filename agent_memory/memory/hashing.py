"""Block names: a hash chain over token ids.

A block is named `blake2b(salt; parent's name, token ids)`, the salt being the model
fingerprint, so a name fixes every token before the block and equal prefixes get equal names.
The chain starts from a root: sixteen zero bytes for the shared namespace, or a name derived
from a namespace (a tenant, a `cache_salt`) so that no block of one namespace can ever be
named like a block of another. No MLX and no pool here: the `cache` commands use it too.

Tokens do not always fix a block's KV: an image's placeholder tokens are the same for every
image, and an adapter or another rendering changes the KV of the same ids. A request names what
else fixes its KV as `SpanKey`s, each a key (an image's digest, say) over a span of its tokens;
a block whose tokens a span covers folds that span (relative to the block's first token) and key
into its name, in another blake2b domain, so it is never named like a block of tokens alone. A
block no span covers is named exactly as before: folders written before still read.
"""

from __future__ import annotations

import hashlib
import json
import struct
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

ROOT = b"\0" * 16


@dataclass(frozen=True, order=True)
class SpanKey:
    """What fixes the KV of tokens [start, end) beyond their ids (an image's digest, an adapter's
    name); in a block's name, relative to the block's first token (start may be negative)."""

    start: int
    end: int
    key: bytes


Extras = tuple[SpanKey, ...]  # sorted; () for tokens alone


def covering(extras: Sequence[SpanKey], start: int, end: int) -> Extras:
    """The spans over any of tokens [start, end), relative to `start`: what fixes that block."""
    return tuple(sorted(SpanKey(s.start - start, s.end - start, s.key) for s in extras if s.start < end and s.end > start))


def keys_at(extras: Extras, i: int) -> list[tuple[int, bytes]]:
    """What fixes position i of a block beyond its token id: each covering span's start and key."""
    return [(s.start, s.key) for s in extras if s.start <= i < s.end]


def namespace(tenant: str, cache_salt: str) -> str:
    """One string for a (tenant, cache salt) pair; "" for the shared namespace."""
    return json.dumps([tenant, cache_salt]) if tenant or cache_salt else ""


class BlockNames:
    def __init__(self, salt: str, block_tokens: int) -> None:
        self.salt = salt.encode()
        self.block_tokens = block_tokens

    def block_hash(self, parent: str | None, tokens: Sequence[int], extras: Extras = ()) -> str:
        """A block's name; `extras`: the spans over it, relative to its first token (covering)."""
        h = hashlib.blake2b(self.salt, digest_size=16, person=b"agent-memory-x" if extras else b"")
        h.update(bytes.fromhex(parent) if parent else ROOT)
        if extras:
            h.update(struct.pack("<I", len(tokens)))
        h.update(np.asarray(tokens, dtype="<u4").tobytes())
        for s in extras:
            h.update(struct.pack("<qqI", s.start, s.end, len(s.key)) + s.key)
        return h.hexdigest()

    def root(self, namespace: str) -> str | None:
        """The chain's starting parent for a namespace; None (zeros) for the shared one."""
        if not namespace:
            return None
        h = hashlib.blake2b(self.salt, digest_size=16, person=b"agent-memory-ns")
        h.update(namespace.encode("utf-8", "surrogatepass"))
        return h.hexdigest()

    def snapshot_name(self, prefix: str) -> str:
        """A snapshot's name: derived from the name of the prefix it is the state after, and
        never equal to a block's."""
        h = hashlib.blake2b(self.salt, digest_size=16, person=b"agent-memory-st")
        h.update(bytes.fromhex(prefix))
        return h.hexdigest()

    def prefix_name(
        self, chain: list[tuple[str, str | None, int, int]], tokens: Sequence[int], end: int, extras: Sequence[SpanKey] = ()
    ) -> str:
        """The name of tokens[:end] (end >= 1), given the chain of a sequence they begin: a
        block of the chain when `end` is a block's end, else the partial block before it."""
        h, parent, start, stop = chain[(end - 1) // self.block_tokens]
        return h if stop == end else self.block_hash(parent, tokens[start:end], covering(extras, start, end))

    def chain(
        self, tokens: Sequence[int], root: str | None = None, extras: Sequence[SpanKey] = ()
    ) -> list[tuple[str, str | None, int, int]]:
        """(hash, parent, start, end) of every block of `tokens`, the last one maybe partial;
        `extras`: the sequence's spans, by absolute position (none: tokens alone)."""
        out, parent = [], root
        for start in range(0, len(tokens), self.block_tokens):
            end = min(start + self.block_tokens, len(tokens))
            h = self.block_hash(parent, tokens[start:end], covering(extras, start, end))
            out.append((h, parent, start, end))
            parent = h
        return out

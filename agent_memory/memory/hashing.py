"""Block names: a hash chain over token ids.

A block is named `blake2b(salt; parent's name, token ids)`, the salt being the model
fingerprint, so a name fixes every token before the block and equal prefixes get equal names.
The chain starts from a root: sixteen zero bytes for the shared namespace, or a name derived
from a namespace (a tenant, a `cache_salt`) so that no block of one namespace can ever be
named like a block of another. No MLX and no pool here: the `cache` commands use it too.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Sequence

import numpy as np

ROOT = b"\0" * 16


def namespace(tenant: str, cache_salt: str) -> str:
    """One string for a (tenant, cache salt) pair; "" for the shared namespace."""
    return json.dumps([tenant, cache_salt]) if tenant or cache_salt else ""


class BlockNames:
    def __init__(self, salt: str, block_tokens: int) -> None:
        self.salt = salt.encode()
        self.block_tokens = block_tokens

    def block_hash(self, parent: str | None, tokens: Sequence[int]) -> str:
        h = hashlib.blake2b(self.salt, digest_size=16)
        h.update(bytes.fromhex(parent) if parent else ROOT)
        h.update(np.asarray(tokens, dtype="<u4").tobytes())
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

    def prefix_name(self, chain: list[tuple[str, str | None, int, int]], tokens: Sequence[int], end: int) -> str:
        """The name of tokens[:end] (end >= 1), given the chain of a sequence they begin: a
        block of the chain when `end` is a block's end, else the partial block before it."""
        h, parent, start, stop = chain[(end - 1) // self.block_tokens]
        return h if stop == end else self.block_hash(parent, tokens[start:end])

    def chain(self, tokens: Sequence[int], root: str | None = None) -> list[tuple[str, str | None, int, int]]:
        """(hash, parent, start, end) of every block of `tokens`, the last one maybe partial."""
        out, parent = [], root
        for start in range(0, len(tokens), self.block_tokens):
            end = min(start + self.block_tokens, len(tokens))
            h = self.block_hash(parent, tokens[start:end])
            out.append((h, parent, start, end))
            parent = h
        return out

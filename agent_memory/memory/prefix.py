"""SharedPrefixCache: find the longest cached prefix of a token sequence, at token granularity.

Blocks are named by a hash chain `H(salt, parent, tokens)`, the salt being the model
fingerprint, so a block's name fixes every token before it. A lookup hashes the request's
whole blocks and looks each up; where a block is gone but later ones remain, the gap is
recomputed from the request's own tokens (KV at a position depends only on the tokens before
it). At the first block never seen, the children of the last matching block are compared
token by token, so an edited or branched conversation reuses everything before the first
changed token, part of a block included.
"""

from __future__ import annotations

import hashlib
from collections.abc import Sequence

import numpy as np

from agent_memory.memory.blocks import Block, BlockPool, Tier


def common_prefix(a: Sequence[int], b: Sequence[int]) -> int:
    n = min(len(a), len(b))
    for i in range(n):
        if a[i] != b[i]:
            return i
    return n


class SharedPrefixCache:
    def __init__(self, pool: BlockPool, block_tokens: int, salt: str) -> None:
        self.pool = pool
        self.block_tokens = block_tokens
        self.salt = salt.encode()

    def block_hash(self, parent: str | None, tokens: Sequence[int]) -> str:
        h = hashlib.blake2b(self.salt, digest_size=16)
        h.update(bytes.fromhex(parent) if parent else b"\0" * 16)
        h.update(np.asarray(tokens, dtype="<u4").tobytes())
        return h.hexdigest()

    def chain(self, tokens: Sequence[int]) -> list[tuple[str, str | None, int, int]]:
        """(hash, parent, start, end) of every block of `tokens`, the last one maybe partial."""
        out, parent = [], None
        for start in range(0, len(tokens), self.block_tokens):
            end = min(start + self.block_tokens, len(tokens))
            h = self.block_hash(parent, tokens[start:end])
            out.append((h, parent, start, end))
            parent = h
        return out

    def match(self, tokens: Sequence[int]) -> list[tuple[Block | None, int]]:
        """(block or None for a gap, tokens used) from position 0, ending on a block with KV."""
        out: list[tuple[Block | None, int]] = []
        parent, pos = None, 0
        while pos + self.block_tokens <= len(tokens):
            h = self.block_hash(parent, tokens[pos : pos + self.block_tokens])
            block = self.pool.get(h)
            if block is None and h not in self.pool.children:
                break
            out.append((block, self.block_tokens))
            parent, pos = h, pos + self.block_tokens
        partial = self._best_child(parent, tokens[pos:])
        if partial is not None:
            out.append(partial)
        while out and (out[-1][0] is None or out[-1][0].tier is Tier.COLD):
            out.pop()
        return out

    def _best_child(self, parent: str | None, rest: Sequence[int]) -> tuple[Block, int] | None:
        best, best_n = None, 0
        for h in self.pool.children.get(parent, ()):
            block = self.pool.blocks[h]
            if block.tier is Tier.COLD:
                continue
            n = common_prefix(block.tokens, rest)
            if n > best_n:
                best, best_n = block, n
        return (best, best_n) if best is not None else None

"""PrefixMatcher: the longest cached prefix of a token sequence, at token granularity.

A lookup names the request's whole blocks (memory/hashing.py) and looks each up in the pool;
where a block is gone but later ones remain, the gap is recomputed from the request's own tokens
(KV at a position depends only on the tokens before it). At the first block never seen, the
children of the last matching block are compared token by token, so an edited or branched
conversation reuses everything before the first changed token, part of a block included.
"""

from __future__ import annotations

from collections.abc import Sequence

from agent_memory.memory.hashing import BlockNames, SpanKey, covering, keys_at
from agent_memory.memory.index.blocks import Block, BlockPool, Tier


def common_prefix(a: Sequence[int], b: Sequence[int]) -> int:
    n = min(len(a), len(b))
    for i in range(n):
        if a[i] != b[i]:
            return i
    return n


class PrefixMatcher:
    def __init__(self, pool: BlockPool, names: BlockNames) -> None:
        self.pool = pool
        self.names = names

    def match(
        self, tokens: Sequence[int], root: str | None = None, extras: Sequence[SpanKey] = ()
    ) -> list[tuple[Block | None, int]]:
        """(block or None for a gap, tokens used) from position 0, ending on a block with KV;
        `extras`: what fixes the request's KV beyond its tokens (memory/hashing.py)."""
        size = self.names.block_tokens
        out: list[tuple[Block | None, int]] = []
        parents = [root]  # parents[i]: the chain's name before out[i]
        parent, pos = root, 0
        while pos + size <= len(tokens):
            h = self.names.block_hash(parent, tokens[pos : pos + size], covering(extras, pos, pos + size))
            block = self.pool.get(h)
            if block is None and h not in self.pool.children:
                break
            out.append((block, size))
            parent, pos = h, pos + size
            parents.append(parent)
        partial = self._best_child(parent, tokens[pos:], covering(extras, pos, pos + size))
        if partial is not None:
            out.append(partial)
            return out
        trimmed = False
        while out and (out[-1][0] is None or out[-1][0].tier is Tier.COLD):
            out.pop()
            trimmed = True
        if trimmed:  # the chain ended in blocks without KV: another branch may cover part of the next
            pos = len(out) * size
            partial = self._best_child(parents[len(out)], tokens[pos:], covering(extras, pos, pos + size))
            if partial is not None:
                out.append(partial)
        return out

    def _best_child(self, parent: str | None, rest: Sequence[int], extras: tuple[SpanKey, ...]) -> tuple[Block, int] | None:
        """The child of `parent` sharing most of `rest`'s first tokens, each fixed alike beyond
        its id (`extras`: the request's spans over the block, relative to its start)."""
        best, best_n = None, 0
        for h in self.pool.children.get(parent, ()):
            block = self.pool.blocks[h]
            if block.tier is Tier.COLD:
                continue
            n = common_prefix(block.tokens, rest)
            if block.extras or extras:
                n = next((i for i in range(n) if keys_at(block.extras, i) != keys_at(extras, i)), n)
            if n > best_n:
                best, best_n = block, n
        return (best, best_n) if best is not None else None

"""Snapshots in the index (see blocks.py): the one a request resumes at, and which an agent keeps.

A model with window or recurrent layers can resume a prompt only where a snapshot of those
layers was taken, after exactly the prompt's first tokens. They are taken where agents come
back: the end of each turn (prompt and reply), the end of a prompt, and where a prompt stops
matching what another sequence cached (the head agents share: system prompt and tools). An
agent keeps its earliest (that shared head) and its latest two, its last turn's end and its
last prompt's: a returning agent resumes at the first of those its prompt still follows (its
reply sent back otherwise than it was written, or edited, falls back to the prompt's), a new
agent with the same head at the head. A snapshot is a fixed size, often the KV of thousands of
tokens: kept more densely, they would cost more memory than the blocks they save recomputing.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence

from agent_memory.memory.hashing import BlockNames, SpanKey
from agent_memory.memory.index.blocks import Block, BlockPool, Tier

KEPT_PER_AGENT = 3  # the earliest and the latest two


def find(
    pool: BlockPool, names: BlockNames, tokens: Sequence[int], root: str | None, limit: int, extras: Sequence[SpanKey] = ()
) -> Block | None:
    """The usable snapshot after the longest prefix of `tokens` up to `limit` tokens."""
    positions = sorted({s.start for s in pool.snapshots.values() if s.start <= limit}, reverse=True)
    if not positions:
        return None
    chain = names.chain(tokens[: positions[0]], root, extras)
    for position in positions:
        snapshot = pool.snapshots.get(names.prefix_name(chain, tokens, position, extras))
        if snapshot is not None and snapshot.tier is not Tier.COLD:
            return snapshot
    return None


def get_or_add(pool: BlockPool, names: BlockNames, prefix: str, position: int) -> Block:
    """The snapshot after the prefix named `prefix` (of `position` tokens), known from now on."""
    return pool.snapshots.get(prefix) or pool.add(
        Block(names.snapshot_name(prefix), prefix, (), position, snapshot=True)
    )


def along(
    pool: BlockPool, names: BlockNames, chain: list, tokens: Sequence[int], hashes: Iterable[str], extras: Sequence[SpanKey] = ()
) -> list[Block]:
    """Of the named snapshots, those still held that follow a prefix of `tokens` (`chain`: their blocks)."""
    out = {}
    for h in hashes:
        s = pool.get(h)
        if s is not None and s.tier is not Tier.COLD and s.start <= len(tokens):
            if names.prefix_name(chain, tokens, s.start, extras) == s.parent:
                out[h] = s
    return list(out.values())


def choose(snapshots: list[Block]) -> list[Block]:
    """The ones an agent keeps, by position: its earliest and its latest."""
    ordered = sorted(snapshots, key=lambda s: s.start)
    if len(ordered) <= KEPT_PER_AGENT:
        return ordered
    return [ordered[0], *ordered[len(ordered) - (KEPT_PER_AGENT - 1) :]]

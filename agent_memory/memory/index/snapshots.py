"""Snapshots in the index (see blocks.py): the one a request resumes at, and which an agent keeps.

A model with window or recurrent layers can resume a prompt only where a snapshot of those
layers was taken, after exactly the prompt's first tokens. They are taken where agents come
back: the end of each turn (prompt and reply), the end of a prompt, and where a prompt stops
matching what another sequence cached (the head agents share: system prompt and tools). An
agent keeps them by role, not by position: its earliest (that shared head), the one its latest
turn resumed from (`resumed`), the end of its latest client turn's prompt (`turn_start`: what
a resend or a retry after a disconnect or a crash resumes at, which no follow-up replaces) and
the end of its latest sequence (`turn_end`: where its next turn resumes). A returning agent
resumes at the latest of those its prompt still follows (its reply sent back otherwise than it
was written, or edited, falls back to the prompt's), a new agent with the same head at the
head. A snapshot is a fixed size, often the KV of thousands of tokens: kept more densely, they
would cost more memory than the blocks they save recomputing.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence

from agent_memory.memory.hashing import BlockNames, SpanKey
from agent_memory.memory.index.blocks import Block, BlockPool, Tier

RESUMED, TURN_START, TURN_END = "resumed", "turn_start", "turn_end"
ROLES = (RESUMED, TURN_START, TURN_END)  # besides the head, which is the earliest
KEPT_PER_AGENT = 1 + len(ROLES)


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


def assign(roles: dict[str, str], resumed: str | None, role: str, taken: str | None) -> dict[str, str]:
    """An agent's roles after a commit: the snapshot `taken` where it ends plays `role`, the one
    its turn resumed from `RESUMED`, the others as before (a follow-up, which names no resumed
    snapshot and ends at `TURN_END`, never replaces its client turn's `TURN_START`)."""
    return {**roles, **({RESUMED: resumed} if resumed else {}), **({role: taken} if taken else {})}


def choose(snapshots: list[Block], roles: dict[str, str]) -> tuple[list[Block], dict[str, str]]:
    """The ones an agent keeps, by role: its earliest (the head it shares) and those `roles`
    (role -> snapshot name) names among `snapshots`; returned by position, with the roles kept."""
    held = {s.hash: s for s in snapshots}
    kept = {role: h for role, h in roles.items() if role in ROLES and h in held}
    names = set(kept.values())
    if held:
        names.add(min(held.values(), key=lambda s: s.start).hash)
    return sorted((held[h] for h in names), key=lambda s: s.start), kept

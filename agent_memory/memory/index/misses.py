"""Why a prompt was not reused further: `explain`, called right after the store's lookup (under
its lock), compares the lease with what the memory held for this prompt — the agent's latest
sequence and the prompt's own chain of blocks in the pool — and names the first cause.

`at` is where the reuse stopped; when the memory knew the prompt's tokens past it, `lost` counts
them and the block (or snapshot) there says why they were not reused: its KV cooled out of the
tiers (`Block.cooled_by`), the same ids under another image (extra keys), or (window and recurrent
layers) no snapshot to resume at. Otherwise (and before a missing snapshot) the agent's history
was rewritten where its prompt leaves the agent's tokens, or the conversation is new. The cost
is one common prefix (slices compared) and the names of the prompt's blocks its agent's record
does not already give; text is decoded only for a rewrite."""

from __future__ import annotations

from collections.abc import Callable, Sequence

from agent_memory.agent_key import UNNAMED, AgentKey
from agent_memory.cache_miss import (
    ANOTHER_IMAGE, ANOTHER_MODEL, ANOTHER_NAMESPACE, EVICTED_DISK, EXCERPT_AFTER, EXCERPT_BEFORE,
    NEW_CONVERSATION, NO_SNAPSHOT, NONE, REWRITTEN, Miss,
)
from agent_memory.memory.hashing import SpanKey, covering
from agent_memory.memory.index.agents import AgentIndex
from agent_memory.memory.index.blocks import Block, Tier
from agent_memory.memory.index.prefix import common_prefix
from agent_memory.memory.index.store_records import AgentRecord, Lease

Decode = Callable[[Sequence[int]], str]


def explain(
    index: AgentIndex,
    agent: AgentKey | None,
    tokens: Sequence[int],
    root: str | None,
    extras: Sequence[SpanKey],
    lease: Lease,
    decode: Decode,
    state_layers: bool,
) -> Miss:
    """The miss of a prompt (`tokens`: the part its lookup covered) given its `lease`; the
    caller holds the index's lock."""
    cached = sum(s.end - s.start for s in lease.segments if s.block is not None)
    at = next((s.start for s in lease.segments if s.block is None), lease.end)
    record = index.agents.get(agent) if agent is not None else None
    if record is not None and record.root != root:
        same = common_prefix(record.tokens, tokens)
        return Miss(ANOTHER_NAMESPACE, at, max(0, same - cached)) if same > at else Miss(NEW_CONVERSATION, at)
    extras = tuple(sorted(extras))
    followed = _common(record.tokens, tokens) if record is not None else 0
    names = _names_held(index, record, lease, tokens, root, extras, followed)
    in_pool = next((start for h, start in names if h not in index.pool), len(tokens))
    known = max(followed, in_pool)
    rewritten = record is not None and followed < min(len(record.tokens), len(tokens))  # not a resend's prefix
    if known > at:
        why = _lost_why(index, record, names, at, known, extras, followed, state_layers)
        if why == ANOTHER_IMAGE:
            return Miss(why, at, max(0, known - cached), _images(record, extras, at))
        if why is not None and not (why == NO_SNAPSHOT and rewritten):  # a rewrite says more than its snapshot
            return Miss(why, at, max(0, known - cached))
    if rewritten:
        return Miss(REWRITTEN, followed, len(record.tokens) - followed, _excerpt(record, tokens, followed, decode))
    unnamed = agent is None or agent.kind == UNNAMED  # a new unnamed conversation: no history to follow
    if record is not None or (unnamed and at >= len(tokens)):
        return Miss(NONE, at)
    folder = _held_elsewhere(index, agent)
    if folder is not None:
        return Miss(ANOTHER_MODEL, at, 0, {"folder": folder})
    return Miss(NEW_CONVERSATION, at)


def _common(a: Sequence[int], b: Sequence[int], step: int = 256) -> int:
    """common_prefix, a slice compare (C speed) of `step` tokens at a time."""
    n, i = min(len(a), len(b)), 0
    while i < n and a[i : i + step] == b[i : i + step]:
        i += step
    return min(n, i + common_prefix(a[i : i + step], b[i : i + step]))


def _names_held(
    index: AgentIndex,
    record: AgentRecord | None,
    lease: Lease,
    tokens: Sequence[int],
    root: str | None,
    extras: tuple[SpanKey, ...],
    followed: int,
) -> list[tuple[str, int]]:
    """(name, start) of the prompt's blocks from the first, up to the first the pool does not
    hold. Without extra keys, a whole block the lease reused, or one where the prompt follows
    its agent's record, is named as that block is: only the rest is hashed."""
    size, out, parent, start = index.names.block_tokens, [], root, 0
    whole = [s for s in lease.segments if s.block is not None and s.end - s.start == size and not s.block.extras]
    named = {} if extras else {s.start: s.block.hash for s in whole}
    if record is not None and not extras and not record.extras:
        named.update((i * size, h) for i, h in enumerate(record.blocks[: followed // size]))
    while start < len(tokens):
        end = min(start + size, len(tokens))
        if end - start == size and start in named:
            h = named[start]
        else:
            h = index.names.block_hash(parent, tokens[start:end], covering(extras, start, end))
        out.append((h, start))
        if h not in index.pool:
            break
        parent, start = h, end
    return out


def _lost_why(
    index: AgentIndex,
    record: AgentRecord | None,
    names: list[tuple[str, int]],
    at: int,
    known: int,
    extras: tuple[SpanKey, ...],
    followed: int,
    state_layers: bool,
) -> str | None:
    """Why tokens [at, known), which the memory held, were not reused; None if nothing says."""
    size = index.names.block_tokens
    i = at // size
    mine = index.pool.get(names[i][0]) if i < len(names) else None
    theirs = index.pool.get(record.blocks[i]) if record is not None and i < len(record.blocks) else None
    if mine is None and theirs is not None and at < followed:
        start, end = i * size, min((i + 1) * size, followed)
        if covering(record.extras, start, end) != covering(extras, start, end):
            return ANOTHER_IMAGE
    block = mine or theirs
    if block is None:
        return None
    if block.tier is Tier.COLD:
        return _cooled(block)
    if not state_layers:
        return None
    # A state resumes only at a snapshot after a gapless run: a block cooled on the way, or the
    # snapshot itself, says more than the missing snapshot.
    held = [index.pool.get(h) for h, start in names[i:] if start < known]
    snapshots = [index.pool.blocks[h] for h in record.snapshots] if record is not None else []
    cooled = [b for b in [*held, *snapshots] if b is not None and at < b.end <= known and b.tier is Tier.COLD]
    return _cooled(min(cooled, key=lambda b: b.start)) if cooled else NO_SNAPSHOT


def _images(record: AgentRecord, extras: tuple[SpanKey, ...], at: int) -> dict[str, str]:
    """The digests of the image the memory held and of the one sent, at the first span from
    `at` (the block's start) where they differ; hex, as chat/images.py writes an image's digest."""
    held = {(s.start, s.end): s.key for s in record.extras}
    sent = next((s for s in extras if s.end > at and held.get((s.start, s.end)) != s.key), None)
    if sent is None:
        return {}
    return {"cached": held.get((sent.start, sent.end), b"").hex(), "sent": sent.key.hex(), "image_at": str(sent.start)}


def _cooled(block: Block) -> str:
    """How a COLD block lost its KV; one restored without a file was not on disk either."""
    return block.cooled_by or EVICTED_DISK


def _excerpt(record: AgentRecord, tokens: Sequence[int], at: int, decode: Decode) -> dict[str, str]:
    """The memory's text and the prompt's around where they part (the agent's own tenant's)."""
    start = max(0, at - EXCERPT_BEFORE)
    return {
        "cached": decode(record.tokens[start : at + EXCERPT_AFTER]),
        "sent": decode(tokens[start : at + EXCERPT_AFTER]),
    }


def _held_elsewhere(index: AgentIndex, agent: AgentKey | None) -> str | None:
    """A named agent unknown here: the warm folder of another model (or precision) holding its
    manifest, if this model's warm tier is a folder (a shared tier is left out)."""
    warm = index.warm
    if agent is None or warm is None or warm.folder is None:
        return None
    return warm.folder.holding_elsewhere(agent)

"""Keep-until, the eviction priority clients ask for: the blocks up to an Anthropic
`cache_control` breakpoint for its ttl, an agent's whole memory for OpenAI's
`prompt_cache_retention` (hot only for `in_memory`, hot and on disk for `24h`). Until then such
a block leaves its tier after every block not so kept (eviction.py): a priority, never an
exemption, so the budgets hold. Times are wall-clock, as a manifest keeps them across restarts."""

from __future__ import annotations

import time
from collections.abc import Iterable, Sequence

from agent_memory.agent_key import AgentKey
from agent_memory.memory.hashing import SpanKey
from agent_memory.memory.index.agents import AgentIndex
from agent_memory.memory.index.blocks import Block
from agent_memory.memory.warm.format.records import Manifest


def keep_prefix(
    store: AgentIndex, tokens: Sequence[int], root: str | None, extras: Sequence[SpanKey], until: float
) -> None:
    """Keep the blocks holding `tokens` (and the snapshot where they end) hot with priority
    until `until`: those the store holds now."""
    with store.lock:
        chain = store.names.chain(tokens, root, tuple(sorted(extras)))
        held = [store.pool.get(h) for h, *_ in chain]
        if chain:
            held.append(store.pool.snapshots.get(chain[-1][0]))
        _keep(filter(None, held), until, 0.0)


def keep_agent(store: AgentIndex, agent: AgentKey, now: float, seconds: float = 0.0, disk: bool = False) -> float:
    """Extend the agent's keep-until by its request's retention (`seconds`, on `disk` too), and
    keep every block of its latest sequence so; the time its warm copies are kept until (0: not
    asked), for its manifest."""
    with store.lock:
        record = store.agents.get(agent)
        if record is None:
            return 0.0
        if seconds:
            record.keep_until = max(record.keep_until, now + seconds)
            if disk:
                record.keep_on_disk_until = max(record.keep_on_disk_until, now + seconds)
        if max(record.keep_until, record.keep_on_disk_until) > now:
            blocks = (store.pool.blocks[h] for h in [*record.blocks, *record.snapshots])
            _keep(blocks, max(record.keep_until, record.keep_on_disk_until), record.keep_on_disk_until)
        return record.keep_on_disk_until if record.keep_on_disk_until > now else 0.0


def restored(store: AgentIndex, manifests: Iterable[Manifest]) -> None:
    """After a start's restore: the agents whose manifests keep them on disk (`24h`) still do."""
    now = time.time()
    for manifest in manifests:
        if manifest.keep_until > now and manifest.key in store.agents:
            record = store.agents[manifest.key]
            record.keep_until = record.keep_on_disk_until = manifest.keep_until
            keep_agent(store, manifest.key, now)


def _keep(blocks: Iterable[Block], hot: float, disk: float) -> None:
    for block in blocks:
        block.keep_until = max(block.keep_until, hot)
        block.keep_on_disk_until = max(block.keep_on_disk_until, disk)

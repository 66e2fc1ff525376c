"""What this server learns from a shared warm tier (several servers on one Redis).

Agents are not restored at start but probed when a request arrives: `discover` asks the
tier, on its reader thread, for the agent's manifest if another server wrote a newer one
and for the request's blocks this server lacks; `apply` adopts the answers into the index
(agents.py) on the engine thread (adopting may free hot KV), before the request is planned.
Manifest versions (etags) keep a stale answer from replacing a newer turn
(memory/warm/redis/backend.py writes them atomically).

A request waits for the answer at most WAIT_S, and not at all while the tier is skipped
(memory/warm/watch.py): a hung tier never holds up an agent whose prompt is in memory, and
one that is not is recomputed. A request that leaves (or stops waiting) drops its question.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Sequence
from concurrent.futures import Future, InvalidStateError
from dataclasses import dataclass, field

from agent_memory.agent_key import AgentKey
from agent_memory.memory.hashing import SpanKey, covering
from agent_memory.memory.index.agents import AgentIndex
from agent_memory.memory.index import snapshots
from agent_memory.memory.index.blocks import Block, Tier
from agent_memory.memory.index.store_records import Turn
from agent_memory.memory.warm.backend import Probe
from agent_memory.memory.warm.tier import WarmTier

log = logging.getLogger(__name__)

WAIT_S = 2.0  # the longest a request waits for the shared tier's answer before it is planned


@dataclass
class Discovery:
    """A request's question to the shared warm tier, answered on the reader thread."""

    agent: AgentKey | None
    tokens: Sequence[int]
    unknown: list[tuple[str, str | None, int, int]]  # chain entries not usable here, asked about
    future: Future  # the answer
    extras: tuple[SpanKey, ...]  # what fixes the request's KV beyond its tokens (memory/hashing.py)
    waited: Future = field(default_factory=Future)  # done at the answer, or after WAIT_S without one
    timer: threading.Timer | None = None

    def stop_waiting(self) -> None:
        """The request goes on without the answer (a question not asked yet is dropped)."""
        if self.timer is not None:
            self.timer.cancel()
        self.future.cancel()
        try:
            self.waited.set_result(None)
        except InvalidStateError:  # answered meanwhile
            pass

    def answered(self, future: Future) -> None:
        if self.timer is not None:
            self.timer.cancel()
        try:
            if future.cancelled() or future.exception() is None:
                self.waited.set_result(None)
            else:
                self.waited.set_exception(future.exception())
        except InvalidStateError:  # stopped waiting first
            pass


class SharedTierSync:
    def __init__(self, index: AgentIndex, tier: WarmTier) -> None:
        """index: what the answers change (the store); tier: the shared tier asked."""
        self.index = index
        self.tier = tier
        self._discoveries: list[Discovery] = []

    def discover(
        self, agent: AgentKey | None, tokens: Sequence[int], root: str | None, extras: Sequence[SpanKey] = ()
    ) -> Future | None:
        """With a shared warm tier, ask it (on the reader thread) for what this server may lack
        for a request: the agent's manifest if it changed since this server last saw it (a turn
        served by another server), and which of the request's blocks it holds. None when there
        is nothing to ask: no shared tier, or one skipped, or every block is here and the
        agent's latest turn is this server's own, still being written. The request is planned
        once it is answered, or after WAIT_S (the Future is done then)."""
        index = self.index
        if self.tier.watch.skipped:
            return None
        with index.lock:
            unknown = [
                entry
                for entry in index.names.chain(tokens, root, extras)
                if (block := index.pool.get(entry[0])) is None or block.tier is Tier.COLD
            ]
            record = index.agents.get(agent) if agent is not None else None
            ask = agent is not None and (record is None or record.etag == record.stored)
            if not unknown and not ask:
                return None
            known = record.stored if record is not None else None
            future = self.tier.probe(agent if ask else None, known, [h for h, *_ in unknown])
            d = Discovery(agent if ask else None, tokens, unknown, future, tuple(sorted(extras)))
            self._discoveries.append(d)
        d.timer = threading.Timer(WAIT_S, d.stop_waiting)
        d.timer.daemon = True
        d.timer.start()
        future.add_done_callback(d.answered)
        return d.waited

    def drop(self, waited: Future) -> None:
        """A request that left: its question is not asked (if it was not yet)."""
        with self.index.lock:
            for d in self._discoveries:
                if d.waited is waited:
                    d.stop_waiting()

    def apply(self) -> None:
        """Adopt what the shared tier answered (on the engine thread: it may free hot KV)."""
        with self.index.lock:
            done, waiting = [], []
            for d in self._discoveries:  # one pass: a future may finish on the reader meanwhile
                (done if d.future.done() else waiting).append(d)
            self._discoveries = waiting
            for d in done:
                if d.future.cancelled():
                    continue
                if d.future.exception() is not None:
                    log.info("the shared warm tier did not answer (%s): serving from memory", d.future.exception())
                    continue
                self._adopt(d, d.future.result())

    def _adopt(self, d: Discovery, probe: Probe) -> None:
        """Blocks the shared tier holds become WARM here; a newer manifest becomes the agent's
        record (an older one never does: its version is compared with what was known when
        asked, and a write of ours still queued means ours is newer)."""
        index = self.index
        for h, parent, start, end in d.unknown:
            size = probe.sizes.get(h)
            if size:
                block = index.pool.get(h) or index.pool.add(
                    Block(h, parent, tuple(d.tokens[start:end]), start, extras=covering(d.extras, start, end))
                )
                if not block.disk_bytes:
                    index.pool.set_disk(block, size)
        if d.agent is None or probe.manifest is True:
            return
        record = index.agents.get(d.agent)
        if record is not None and (record.etag != record.stored or record.stored != probe.known):
            return  # this server committed a turn of the agent since it asked
        if probe.manifest is None:
            if record is not None and record.stored is not None:
                index.forget(d.agent)  # ended by another server or `cache rm`: a delete wins
            return
        manifest, etag = probe.manifest
        chain = index.names.chain(manifest.tokens, manifest.root, manifest.extras)
        if manifest.fingerprint != self.tier.fingerprint or [h for h, *_ in chain] != manifest.blocks:
            log.warning("the shared tier's manifest of an agent does not match its tokens: ignored")
            return
        now_wall, now = time.time(), time.monotonic()
        last_used = now - max(0.0, now_wall - manifest.last_used)
        asked = {h for h, *_ in d.unknown}
        blocks = []
        for h, parent, start, end in chain:
            block = index.pool.get(h) or index.pool.add(
                Block(h, parent, tuple(manifest.tokens[start:end]), start, last_used=last_used,
                      extras=covering(manifest.extras, start, end))
            )
            if block.tier is Tier.COLD and h not in asked:
                # Not asked about (outside this request): held there, presumably; a miss on
                # reading it is recomputed like a damaged file.
                index.pool.set_disk(block, self.tier.file_bytes(self.tier.layout(block)))
            blocks.append(block)
        kept = []
        for position, h in manifest.snapshots:  # held there, presumably, like blocks outside the request
            prefix = index.names.prefix_name(chain, manifest.tokens, position, manifest.extras)
            if h == index.names.snapshot_name(prefix) and self.tier.snapshot_layout is not None:
                kept.append(snapshots.get_or_add(index.pool, index.names, prefix, position))
                if kept[-1].tier is Tier.COLD:
                    index.pool.set_disk(kept[-1], self.tier.file_bytes(self.tier.layout(kept[-1])))
        roles = {r: h for r, h in manifest.roles.items() if h in {s.hash for s in kept}}
        index.point_agent(
            d.agent, list(manifest.tokens), blocks, manifest.root, kept, manifest.extras, roles, Turn(*manifest.turn)
        )
        record = index.agents[d.agent]
        record.etag = record.stored = etag
        record.last_used = manifest.last_used

    def manifest_written(self, agent: AgentKey, etag: str, ok: bool) -> None:
        """The writer's word on a manifest: in the shared tier now, or given way to a later
        or other turn there (this server's record is then stale: its next turn adopts that)."""
        with self.index.lock:
            record = self.index.agents.get(agent)
            if record is None:
                return
            if ok:
                record.stored = etag
            elif record.etag == etag:
                record.etag = record.stored = None

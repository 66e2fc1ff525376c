"""AgentIndex: which blocks each agent's latest sequence uses, over the pool of blocks, under
one lock. Two writers change it: the store (store.py), as this server's requests run and end,
and the shared tier's sync (shared_sync.py), as other servers' turns arrive; HTTP handlers read
it (`agent_info`, `all_agents`). An agent holds a reference on each of its blocks; a block no
agent refers to lives on only in memory, for anonymous reuse. A request that names no agent is
given the unnamed conversation it continues (`recognise`: conversations.py)."""

from __future__ import annotations

import secrets
import threading
from collections.abc import Sequence

from agent_memory.agent_key import AGENT, RESPONSE, UNNAMED, AgentKey
from agent_memory.cache_miss import Miss
from agent_memory.memory.hashing import BlockNames, SpanKey
from agent_memory.memory.index import holds
from agent_memory.memory.index.blocks import Block, BlockPool, Tier
from agent_memory.memory.index.conversations import ConversationIndex
from agent_memory.memory.index.eviction import retention_weight
from agent_memory.memory.index.prefix import common_prefix
from agent_memory.memory.index.store_records import AgentInfo, AgentRecord, Turn
from agent_memory.memory.warm.format.records import Manifest
from agent_memory.memory.warm.tier import WarmTier


class AgentIndex:
    def __init__(self, *, block_tokens: int, salt: str, warm: WarmTier | None) -> None:
        """warm: the tier holding blocks' copies, whose copies of blocks nobody uses go (unless
        it is shared: other servers' agents may name them, and its manifests count them)."""
        self.lock = threading.RLock()
        self.pool = BlockPool()
        self.names = BlockNames(salt, block_tokens)
        self.agents: dict[AgentKey, AgentRecord] = {}
        self.conversations = ConversationIndex(self.names)
        self.warm = warm
        self.shared = warm is not None and warm.shared

    def known_prefix(self, agent: AgentKey | None, tokens: Sequence[int]) -> int:
        """How much of `tokens` the agent's own last sequence covers: a cheap guess at what is
        cached, for ordering work (the lookup proper comes later, when the work starts)."""
        with self.lock:
            record = self.agents.get(agent) if agent is not None else None
            return common_prefix(record.tokens, tokens) if record is not None else 0

    def recognise(self, tokens: Sequence[int], root: str | None, tenant: str, extras: Sequence[SpanKey] = ()) -> AgentKey:
        """The unnamed conversation a request that names no agent continues, or a new one
        (conversations.py); `root`: its namespace, of `tenant` and its cache salt."""
        extras = tuple(sorted(extras))
        chain = self.names.chain(tokens, root, extras)
        with self.lock:
            return self.conversations.recognise(tokens, chain, root, tenant, self.agents, extras)

    def started(self, agent: AgentKey, prompt: int) -> Turn:
        """The agent's turn once a client turn committed `prompt` tokens: a new one unless it
        is its latest turn again (a resend or a retry). The caller holds the lock (store.commit)."""
        old = self.agents.get(agent)
        if old is None:
            return Turn(prompt, 1)
        return Turn(prompt, old.turns + (prompt != old.turn_start))

    def point_agent(
        self,
        agent: AgentKey,
        tokens: list[int],
        blocks: list[Block],
        root: str | None,
        snapshots: Sequence[Block] = (),
        extras: tuple[SpanKey, ...] = (),
        roles: dict[str, str] | None = None,
        turn: Turn | None = None,
    ) -> None:
        """Make `blocks` (and `snapshots` along them, `roles` naming some: snapshots.py) the
        agent's latest sequence, keeping its manifest versions; `turn`: where its latest client
        turn started, if this is one (else as before)."""
        old = self.agents.get(agent)
        turn = turn or (Turn(old.turn_start, old.turns) if old is not None else Turn(0, 0))
        record = self.agents[agent] = AgentRecord(
            tokens, [b.hash for b in blocks], root, snapshots=[s.hash for s in snapshots], roles=dict(roles or {}),
            extras=extras, turn_start=turn.start, turns=turn.count,
        )
        weight = retention_weight(agent.kind, record.turns)
        for block in [*blocks, *snapshots]:
            block.refs += 1
            block.weight += weight
            block.orphan = False
        if old is not None:
            record.etag, record.stored, record.misses = old.etag, old.stored, old.misses
            record.keep_until, record.keep_on_disk_until = old.keep_until, old.keep_on_disk_until
            holds.move_hold(self.pool, old, record)  # a pinned agent's new blocks are held instead
            self._unref([*old.blocks, *old.snapshots], retention_weight(agent.kind, old.turns))
        self.conversations.file(agent, record)

    def still_used(self, hashes: list[str]) -> set[str]:
        """Of blocks a shared tier's manifests no longer name, those this server still uses."""
        with self.lock:
            return {h for h in hashes if (b := self.pool.get(h)) is not None and (b.refs or b.pins)}

    def manifest(self, agent: AgentKey) -> tuple[Manifest, str | None, str | None]:
        """The agent's record as the warm tier stores it, with the version it replaces and its
        own (a shared tier's compare-and-set: a new version each time; else None, None)."""
        record = self.agents[agent]
        manifest = Manifest(
            agent, self.warm.fingerprint, record.tokens, record.blocks, record.last_used, root=record.root,
            snapshots=[(self.pool.blocks[h].start, h) for h in record.snapshots], extras=record.extras,
            roles=record.roles, pinned=record.pinned, turn=Turn(record.turn_start, record.turns),
        )
        if not self.shared:
            return manifest, None, None
        base, record.etag = record.etag, secrets.token_hex(8)
        return manifest, base, record.etag

    def note_miss(self, agent: AgentKey, miss: Miss) -> None:
        """Keep a request's miss with its agent's record (none once the agent was ended)."""
        with self.lock:
            if (record := self.agents.get(agent)) is not None:
                record.misses.append(miss)

    def forget(self, agent: AgentKey) -> bool:
        """Drop an agent here only (the shared tier no longer has it); whether it was here."""
        record = self.agents.pop(agent, None)
        if record is not None:
            holds.hold(self.pool, record, -1 if record.pinned else 0)
            self.conversations.remove(agent)
            self._unref([*record.blocks, *record.snapshots], retention_weight(agent.kind, record.turns))
        return record is not None

    def drop_cold_one_offs(self) -> None:
        """Unnamed one-offs none of whose blocks has KV left in any tier go, manifest and all:
        the first agents to leave under the budgets (eviction.retention_weight)."""
        for key, record in list(self.agents.items()):
            if key.kind == UNNAMED and record.turns < 2:
                if all(self.pool.blocks[h].tier is Tier.COLD for h in record.blocks):
                    self.forget(key)
                    if self.warm is not None:
                        self.warm.delete_agent(key)

    def _unref(self, hashes: Sequence[str], weight: float) -> None:
        """Drop an agent's references. Blocks it alone held and no longer uses go at once: a
        superseded tail, the end of a reply that re-tokenized differently, an abandoned branch.
        Kept, they would be memory that no request of the agent's can reach any more."""
        for h in hashes:
            block = self.pool.blocks[h]
            block.refs -= 1
            block.weight -= weight
            block.orphan = not block.refs  # pinned meanwhile, it goes with its last pin
            self.drop_if_unused(block, forget=True)

    def drop_if_unused(self, block: Block, forget: bool = False) -> None:
        """A block no agent refers to lives on only in memory, for anonymous reuse (unless its
        last agent let go of it while it was pinned: `Block.orphan`)."""
        if block.refs or block.pins:
            return
        if block.disk_bytes:
            if not self.shared:  # other servers' agents may name it: manifests count them there
                self.warm.delete_block(block.hash)
            self.pool.drop_disk(block)
        if forget or block.orphan or block.tier is not Tier.HOT:
            self.pool.remove(block)

    # -- what the API shows ----------------------------------------------------------------

    def agent_info(self, agent: AgentKey) -> AgentInfo | None:
        with self.lock:
            record = self.agents.get(agent)
            if record is None:
                return None
            blocks = [self.pool.blocks[h] for h in record.blocks]
            by_tier = {t.value: 0 for t in Tier}
            for b in blocks:
                by_tier[b.tier.value] += 1
            snapshots = [s for h in record.snapshots if (s := self.pool.blocks[h]).tier is not Tier.COLD]
            held = [*blocks, *snapshots]
            return AgentInfo(
                id=agent.id,
                tokens=len(record.tokens),
                blocks=by_tier,
                hot_bytes=sum(b.hot_bytes for b in held),
                exact_bytes=sum(b.hot_bytes for b in held if b.exact),
                disk_bytes=sum(b.disk_bytes for b in held),
                last_used=record.last_used,
                snapshots=len(snapshots),
                snapshot_bytes=sum(s.hot_bytes for s in snapshots),
                misses=list(record.misses),
                pinned=bool(record.pinned),
                kind=agent.kind,
                turns=record.turns,
                keep_until=record.keep_until,
                keep_on_disk_until=record.keep_on_disk_until,
            )

    def counts(self, tenant: str | None = None) -> dict[str, int]:
        """How many agents and stored responses this server holds, every tenant's (None) or
        one tenant's: the one count /v1/agents' totals, /metrics, the dashboard and the start
        log all show."""
        with self.lock:
            held = [a for a in self.agents if tenant is None or a.tenant == tenant]
            responses = sum(1 for a in held if a.kind == RESPONSE)
            return {"agents": sum(1 for a in held if a.kind in (AGENT, UNNAMED)), "stored_responses": responses}

    def all_agents(self, tenant: str | None = "", kinds: tuple[str, ...] = (AGENT, UNNAMED)) -> list[AgentInfo]:
        """A tenant's agents, named and unnamed (None: every tenant's), or its heads (`kinds`
        (HEAD,)); stored responses are not agents."""
        with self.lock:
            return [
                self.agent_info(a)
                for a in sorted(self.agents)
                if (tenant is None or a.tenant == tenant) and a.kind in kinds
            ]

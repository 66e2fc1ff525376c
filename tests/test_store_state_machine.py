"""The store's invariants (docs/architecture.md) under random commits, lookups, branches,
evictions, agent ends, pins and concurrent running sequences, in several namespaces (tenants, cache
salts), checked after every step; for a model with state layers too, whose commits take
snapshots and whose lookups resume only at one (memory/index/snapshots.py)."""

from __future__ import annotations

from dataclasses import dataclass, field

from hypothesis import HealthCheck, settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, initialize, invariant, precondition, rule

from agent_memory.agent_key import UNNAMED, AgentKey
from agent_memory.memory.hashing import namespace
from agent_memory.memory.index.blocks import Tier
from agent_memory.memory.index.conversations import continues
from agent_memory.memory.index.eviction import retention_weight
from agent_memory.memory.index.prefix import common_prefix
from agent_memory.memory.index.snapshots import KEPT_PER_AGENT, ROLES, TURN_END, TURN_START
from agent_memory.memory.index.store import AgentCacheStore

BYTES_PER_TOKEN = 10
SNAPSHOT_BYTES = 25  # a fixed size, whatever the position
AGENTS = st.sampled_from([AgentKey("a"), AgentKey("b"), AgentKey("a", "t2"), AgentKey("c", "t2"), None])
SALTS = st.sampled_from(["", "salt"])  # an anonymous request's namespace: its cache_salt
TOKENS = st.lists(st.integers(0, 3), max_size=14)  # a small alphabet makes shared prefixes


@dataclass(frozen=True)
class FakeKV:
    """Stands in for the engine's KV: it remembers which tokens it was cut for."""

    tokens: tuple[int, ...]
    exact: bool = False


def demote(kv: FakeKV) -> tuple[FakeKV, int]:
    assert kv.exact, "only exact KV is demoted"
    return FakeKV(kv.tokens), len(kv.tokens) * BYTES_PER_TOKEN


@dataclass
class Running:
    tokens: list[int]
    lease: object
    hot_at_lookup: list
    agent: AgentKey | None  # a request looks up and commits in one namespace
    salt: str
    snapshots: list[str] = field(default_factory=list)  # taken for no agent on its way: pinned until it ends
    held: list[str] = field(default_factory=list)  # what it leased of pinned agents' blocks: hot until it ends


class StoreMachine(RuleBasedStateMachine):
    @initialize(budget_tokens=st.integers(0, 60), block_tokens=st.sampled_from([2, 3, 4]), state=st.booleans())
    def setup(self, budget_tokens, block_tokens, state):
        self.store = AgentCacheStore(
            block_tokens=block_tokens,
            salt="fingerprint",
            hot_budget_bytes=budget_tokens * BYTES_PER_TOKEN,
            attention_tokens=50.0,
            demote=demote,
            state_layers=state,
        )
        self.seen: list[list[int]] = []
        self.running: list[Running] = []
        self.ended: set[AgentKey] = set()
        self.namespace_of: dict[str, str | None] = {}  # block hash -> the root it was named under
        self.tenant_of: dict[str | None, str] = {}  # root -> the tenant whose namespace it is

    def _root(self, agent, salt: str = "") -> str | None:
        return self.store.names.root(namespace(agent.tenant if agent else "", salt))

    def _commit(self, agent, tokens, salt="", snapshot=False, run: Running | None = None, role=TURN_END):
        """As engine/commit.py does; a snapshot taken for no agent is pinned until its sequence
        (`run`, else one that ends now) lets go of it."""

        def cut(start, end):  # computed KV is exact, at twice the bytes of its cooled form
            return FakeKV(tuple(tokens[start:end]), exact=True), 2 * (end - start) * BYTES_PER_TOKEN, True

        def take():
            return FakeKV(()), SNAPSHOT_BYTES

        root, tenant = self._root(agent, salt), agent.tenant if agent else ""
        taker = take if snapshot and self.store.state_layers else None
        made, resumed = (run.snapshots, run.lease.snapshot) if run is not None else ((), None)
        resumed = resumed.hash if resumed is not None and role == TURN_START else None
        persist = self.store.commit(
            agent, tokens, cut, root, taker, made, tenant=tenant, role=role, resumed=resumed
        )
        self.namespace_of.update({h: root for h, *_ in self.store.names.chain(tokens, root)})
        self.tenant_of[root] = tenant
        if persist.snapshot is not None:
            self.namespace_of[persist.snapshot] = root
            if agent is None and run is not None:
                run.snapshots.append(persist.snapshot)
            elif agent is None:
                self.store.let_go([persist.snapshot])
        self.seen.append(tokens)
        if agent is not None:
            self.ended.discard(agent)

    @staticmethod
    def _salt(run: Running) -> str:
        """The cache salt a running sequence commits in: a named agent's namespace is its tenant's."""
        return run.salt if run.agent is None or run.agent.kind == UNNAMED else ""

    def _draw_tokens(self, data):
        base = data.draw(st.sampled_from(self.seen)) if self.seen else []
        # Often all of it: a returning agent's prompt, which a snapshot at its end can resume.
        keep = data.draw(st.one_of(st.just(len(base)), st.integers(0, len(base))))
        return base[:keep] + data.draw(TOKENS)

    @rule(agent=AGENTS, salt=SALTS, snapshot=st.booleans(), data=st.data())
    def commit(self, agent, salt, snapshot, data):
        tokens = self._draw_tokens(data)
        if tokens:
            self._commit(agent, tokens, salt if agent is None else "", snapshot)

    @rule(agent=AGENTS, salt=SALTS, data=st.data())
    def lookup(self, agent, salt, data):
        tokens = self._draw_tokens(data)
        root = self._root(agent, salt)
        lease = self.store.lookup(tokens, root)
        # Isolation: a lookup only ever finds blocks named in its own namespace.
        assert all(self.namespace_of[b.hash] == root for b in lease.blocks)
        pos = 0
        for seg in lease.segments:
            assert seg.start == pos and seg.end > seg.start
            if seg.block is not None:
                assert seg.block.start == seg.start
                assert list(seg.block.tokens[: seg.end - seg.start]) == tokens[seg.start : seg.end]
                assert seg.block.payload.tokens[: seg.end - seg.start] == tuple(tokens[seg.start : seg.end])
            pos = seg.end
        assert lease.segments == [] or lease.segments[-1].block is not None
        if self.store.state_layers:  # it resumes exactly after a snapshot's prefix, or at 0
            snapshot = lease.snapshot
            assert lease.end == (snapshot.start if snapshot else 0)
            if snapshot is not None:
                names = self.store.names
                assert snapshot.parent == names.prefix_name(names.chain(tokens, root), tokens, snapshot.start)
                assert all(s.block is not None for s in lease.segments)
        hot = [s.block for s in lease.segments if s.block is not None and s.block.tier is Tier.HOT]
        self.running.append(Running(tokens, lease, hot, agent, salt, held=[b.hash for b in lease.blocks if b.held]))

    @rule(tenant=st.sampled_from(["", "t2"]), salt=SALTS, data=st.data())
    def unnamed(self, tenant, salt, data):
        """A request that names no agent: it joins the unnamed conversation of its namespace it
        continues (memory/index/conversations.py), else a new one, then runs as that agent's."""
        tokens = self._draw_tokens(data)
        if not tokens:
            return
        root = self.store.names.root(namespace(tenant, salt))
        key = self.store.recognise(tokens, root, tenant)
        assert key.kind == UNNAMED and key.tenant == tenant
        record = self.store.agents.get(key)
        if record is not None:  # joined: one it continues, of its own namespace
            assert record.root == root
            assert continues(record, common_prefix(record.tokens, tokens), len(tokens))
        lease = self.store.lookup(tokens, root)
        hot = [s.block for s in lease.segments if s.block is not None and s.block.tier is Tier.HOT]
        self.running.append(Running(tokens, lease, hot, key, salt, held=[b.hash for b in lease.blocks if b.held]))

    @precondition(lambda self: self.running)
    @rule(data=st.data(), cut=st.integers(0, 14))
    def share_prompt(self, data, cut):
        """A running sequence offers its prompt once prefilled (engine/core.py `_share_prompt`,
        its turn's start for an agent) or a shared head on its way (a snapshot for no agent,
        pinned until the sequence ends)."""
        run = self.running[data.draw(st.integers(0, len(self.running) - 1))]
        tokens = run.tokens[: max(1, len(run.tokens) - cut)]
        if tokens:
            self._commit(run.agent, tokens, self._salt(run), True, run, TURN_START)

    @precondition(lambda self: self.running)
    @rule(data=st.data(), extra=TOKENS, snapshot=st.booleans())
    def finish(self, data, extra, snapshot):
        """A running sequence ends: its pins go, then its prompt and reply are committed, then
        the snapshots it took for no agent (its last commit's too) are let go of."""
        run = self.running.pop(data.draw(st.integers(0, len(self.running) - 1)))
        tokens = run.tokens + extra
        self.store.release(run.lease)  # as the engine does: release, then commit
        if tokens:
            self._commit(run.agent, tokens, self._salt(run), snapshot, run)
        self.store.let_go(run.snapshots)

    @precondition(lambda self: self.running)
    @rule(data=st.data())
    def cancel(self, data):
        run = self.running.pop(data.draw(st.integers(0, len(self.running) - 1)))
        self.store.release(run.lease)
        self.store.let_go(run.snapshots)

    @rule(agent=AGENTS.filter(lambda a: a is not None))
    def end_agent(self, agent):
        record = self.store.agents.get(agent)
        ended = self.store.end_agent(agent)
        assert ended == (record is not None)
        assert agent not in self.store.agents
        if record is None:
            return
        self.ended.add(agent)
        others = {h for a, r in self.store.agents.items() for h in [*r.blocks, *r.snapshots]}
        pinned = {h for r in self.running for h in [*(b.hash for b in r.lease.blocks), *r.snapshots]}
        for h in [*record.blocks, *record.snapshots]:
            if h not in others and h not in pinned:
                assert h not in self.store.pool, "an ended agent's own block survived"

    @rule(agent=AGENTS.filter(lambda a: a is not None), on=st.booleans())
    def pin(self, agent, on):
        """Pinned (or not), within half the hot budget: a refused pin changes nothing."""
        record = self.store.agents.get(agent)
        was = bool(record.pinned) if record is not None else False
        result = self.store.pin(agent, on)
        assert result.found == (record is not None)
        if record is None:
            return
        assert result.pinned == (on if result.refused is None else was) == bool(record.pinned)
        if on and result.refused is None and not was:
            held = [b for b in self.store.pool.blocks.values() if b.held]
            limit, tenants = self.store.hot_budget_bytes // 2, {b.tenant for b in self.store.pool.blocks.values()}
            assert sum(b.hot_bytes for b in held) <= limit
            assert sum(b.hot_bytes for b in held if b.tenant == agent.tenant) <= limit // len(tenants | {agent.tenant})

    @rule(pick=st.integers(0, 1000), keep=st.floats(0, 1), extra=TOKENS)
    def own_history_is_found(self, pick, keep, extra):
        """With everything hot, an agent's next prompt reuses its whole common prefix. What
        is hot depends on eviction, which reads the clock: the draws must not depend on it
        (Hypothesis replays a case by its draws), so they are made first and applied after."""
        hot_agents = [
            r for r in self.store.agents.values() if all(self.store.pool.blocks[h].tier is Tier.HOT for h in r.blocks)
        ]
        if not hot_agents:
            return
        record = hot_agents[pick % len(hot_agents)]
        prompt = record.tokens[: round(keep * len(record.tokens))] + extra
        lease = self.store.lookup(prompt, record.root)
        shared = common_prefix(record.tokens, prompt)
        if self.store.state_layers:  # as far as its latest snapshot within what it shares
            held = [self.store.pool.blocks[h] for h in record.snapshots]
            shared = max((s.start for s in held if s.tier is Tier.HOT and s.start <= shared), default=0)
        assert lease.end >= shared
        self.store.release(lease)

    @invariant()
    def invariants_hold(self):
        if not hasattr(self, "store"):
            return
        pool, store = self.store.pool, self.store
        # 1 + 2: one block per hash, one tier each, exact byte accounting within budget.
        assert all(h == b.hash for h, b in pool.blocks.items())
        hot = [b for b in pool.blocks.values() if b.tier is Tier.HOT]
        assert pool.hot_bytes == sum(b.hot_bytes for b in hot)
        # Both kinds of hot bytes are counted, each exactly, against one budget.
        assert pool.exact_bytes == sum(b.hot_bytes for b in hot if b.exact)
        assert all(b.exact == b.payload.exact for b in hot)
        assert all(
            b.hot_bytes == (SNAPSHOT_BYTES if b.snapshot else len(b.tokens) * BYTES_PER_TOKEN * (2 if b.exact else 1))
            for b in hot
        )
        # Snapshots exist only for models with state layers, found by the prefix they follow.
        snapshots = [b for b in pool.blocks.values() if b.snapshot]
        assert store.state_layers or not snapshots
        assert {s.parent: s for s in snapshots} == pool.snapshots
        assert all(s.hash == store.names.snapshot_name(s.parent) and not s.tokens for s in snapshots)
        assert all(b.hot_bytes == 0 for b in pool.blocks.values() if b.tier is not Tier.HOT)
        # Over the budget by at most the snapshots running sequences took for no agent (held, so
        # pinned, until they end) and what pinned agents hold (their turns after the pin too, and
        # what running sequences leased of it: an unpin or an end cools it once they end).
        held = {h for run in self.running for h in [*run.snapshots, *run.held]}
        held |= {h for h, b in pool.blocks.items() if b.held}
        assert pool.hot_bytes <= store.hot_budget_bytes + sum(pool.blocks[h].hot_bytes for h in held)
        assert pool.disk_bytes == sum(b.disk_bytes for b in pool.blocks.values()) == 0
        # 3: no orphans; references are exact.
        refs, holds = {h: 0 for h in pool.blocks}, {h: 0 for h in pool.blocks}
        for record in store.agents.values():
            assert len(set(record.blocks)) == len(record.blocks)
            assert len(set(record.snapshots)) == len(record.snapshots) <= KEPT_PER_AGENT
            assert set(record.roles) <= set(ROLES) and set(record.roles.values()) <= set(record.snapshots)
            for h in [*record.blocks, *record.snapshots]:
                refs[h] += 1
                holds[h] += bool(record.pinned)
        pins = {h: 0 for h in pool.blocks}
        for run in self.running:  # its lease's, and the snapshots it took for no agent: none leaks
            for h in [*(b.hash for b in run.lease.blocks), *run.snapshots]:
                pins[h] += 1
        for h, b in pool.blocks.items():
            assert b.refs == refs[h] and b.pins == pins[h] and b.held == holds[h]  # pins.py: exact holds
            assert b.refs or b.pins or b.tier is Tier.HOT, "an unreferenced block outside memory"
            assert b.refs or b.pins or not b.orphan, "a block its last agent let go of outlived its pins"
            assert b.snapshot or h in pool.children[b.parent]
        assert sum(len(c) for c in pool.children.values()) == len(pool) - len(snapshots)
        # Every block counts for the tenant whose namespace named it, and the tenants' totals
        # (what their eviction shares are reckoned on) add up to the server's.
        assert all(b.tenant == self.tenant_of[self.namespace_of[h]] for h, b in pool.blocks.items())
        tenants = [store.totals(t) for t in {b.tenant for b in pool.blocks.values()} | {a.tenant for a in store.agents}]
        assert sum(t["hot_bytes"] for t in tenants) == pool.hot_bytes
        assert sum(t["agents"] for t in tenants) == len(store.agents)
        # Each block's retention weight is its references' (a one-off's count less), exactly.
        weights = {h: 0.0 for h in pool.blocks}
        for key, record in store.agents.items():
            for h in [*record.blocks, *record.snapshots]:
                weights[h] += retention_weight(key.kind, record.turns)
        assert all(b.weight == weights[h] for h, b in pool.blocks.items())
        # Unnamed conversations are filed for recognition, each under its anchors, and nothing else is;
        # each stays in its tenant's namespace.
        conversations = store.conversations
        unnamed = {k for k in store.agents if k.kind == UNNAMED}
        assert set(conversations.filed) == unnamed
        assert {k for keys in conversations.anchors.values() for k in keys} == unnamed
        assert all(k in conversations.anchors[a] for k, anchors in conversations.filed.items() for a in anchors)
        assert all(self.tenant_of[store.agents[k].root] == k.tenant for k in unnamed)
        # 4: ended agents are gone.
        assert not (self.ended & set(store.agents))
        # 5: blocks pinned by running sequences stay hot.
        for run in self.running:
            assert all(b.tier is Tier.HOT for b in run.hot_at_lookup)
        # Agents' records cover their tokens with their blocks, in order.
        for record in store.agents.values():
            covered = [t for h in record.blocks for t in pool.blocks[h].tokens]
            assert covered == record.tokens
            # ... and keep only snapshots along their tokens.
            chain = store.names.chain(record.tokens, record.root)
            for h in record.snapshots:
                s = pool.blocks[h]
                assert s.snapshot and s.parent == store.names.prefix_name(chain, record.tokens, s.start)


StoreMachine.TestCase.settings = settings(
    max_examples=150, stateful_step_count=40, deadline=None, suppress_health_check=[HealthCheck.too_slow]
)
test_store_state_machine = StoreMachine.TestCase

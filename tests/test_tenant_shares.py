"""Tenants share the server's budgets fairly, and only the operator sees the whole server.

Budgets shared by tenants (stored responses, hot memory, warm disk) evict from the tenant
holding the most first, so a tenant within its fair share keeps its data however much another
stores (api/responses/store.py, memory/index/eviction.py); `/metrics` shows every tenant's
figures, so it answers the operator's key (`--api-key`) only, and `/v1/agents` gives a tenant
its own totals (docs/usage.md, "Who can see what")."""

from __future__ import annotations

from dataclasses import dataclass

import httpx
import pytest

from agent_memory.agent_key import AgentKey
from agent_memory.api.responses.store import ResponseStore, StoredResponse
from agent_memory.chat.conversation import Message
from agent_memory.fair_share import fair_order
from agent_memory.memory.hashing import namespace
from agent_memory.memory.index.blocks import Tier
from agent_memory.memory.index.store import AgentCacheStore
from tests.support.fake_kv import BYTES_PER_TOKEN, FakeKV, encode, make_store
from tests.support.inprocess import InProcessServer


ALICE, BOB = AgentKey("notes", "alice"), AgentKey("flood", "bob")


def commit(store: AgentCacheStore, key: AgentKey, tokens: list[int], exact: bool = False) -> None:
    """A finished request of `key`'s tenant, as the engine commits it (and writes it warm)."""
    size = 2 * BYTES_PER_TOKEN if exact else BYTES_PER_TOKEN

    def cut(start, end):
        return FakeKV(tuple(tokens[start:end])), (end - start) * size, exact

    root = store.names.root(namespace(key.tenant, ""))
    persist = store.commit(key, tokens, cut, root, tenant=key.tenant)
    if store.warm is not None:
        persist.write(store.warm, encode)


def idle(store: AgentCacheStore, tenant: str, seconds: float) -> None:
    """The tenant's blocks were last used `seconds` ago: the least valuable of all by
    retention value, the first to go if the budget were one pool."""
    for block in store.pool.blocks.values():
        if block.tenant == tenant:
            block.last_used -= seconds


def held(store: AgentCacheStore, key: AgentKey) -> list:
    return [store.pool.blocks[h] for h in store.agents[key].blocks]


@pytest.mark.parametrize("exact", [False, True])
def test_a_tenant_flooding_the_hot_budget_cools_only_its_own_blocks(exact):
    def demote(kv):
        return kv, len(kv.tokens) * BYTES_PER_TOKEN

    store = AgentCacheStore(
        block_tokens=4, salt="f" * 32, hot_budget_bytes=1000, attention_tokens=50.0, demote=demote if exact else None
    )
    commit(store, ALICE, list(range(10)), exact)  # 100 bytes (200 exact): within half the budget
    idle(store, "alice", 1000)
    for i in range(20):  # bob: 20 agents of 40 tokens, 8000 bytes (16000 exact)
        commit(store, AgentKey(f"flood-{i}", "bob"), [i + 100] * 40, exact)
    assert store.pool.hot_bytes <= store.hot_budget_bytes
    assert all(b.tier is Tier.HOT and b.exact == exact for b in held(store, ALICE))  # not even quantized
    assert store.totals("alice")["hot_bytes"] == 10 * BYTES_PER_TOKEN * (2 if exact else 1)
    assert store.totals("bob")["hot_bytes"] == store.pool.hot_bytes - store.totals("alice")["hot_bytes"]
    # Now alice floods: the largest holder cools first, until the two hold about as much.
    commit(store, AgentKey("big", "alice"), [7] * 120, exact)
    alice, bob = store.totals("alice")["hot_bytes"], store.totals("bob")["hot_bytes"]
    assert alice + bob == store.pool.hot_bytes <= store.hot_budget_bytes
    assert abs(alice - bob) <= 4 * 2 * BYTES_PER_TOKEN, (alice, bob)  # within a block's bytes


def test_a_tenant_flooding_the_disk_budget_removes_only_its_own_files(tmp_path):
    store, disk = make_store(tmp_path, hot_tokens=50)
    commit(store, ALICE, list(range(12)))
    disk.flush()
    alice_disk = store.totals("alice")["disk_bytes"]
    assert alice_disk > 0
    store.evictor.disk_budget_bytes = 4 * alice_disk  # her share of two tenants: twice what she holds
    idle(store, "alice", 1000)
    for i in range(12):
        commit(store, AgentKey(f"flood-{i}", "bob"), [i + 100] * 12)
        disk.flush()
    assert store.pool.disk_bytes <= store.disk_budget_bytes
    assert store.totals("bob")["disk_bytes"] > 0
    assert store.totals("alice")["disk_bytes"] == alice_disk
    assert all(b.disk_bytes for b in held(store, ALICE))  # every file of hers kept
    assert any(b.tier is Tier.COLD for b in store.pool.blocks.values() if b.tenant == "bob")
    disk.close()
    restarted, disk = make_store(tmp_path, hot_tokens=50)  # a restart knows whose blocks are whose
    assert restarted.totals("alice")["disk_bytes"] == alice_disk
    assert restarted.totals("alice")["agents"] == 1 and restarted.totals("bob")["agents"] > 0
    disk.close()


def stored(tenant: str, i: int, text: str = "x" * 100) -> StoredResponse:
    return StoredResponse(f"resp_{i}", tenant, [Message("user", text)], {"id": f"resp_{i}"})


def test_a_tenant_filling_the_responses_budget_evicts_only_its_own(tmp_path):
    ended = []
    store = ResponseStore(tmp_path, budget_bytes=2000, end_kv=ended.append)
    store.put(stored("alice", 0))
    for i in range(1, 30):
        store.put(stored("bob", i))
    assert store.get("alice", "resp_0") is not None
    assert ended and {key.tenant for key in ended} == {"bob"}
    assert store.get("bob", "resp_29") is not None and store.get("bob", "resp_1") is None
    # One response over the whole budget stays (its chain can continue) until the next put.
    store.put(stored("bob", 30, "y" * 5000))
    assert store.get("bob", "resp_30") is not None and store.get("alice", "resp_0") is not None
    store.put(stored("alice", 31))
    assert store.get("bob", "resp_30") is None and store.get("alice", "resp_0") is not None
    store.close()


def test_fair_order_levels_the_largest_holder_down_whatever_it_holds():
    """fair_share.py's one policy, on the KV store's blocks and the stored responses alike: the
    tenant holding the most gives up its least valued movable item first, unmovable ones counted."""

    @dataclass
    class Item:
        tenant: str
        size: int
        value: float
        movable: bool = True

    items = [Item("a", 50, 1), Item("a", 50, 2), Item("b", 30, 0), Item("c", 200, 9, movable=False), Item("c", 10, 5)]
    order = fair_order(items, lambda i: i.size, lambda i: i.value, lambda i: i.movable)
    gone = []
    for item in order:
        gone.append(item)
        item.size = 0  # freed before the next is asked for
    assert [(i.tenant, i.value) for i in gone] == [("c", 5), ("a", 1), ("a", 2), ("b", 0)]


# -- the server ---------------------------------------------------------------------------------

OPERATOR = "op-key"


@pytest.fixture(scope="module")
def shared(tiny_model, tmp_path_factory):
    """Two tenants and the operator, a stored-response budget of 1 MiB and a hot budget of
    2 MiB (about 500 tokens of the tiny model's KV)."""
    folder = tmp_path_factory.mktemp("shares")
    keys = folder / "keys"
    keys.write_text("alice key-alice\nbob key-bob\n")
    args = ["--api-keys-file", str(keys), "--api-key", OPERATOR, "--responses-budget-mb", "1", "--hot-budget-mb", "2"]
    with InProcessServer(tiny_model, folder / "cache", *args) as s:
        yield s


def get(server: InProcessServer, path: str, key: str | None) -> httpx.Response:
    return httpx.get(server.base_url + path, headers={"Authorization": f"Bearer {key}"} if key else {}, timeout=60)


def test_bob_filling_the_shared_budgets_leaves_alices_response_readable_chainable_and_hot(shared):
    alice, bob = shared.client(api_key="key-alice"), shared.client(api_key="key-bob")
    first = alice.responses.create(model="tiny", input="Log the ferry.", max_output_tokens=4, temperature=0)
    for _ in range(13):  # ~100 KB each on disk, ~3,200 tokens (12 MiB of KV) each: both budgets overflow
        bob.responses.create(model="tiny", input=" " * 100_000, max_output_tokens=1, temperature=0)
    assert alice.responses.retrieve(first.id).id == first.id
    then = alice.responses.create(
        model="tiny", input="And the tug?", previous_response_id=first.id, max_output_tokens=4, temperature=0
    )
    details = then.usage.input_tokens_details.model_dump()
    assert details["hot_tokens"] > 0 and details["warm_tokens"] == 0  # her KV stayed in memory
    mine = get(shared, "/v1/agents", "key-alice").json()
    assert mine["stored_responses"] == 2 and mine["hot_bytes"] > 0  # her own totals, not the server's
    server = get(shared, "/v1/agents", OPERATOR).json()
    assert server["stored_responses"] > mine["stored_responses"] and server["hot_bytes"] <= server["hot_budget_bytes"]


def test_metrics_answer_the_operators_key_only(shared):
    for key in ("key-alice", "key-bob"):
        refused = get(shared, "/metrics", key)
        assert refused.status_code == 403
        error = refused.json()["error"]
        assert error["code"] == "operator_only" and "--api-key" in error["message"]
    assert get(shared, "/metrics", None).status_code == 401
    scraped = get(shared, "/metrics", OPERATOR)
    assert scraped.status_code == 200 and scraped.headers["content-type"].startswith("text/plain")
    assert "agent_memory_stored_responses" in scraped.text and "process_resident_memory_bytes" in scraped.text

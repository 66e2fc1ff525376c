"""The shared warm tier in process, against a real redis-server on a free loopback port: blocks
stored once and checked on read, damaged ones replaced, manifests compare-and-set under races,
reference counts, and two stores ("servers") handing an agent over."""

from __future__ import annotations

import logging
import random
import signal
import threading
import time
from collections import Counter
from concurrent.futures import ThreadPoolExecutor

import pytest

from agent_memory.agent_key import AgentKey
from agent_memory.memory.index.blocks import Tier
from agent_memory.memory.index.store import AgentCacheStore
from agent_memory.memory.index.tier_events import StoreEvents
from agent_memory.memory.warm.format import blockfile
from agent_memory.memory.warm.backend import BlockMissing
from agent_memory.memory.warm.format.blockfile import BlockFileError
from agent_memory.memory.warm.format.records import BlockRecord, Manifest
from agent_memory.memory.warm.redis.backend import RedisBackend
from agent_memory.memory.warm.redis.url import check_url, redact
from agent_memory.memory.warm.watch import Skipped
from tests.support.fake_kv import BLOCK, FINGERPRINT, FakeKV, commit, discover, encode, layout, shared_disk, shared_store
from tests.support.services import RedisServer

@pytest.fixture(scope="module")
def redis_url(tmp_path_factory):
    with RedisServer(tmp_path_factory.mktemp("redis")) as server:
        yield server.url


@pytest.fixture
def ns(redis_url, request):
    """A namespace of its own for each test (the keys of one model at one precision)."""
    name = f"test-{request.node.name}"[:60].replace("[", "_").replace("]", "_") + "-0123456789ab-kv16"
    store = RedisBackend(redis_url, name)
    yield name
    client = store.keys.client
    for key in [*client.scan_iter(match=f"am:{{{name}}}:*"), *client.scan_iter(match=f"am:{name}:*")]:
        client.delete(key)




class HeardManifests:
    """The tier's events as a test without a store hears them: each manifest write's outcome."""

    def __init__(self) -> None:
        self.outcomes: dict[str, bool] = {}

    def manifest_written(self, agent: AgentKey, etag: str, ok: bool) -> None:
        self.outcomes[etag] = ok

    def block_saved(self, block_hash: str, nbytes: int) -> None:
        pass

    def still_used(self, hashes: list[str]) -> set[str]:
        return set()

    def written(self, kind: str, subject: str, started: float) -> None:
        pass

    def tier_back(self, lost: bool) -> None:
        pass


def keys(store: RedisBackend, kind: str) -> list[bytes]:
    pattern = f"am:{store.keys.ns}:b:*" if kind == "b" else f"am:{{{store.keys.ns}}}:{kind}:*"
    return list(store.keys.client.scan_iter(match=pattern))


def refs(store: RedisBackend) -> Counter:
    return Counter({k.decode(): int(v) for k, v in store.keys.client.hgetall(store.keys.refs_key).items()})


def manifests(store: RedisBackend) -> list[Manifest]:
    return [store.keys.parse_manifest(k.decode(), store.keys.client.hget(k, "data")) for k in keys(store, "m")]


def check_refs(store: RedisBackend) -> None:
    """The reference counts are exactly how many manifests name each block."""
    assert refs(store) == Counter(h for m in manifests(store) for h in set(m.blocks))




# -- urls ------------------------------------------------------------------------------------


def test_urls_are_checked_and_passwords_never_shown():
    assert check_url("redis://10.0.0.5:6379/2") and check_url("rediss://h/0") and check_url("unix:///run/redis.sock")
    for bad in ("http://h:6379", "redis://", "/var/run/redis.sock"):
        with pytest.raises(ValueError):
            check_url(bad)
    assert redact("redis://:s3cret@h:6379/0") == "redis://:***@h:6379/0"
    assert redact("redis://me:s3cret@h:6379/0") == "redis://me:***@h:6379/0"
    with pytest.raises(ValueError, match=r"\*\*\*") as e:
        check_url("http://me:s3cret@h")
    assert "s3cret" not in str(e.value)


# -- blocks ------------------------------------------------------------------------------------


def test_a_block_is_stored_once_and_read_back_checked(redis_url, ns):
    store = RedisBackend(redis_url, ns)
    meta = {"fingerprint": FINGERPRINT, "bits": "16", **BlockRecord("a" * 32, None, 0, (1, 2, 3)).meta()}
    first = blockfile.encode(meta, encode(FakeKV((1, 2, 3))))
    size = store.put_block("a" * 32, first)
    assert size == len(b"".join(bytes(c) for c in first))
    other = blockfile.encode({**meta, "tokens": "[9,9,9]"}, encode(FakeKV((9, 9, 9))))
    store.put_block("a" * 32, other)  # set-if-absent: the first writer's bytes stay
    expect = {"fingerprint": FINGERPRINT, "hash": "a" * 32, "tokens": "[1,2,3]"}
    assert store.read_block("a" * 32, expect, layout(3))["k"].tolist() == [1, 2, 3]
    assert 0 < store.keys.client.ttl(store.keys.block_key("a" * 32)) <= 30 * 86400  # evictable under volatile-lru
    with pytest.raises(BlockMissing):
        store.read_block("b" * 32, expect, layout(3))
    with pytest.raises(BlockFileError, match="fingerprint"):  # another model's bytes under this name
        store.read_block("a" * 32, {**expect, "fingerprint": "0" * 32}, layout(3))


@pytest.mark.parametrize("damage", ["truncate", "flip", "swap"])
def test_a_damaged_block_is_a_miss_deleted_and_replaced(redis_url, ns, damage):
    store, disk = shared_store(redis_url, ns)
    commit(store, "a", list(range(9)))
    disk.flush()
    victim = store.agents[AgentKey("a")].blocks[1]
    client, key = disk.backend.keys.client, disk.backend.keys.block_key(victim)
    data = bytearray(client.get(key))
    if damage == "truncate":
        data = data[: len(data) // 2]
    elif damage == "flip":
        data[-2] ^= 0xFF
    else:
        data = bytearray(client.get(disk.backend.keys.block_key(store.agents[AgentKey("a")].blocks[0])))
    client.set(key, bytes(data), keepttl=True)
    other, other_disk = shared_store(redis_url, ns)  # the agent moves to another server
    discover(other, "a", list(range(9)) + [1])
    lease = other.lookup(list(range(9)) + [1])
    bad = lease.segments[1].block
    with pytest.raises(BlockFileError):
        other_disk.read_block(bad).result()
    assert client.get(key) is None  # deleted, so that the recomputed block can take its name
    other.warm_lost(bad)
    other.release(lease)
    commit(other, "a", list(range(9)) + [1])  # the gap recomputed; its block written again
    other_disk.flush()
    assert other_disk.read_block(BlockRecord(victim, None, 3, (3, 4, 5))).result()["k"].tolist() == [3, 4, 5]
    check_refs(disk.backend)
    disk.close()
    other_disk.close()


def test_a_good_copy_written_meanwhile_is_not_deleted_for_a_damaged_one(redis_url, ns):
    store = RedisBackend(redis_url, ns)
    meta = {"fingerprint": FINGERPRINT, "bits": "16", **BlockRecord("c" * 32, None, 0, (1, 2, 3)).meta()}
    good = b"".join(bytes(c) for c in blockfile.encode(meta, encode(FakeKV((1, 2, 3)))))
    store.keys.client.set(store.keys.block_key("c" * 32), good[:-1])
    real_get = store.get_block_bytes

    def race(block_hash):  # another server replaces the damaged bytes between our read and our delete
        damaged = real_get(block_hash)
        store.keys.client.set(store.keys.block_key(block_hash), good)
        return damaged

    store.get_block_bytes = race
    with pytest.raises(BlockFileError):
        store.read_block("c" * 32, {"hash": "c" * 32}, layout(3))
    assert store.keys.client.get(store.keys.block_key("c" * 32)) == good


def test_two_servers_writing_the_same_blocks_at_once_store_each_once(redis_url, ns):
    shared = list(range(30))  # a system prompt both servers' agents share
    a, disk_a = shared_store(redis_url, ns)
    b, disk_b = shared_store(redis_url, ns)

    def work(store, agent):
        commit(store, agent, shared + [agent.__hash__() % 1000 + 100])

    with ThreadPoolExecutor(8) as pool:
        list(pool.map(lambda i: work(a if i % 2 else b, f"agent-{i}"), range(16)))
    disk_a.flush()
    disk_b.flush()
    store = disk_a.backend
    names = {h for m in manifests(store) for h in m.blocks}
    blocks = {k.decode().rsplit(":", 1)[1] for k in keys(store, "b")}
    assert len(manifests(store)) == 16 and names <= blocks
    assert len(blocks) == len(names)  # every block once; none but those named
    check_refs(store)
    assert refs(store)[a.agents[AgentKey("agent-1")].blocks[0]] == 16  # the shared first block
    disk_a.close()
    disk_b.close()


# -- manifests ---------------------------------------------------------------------------------


def test_concurrent_turns_never_lose_a_committed_turn(redis_url, ns):
    """Writers race to append turns to one agent, each from the version it read: a write that
    succeeds is never overwritten by one that did not contain it."""
    disk = shared_disk(redis_url, ns)
    store = disk.backend
    committed: list[list[int]] = []
    lock = threading.Lock()
    heard = HeardManifests()
    disk.start(heard)
    outcomes = heard.outcomes

    def writer(w: int) -> None:
        rng = random.Random(w)
        for turn in range(25):
            current = store.read_manifest(AgentKey("x"))
            base, tokens = (current[1], current[0].tokens) if current else (None, [])
            if rng.random() < 0.3 and current:  # a server with a stale view: an older version
                base = "stale"
            new = tokens + [w * 1000 + turn] * rng.randint(1, 4)
            manifest = Manifest(AgentKey("x"), FINGERPRINT, new, [f"{w:02x}{turn:02x}".ljust(32, "0")], float(turn))
            disk._write_manifest(manifest, base, f"{w}-{turn}")
            if outcomes[f"{w}-{turn}"]:
                with lock:
                    committed.append(new)

    threads = [threading.Thread(target=writer, args=(w,)) for w in range(6)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    final = store.read_manifest(AgentKey("x"))[0].tokens
    assert committed and all(final[: len(c)] == c for c in committed)
    assert len(committed) >= 25  # some writes give way, most land
    check_refs(store)
    disk.close()


def test_a_delete_wins_over_a_turn_in_flight(redis_url, ns):
    store, disk = shared_store(redis_url, ns)
    commit(store, "a", list(range(7)))
    disk.flush()
    other, other_disk = shared_store(redis_url, ns)
    ended = other.end_agent(AgentKey("a"))  # another server, which does not hold it, ends it
    assert ended.result(timeout=10) is True
    assert not keys(disk.backend, "m") and not keys(disk.backend, "b") and not refs(disk.backend)
    commit(store, "a", list(range(9)))  # the first server's next turn, from its stale view
    disk.flush()
    assert not keys(disk.backend, "m")  # not written back: the agent stays ended
    assert store.agents[AgentKey("a")].etag is None  # its next turn starts over in the store
    commit(store, "a", list(range(9)) + [5])
    disk.flush()
    assert [m.tokens for m in manifests(disk.backend)] == [list(range(9)) + [5]]
    check_refs(disk.backend)
    assert other.end_agent(AgentKey("nobody")).result(timeout=10) is False
    disk.close()
    other_disk.close()


def test_random_turns_and_ends_on_two_servers_keep_the_reference_counts(redis_url, ns):
    rng = random.Random(3)
    servers = [shared_store(redis_url, ns), shared_store(redis_url, ns)]
    convos: dict[str, list[int]] = {}
    for _ in range(60):
        store, disk = rng.choice(servers)
        agent = f"a{rng.randrange(5)}"
        action = rng.random()
        if action < 0.15:
            store.end_agent(AgentKey(agent))
            convos.pop(agent, None)
            continue
        tokens = convos.get(agent, [rng.randrange(3)] * 4)
        if action < 0.3 and len(tokens) > 4:
            tokens = tokens[: rng.randrange(4, len(tokens))]  # an edited conversation
        tokens = tokens + [rng.randrange(50) for _ in range(rng.randint(1, 5))]
        discover(store, agent, tokens)
        store.release(store.lookup(tokens))
        commit(store, agent, tokens)
        convos[agent] = tokens
        disk.flush()
    for _, disk in servers:
        disk.flush()
    check_refs(servers[0][1].backend)
    for m in manifests(servers[0][1].backend):
        assert [h for h, *_ in servers[0][0].names.chain(m.tokens)] == m.blocks
    for _, disk in servers:
        disk.close()


# -- an agent moving between servers ----------------------------------------------------------------


def test_an_agent_moving_to_another_server_finds_its_blocks_and_manifest(redis_url, ns):
    a, disk_a = shared_store(redis_url, ns)
    commit(a, "mover", list(range(10)))
    disk_a.flush()
    b, disk_b = shared_store(redis_url, ns)
    assert AgentKey("mover") not in b.agents  # nothing is read at start
    turn = list(range(10)) + [42, 43]
    discover(b, "mover", turn)
    record = b.agents[AgentKey("mover")]
    assert record.tokens == list(range(10)) and record.etag == record.stored is not None
    lease = b.lookup(turn)
    assert lease.end == 10 and all(s.block.tier is Tier.WARM for s in lease.segments)
    for s in lease.segments:
        assert disk_b.read_block(s.block).result()["k"].tolist() == list(s.block.tokens)
    b.release(lease)
    commit(b, "mover", turn)
    disk_b.flush()
    # Back on the first server (which still holds the older turn): it adopts the newer manifest.
    discover(a, "mover", turn + [7])
    assert a.agents[AgentKey("mover")].tokens == turn
    assert a.lookup(turn + [7]).end == len(turn)
    check_refs(disk_a.backend)
    disk_a.close()
    disk_b.close()


def test_a_returning_agent_whose_turn_is_still_queued_is_not_asked_about(redis_url, ns):
    store, disk = shared_store(redis_url, ns)
    go = threading.Event()
    real_write = disk.backend.write_manifest
    disk.backend.write_manifest = lambda *a: go.wait(10) and real_write(*a)  # the writer is behind
    commit(store, "a", list(range(6)))
    record = store.agents[AgentKey("a")]
    assert record.etag is not None and record.stored is None
    # Its latest turn is this server's own: nothing to ask while every block is here.
    assert store.sync.discover(AgentKey("a"), list(range(6)), None) is None
    go.set()
    disk.flush()
    assert record.etag == record.stored
    assert store.sync.discover(AgentKey("a"), list(range(6)), None) is not None  # settled: asked again
    disk.close()


def test_a_redis_that_does_not_answer_is_a_degraded_tier_not_a_failure(tmp_path):
    from tests.support.server import free_port

    disk = shared_disk(f"redis://127.0.0.1:{free_port()}/0", "gone-0123456789ab-kv16")
    store = AgentCacheStore(
        block_tokens=BLOCK, salt=FINGERPRINT, hot_budget_bytes=10_000, attention_tokens=50.0, warm=disk
    )
    disk.start(StoreEvents(store))
    commit(store, "a", list(range(6)))
    disk.flush()
    assert disk.write_error and disk.failed_jobs >= 1
    assert disk.watch.skipped  # after its first failure: nothing waits for it any more
    assert store.sync.discover(AgentKey("a"), list(range(9)), None) is None
    assert isinstance(disk.read_block(store.pool.blocks[store.agents[AgentKey("a")].blocks[0]]).exception(), Skipped)
    assert store.lookup(list(range(6)) + [1]).end == 6  # served from memory
    disk.close()


# -- a hung Redis, a Redis that lost its data ----------------------------------------------------


def wait_for(condition, what: str, limit: float = 30.0) -> None:
    """Poll a condition the writer's watch brings about (every RETRY_S or WATCH_S)."""
    deadline = time.monotonic() + limit
    while not condition():
        assert time.monotonic() < deadline, f"not within {limit:.0f} s: {what}"
        time.sleep(0.1)


def test_a_hung_redis_is_skipped_until_it_answers_then_gets_what_it_missed(tmp_path, caplog):
    caplog.set_level(logging.INFO)
    with RedisServer(tmp_path / "redis") as redis_server:
        ns = "hung-0123456789ab-kv16"
        store, disk = shared_store(redis_server.url, ns, write_back=True)
        commit(store, "hot", list(range(9)))
        disk.flush()
        redis_server.proc.send_signal(signal.SIGSTOP)
        try:
            waited = store.sync.discover(AgentKey("hot"), list(range(12)), None)
            left = store.sync.discover(AgentKey("left"), list(range(6)), None)  # queued behind it
            store.sync.drop(left)  # its client left: the question is dropped, never asked
            assert left.done() and [d.future.cancelled() for d in store.sync._discoveries] == [False, True]
            waited.exception(timeout=30)  # done without an answer: the request goes on from memory
            wait_for(lambda: disk.watch.skipped, "skipped once a call got no answer")
            assert store.sync.discover(AgentKey("hot"), list(range(12)), None) is None  # nothing waits now
            store.sync.apply()
            assert store.lookup(list(range(12))).end == 9
            commit(store, "hot", list(range(12)))  # a turn while it is skipped: its writes fail at once
            disk.flush()
            assert disk.failed_jobs >= 2
        finally:
            redis_server.proc.send_signal(signal.SIGCONT)
        wait_for(lambda: not disk.watch.skipped, "used again once it answers")
        disk.flush()
        # What it missed was written back: another server finds the agent's latest turn there.
        b, disk_b = shared_store(redis_server.url, ns)
        discover(b, "hot", list(range(12)) + [5])
        assert b.agents[AgentKey("hot")].tokens == list(range(12))
        lease = b.lookup(list(range(12)) + [5])
        assert lease.end == 12 and all(s.block.tier is Tier.WARM for s in lease.segments)
        for s in lease.segments:
            assert disk_b.read_block(s.block).result()["k"].tolist() == list(s.block.tokens)
        disk.close()
        disk_b.close()
    assert "did not answer" in caplog.text and "skipped until it answers again" in caplog.text
    assert "answers again after" in caplog.text


def test_a_redis_that_lost_its_data_gets_back_what_this_server_holds(redis_url, ns, caplog):
    caplog.set_level(logging.INFO)
    a, disk_a = shared_store(redis_url, ns, write_back=True)
    commit(a, "kept", list(range(10)))
    disk_a.flush()
    backend = disk_a.backend
    before = manifests(backend)
    assert [m.key.id for m in before] == ["kept"]
    for key in [*backend.keys.client.scan_iter(match=f"am:{{{ns}}}:*"), *backend.keys.client.scan_iter(match=f"am:{ns}:*")]:
        backend.keys.client.delete(key)  # as FLUSHALL does to this namespace (other tests share this Redis)
    wait_for(lambda: manifests(backend), "the manifest written back")
    disk_a.flush()
    assert manifests(backend)[0].blocks == before[0].blocks and backend.keys.client.get(backend.keys.model_key)
    check_refs(backend)
    b, disk_b = shared_store(redis_url, ns)
    discover(b, "kept", list(range(10)) + [1])
    lease = b.lookup(list(range(10)) + [1])
    assert lease.end == 10 and all(s.block.tier is Tier.WARM for s in lease.segments)
    for s in lease.segments:
        assert disk_b.read_block(s.block).result()["k"].tolist() == list(s.block.tokens)
    assert "lost its data" in caplog.text and "writing back 4 blocks and 1 manifests" in caplog.text
    disk_a.close()
    disk_b.close()

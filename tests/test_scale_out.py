"""Several servers, one shared warm tier in Redis, agents routed by HAProxy: real processes on
loopback (redis-server and haproxy from Debian; the tests skip, saying so, without them).

The servers of this module are started once, together; the failover test, which kills one of
them, runs last."""

from __future__ import annotations

import json
import signal
import threading
import time
from collections import Counter
from concurrent.futures import ThreadPoolExecutor

import httpx
import openai
import pytest
from typer.testing import CliRunner

from agent_memory.cli.cache.commands import cache_app
from tests.support.chat import tiers
from tests.support.inprocess import InProcessServer
from tests.support.server import Server
from tests.support.services import HAProxy, RedisServer, haproxy_config

pytestmark = pytest.mark.process

SYSTEM = "You keep the records of the lighthouse on the northern cape, in order and by date. " * 10


def opening(tag: str) -> str:
    """A first message long enough for blocks of the agent's own."""
    return f"I am the keeper of station {tag}. " * 16 + f"What happened at station {tag} on the night of the storm?"


def messages(tag: str, replies: list[str]) -> list[dict]:
    """An agent's conversation after `replies`: each reply, then the next question."""
    out = [{"role": "system", "content": SYSTEM}, {"role": "user", "content": opening(tag)}]
    for i, reply in enumerate(replies):
        out += [{"role": "assistant", "content": reply}, {"role": "user", "content": f"And then, part {i + 2}?"}]
    return out


def ask(client: openai.OpenAI, msgs: list[dict], agent: str | None, max_tokens: int = 10):
    extra = {"prompt_cache_key": agent} if agent else {}
    return client.chat.completions.create(
        model="tiny", messages=msgs, max_tokens=max_tokens, temperature=0, extra_body=extra
    )


@pytest.fixture(scope="module")
def redis(tmp_path_factory):
    with RedisServer(tmp_path_factory.mktemp("redis")) as server:
        yield server


@pytest.fixture(scope="module")
def cluster(tiny_model, tmp_path_factory, redis):
    """Three server processes on the shared tier, started together (a start is mostly waiting
    for imports), and one without any warm tier in this process: the reference answers."""
    servers = [Server(tiny_model, tmp_path_factory.mktemp(f"s{i}"), "--warm-store", redis.url) for i in range(3)]
    fresh = InProcessServer(tiny_model, tmp_path_factory.mktemp("fresh"), "--disk-budget-mb", "0")
    with ThreadPoolExecutor(4) as pool:
        list(pool.map(lambda s: s.start(), [*servers, fresh]))
    yield servers, fresh
    for s in [*servers, fresh]:
        s.stop()


def fresh_answer(fresh: InProcessServer, msgs: list[dict]) -> str:
    return ask(fresh.client(), msgs, None).choices[0].message.content


def namespace_keys(redis: RedisServer, kind: str) -> list[str]:
    client = redis.client()
    (model_key,) = client.scan_iter(match="am:{*}:model")
    ns = model_key.decode()[4:-7]
    pattern = f"am:{ns}:b:*" if kind == "b" else f"am:{{{ns}}}:{kind}*"
    return [k.decode() for k in client.scan_iter(match=pattern)]


def reference_counts(redis: RedisServer) -> tuple[Counter, Counter]:
    """(the refs hash, how many manifests name each block): equal when the tier is consistent."""
    client = redis.client()
    (refs_key,) = namespace_keys(redis, "refs")
    refs = Counter({k.decode(): int(v) for k, v in client.hgetall(refs_key).items()})
    named = Counter()
    for key in namespace_keys(redis, "m:"):
        named.update(set(json.loads(client.hget(key, "data"))["blocks"]))
    return refs, named


def settle(*servers: Server) -> None:
    """Let the servers' writers finish (write-behind): a short wait, bounded."""
    time.sleep(0.5)


def test_an_agent_moving_between_servers_keeps_its_cache(cluster):
    (a, b, _), fresh = cluster
    replies: list[str] = []
    for turn, server in enumerate([a, b, a, b]):
        msgs = messages("mover", replies)
        r = ask(server.client(), msgs, "mover")
        hot, warm = tiers(r)
        if turn:
            # Each turn comes back from where the previous one was written: the other server
            # read it from Redis (warm); the first server holds turn 1 hot, the rest warm.
            assert hot + warm >= r.usage.prompt_tokens - 32, (turn, hot, warm, r.usage.prompt_tokens)
            assert warm > 0
        assert r.choices[0].message.content == fresh_answer(fresh, msgs)  # exact at 16 bits
        replies.append(r.choices[0].message.content)
        settle()
    listed = httpx.get(b.base_url + "/v1/agents").json()["data"]
    assert [x["id"] for x in listed if x["id"] == "mover"] == ["mover"]
    health = httpx.get(a.base_url + "/health").json()["warm_tier"]
    assert health["status"] == "on" and health["shared"] and health["policy"] == "volatile-lru"
    assert health["store"] == a.args[1] and health["budget_bytes"] == 256 << 20


def test_both_servers_writing_the_same_blocks_at_once_keep_the_tier_consistent(cluster, redis):
    (a, b, _), fresh = cluster
    agents = [f"crowd-{i}" for i in range(8)]

    def first_turn(i: int):
        server = (a, b)[i % 2]
        return ask(server.client(), messages(agents[i], []), agents[i])

    with ThreadPoolExecutor(8) as pool:  # the shared system prompt computed on both at once
        results = list(pool.map(first_turn, range(8)))
    settle()
    for agent, r in zip(agents, results):
        assert r.choices[0].message.content == fresh_answer(fresh, messages(agent, []))
    refs, named = reference_counts(redis)
    assert refs == named  # every block counted once per manifest naming it, however it raced
    blocks = set(namespace_keys(redis, "b"))
    assert all(any(k.endswith(h) for k in blocks) for h in named)
    shared_first = Counter(h for h, n in named.items() if n >= len(agents))
    assert shared_first, "the system prompt's blocks are one set, named by every agent"
    # Each agent's next turn, on the other server, reads the blocks the race left.
    for i, agent in enumerate(agents[:4]):
        msgs = messages(agent, [results[i].choices[0].message.content])
        r = ask((b, a)[i % 2].client(), msgs, agent)
        assert tiers(r)[1] > 0 and r.choices[0].message.content == fresh_answer(fresh, msgs)


def test_the_cache_commands_work_on_the_shared_tier(cluster, redis):
    def run(*args: str) -> dict:
        result = CliRunner().invoke(cache_app, [*args, "--warm-store", redis.url, "--format", "json"])
        assert result.exit_code == 0, result.output
        return json.loads(result.stdout)

    listed = run("ls")
    ids = {row["id"] for row in listed["agents"]}
    assert {"mover", "crowd-0"} <= ids and listed["cache_dir"] == redis.url
    shown = run("show", "crowd-1")
    assert shown["totals"]["on_disk"] == shown["totals"]["blocks"] > 1
    assert any(b["shared_with"] >= 7 for b in shown["blocks"])  # the system prompt
    assert run("verify")["ok"]
    stats = run("stats")["total"]
    assert stats["agents"] == len(ids) and stats["block_files"] > 0
    removed = run("rm", "crowd-7", "--yes")
    assert removed["agents"][0]["id"] == "crowd-7" and removed["kept_shared_blocks"] > 0
    refs, named = reference_counts(redis)
    assert refs == named and "crowd-7" not in {row["id"] for row in run("ls")["agents"]}
    assert run("prune", "--dry-run", "--older-than", "1h")["removed"] == []
    bad = CliRunner().invoke(cache_app, ["ls", "--warm-store", "http://nowhere"])
    assert bad.exit_code == 2 and "redis://" in bad.output


def test_a_damaged_block_in_redis_is_a_miss_and_is_replaced(cluster, redis):
    (a, b, _), fresh = cluster
    first = ask(a.client(), messages("damaged", []), "damaged")
    settle()
    client = redis.client()
    refs, named = reference_counts(redis)
    own = _blocks_of(redis, "damaged")[:-1]  # whole blocks: the last may be partial
    private = [h for h in own if named[h] == 1]
    victim = next(k for k in namespace_keys(redis, "b") if k.endswith(private[0]))
    data = bytearray(client.get(victim))
    data[len(data) // 2] ^= 0x01
    client.set(victim, bytes(data), keepttl=True)
    msgs = messages("damaged", [first.choices[0].message.content])
    r = ask(b.client(), msgs, "damaged")  # another server: it reads the damaged block
    assert r.choices[0].message.content == fresh_answer(fresh, msgs)
    assert tiers(r)[1] < r.usage.prompt_tokens - 20  # a miss, recomputed
    assert "damaged block" in b.log()
    settle()
    from agent_memory.memory.warm.format import blockfile

    blockfile.read_bytes(client.get(victim), {}, None)  # written again, whole


def _blocks_of(redis: RedisServer, agent: str) -> list[str]:
    """The agent's blocks, in order, as its manifest in Redis names them (none: no manifest)."""
    client = redis.client()
    for key in namespace_keys(redis, "m:"):
        data = json.loads(client.hget(key, "data"))
        if data["agent"] == agent:
            return data["blocks"]
    return []


def test_an_agent_ended_through_a_server_that_does_not_hold_it_leaves_the_tier(cluster, redis):
    (a, b, _), _ = cluster
    ask(a.client(), messages("ended", []), "ended")
    settle()
    assert _blocks_of(redis, "ended")
    assert httpx.delete(b.base_url + "/v1/agents/ended").status_code == 200
    assert not _blocks_of(redis, "ended")
    assert httpx.delete(b.base_url + "/v1/agents/ended").status_code == 404
    refs, named = reference_counts(redis)
    assert refs == named
    # The server that held it finds it gone at its next turn and starts it over.
    r = ask(a.client(), messages("ended", ["whatever"]), "ended")
    assert r.choices[0].message.content


def wait_for(condition, what: str, limit: float = 30.0) -> None:
    """Poll what a server's watch of Redis brings about (it checks every 1-5 s)."""
    deadline = time.monotonic() + limit
    while not condition():
        assert time.monotonic() < deadline, f"not within {limit:.0f} s: {what}"
        time.sleep(0.2)


def test_a_hung_redis_holds_up_no_agent_whose_prompt_is_in_memory(cluster, redis):
    """Redis stopped (SIGSTOP, as a hung host) under eight agents for two turns each: six whose
    prompts are in their server's memory, two arriving on a server that never saw them. Every
    turn is answered within the client's timeout, as a server without any cache answers it; the
    hot ones from memory, the others recomputed. Once Redis answers again, what the server could
    not write meanwhile is written back: another server reads a hot agent warm."""
    (a, b, c), fresh = cluster
    hot = [f"hung-{i}" for i in range(6)]
    cold = ["hung-cold-0", "hung-cold-1"]
    replies: dict[str, list[str]] = {agent: [] for agent in hot + cold}

    def turn(agent: str, server: Server):
        msgs = messages(agent, replies[agent])
        return msgs, ask(server.client(timeout=30), msgs, agent)

    def round_on(server_of) -> list:
        with ThreadPoolExecutor(8) as pool:
            done = list(pool.map(lambda agent: (agent, *turn(agent, server_of(agent))), hot + cold))
        for agent, _, r in done:
            replies[agent].append(r.choices[0].message.content)
        return done

    round_on(lambda agent: a if agent in hot else b)
    settle()
    redis.proc.send_signal(signal.SIGSTOP)
    try:
        for n in range(2):
            for agent, msgs, r in round_on(lambda agent: a):
                assert r.choices[0].message.content == fresh_answer(fresh, msgs)
                hot_tokens, warm_tokens = tiers(r)
                assert warm_tokens == 0
                if agent in hot or n:
                    assert hot_tokens >= r.usage.prompt_tokens - 32, (agent, n, hot_tokens, r.usage.prompt_tokens)
        assert httpx.get(a.base_url + "/health").json()["warm_tier"]["status"] == "degraded"
    finally:
        redis.proc.send_signal(signal.SIGCONT)
    wait_for(lambda: "answers again after" in a.log(), "the server uses Redis again")
    for server in (a, b, c):  # each server's own watch finds Redis back
        wait_for(lambda: httpx.get(server.base_url + "/health").json()["warm_tier"]["status"] == "on", "/health on")
    assert "did not answer" in a.log() and "skipped until it answers again" in a.log()
    settle()
    msgs = messages(hot[0], replies[hot[0]])
    r = ask(c.client(), msgs, hot[0])  # its turns while Redis hung, written back: warm elsewhere
    hot_tokens, warm_tokens = tiers(r)
    assert warm_tokens > 0 and hot_tokens + warm_tokens >= r.usage.prompt_tokens - 32, (hot_tokens, warm_tokens)
    assert r.choices[0].message.content == fresh_answer(fresh, msgs)


def test_a_redis_that_lost_its_data_gets_the_agents_back_from_their_servers(cluster, redis):
    """FLUSHALL (as a restart without persistence): each server writes back the blocks and
    manifests of the agents it holds, and another server reads such an agent warm."""
    (a, b, c), fresh = cluster
    first = ask(a.client(), messages("flushed", []), "flushed")
    settle()
    written = _blocks_of(redis, "flushed")
    assert written
    redis.client().flushall()

    def back() -> bool:
        try:
            return _blocks_of(redis, "flushed") == written
        except ValueError:  # no model key yet: no namespace
            return False

    wait_for(back, "the agent's manifest written back")
    settle()
    blocks = set(namespace_keys(redis, "b"))
    assert all(any(k.endswith(h) for k in blocks) for h in written)  # every block with it
    refs, named = reference_counts(redis)
    assert refs == named
    assert "lost its data" in a.log() and "writing back" in a.log()
    msgs = messages("flushed", [first.choices[0].message.content])
    r = ask(b.client(), msgs, "flushed")
    hot_tokens, warm_tokens = tiers(r)
    assert warm_tokens > 0 and hot_tokens + warm_tokens >= r.usage.prompt_tokens - 32, (hot_tokens, warm_tokens)
    assert r.choices[0].message.content == fresh_answer(fresh, msgs)


def test_haproxy_routes_agents_and_a_killed_servers_agents_come_back_warm(cluster, tmp_path):
    """The end-to-end run: HAProxy over the three servers, nine agents of four turns each;
    one server is killed (SIGKILL) while turns are in flight. Every turn is answered (the
    router retries what the dead server dropped), every reply is the one a server without any
    cache gives for that conversation, and the dead server's agents come back from Redis."""
    servers, fresh = cluster
    router = HAProxy(tmp_path, [f"127.0.0.1:{s.port}" for s in servers]).start()
    names = {f"s{i + 1}": s for i, s in enumerate(servers)}
    agents = [f"e2e-{i}" for i in range(9)]
    record: dict[str, list[dict]] = {a: [] for a in agents}
    errors: list[str] = []
    halfway = threading.Barrier(len(agents) + 1, timeout=300)

    def run_agent(agent: str) -> None:
        client = openai.OpenAI(
            base_url=router.base_url + "/v1", api_key="unused", max_retries=0, timeout=120,
            default_headers={"X-Agent-Id": agent},
        )
        replies: list[str] = []
        for turn in range(4):
            if turn == 2:
                halfway.wait()
            msgs = messages(agent, replies)
            try:
                raw = client.chat.completions.with_raw_response.create(
                    model="tiny", messages=msgs, max_tokens=10, temperature=0
                )
            except Exception as e:  # a lost turn
                errors.append(f"{agent} turn {turn}: {type(e).__name__}: {e}")
                halfway.abort()
                return
            r = raw.parse()
            hot, warm = tiers(r)
            record[agent].append(
                {"server": raw.headers.get("X-Router-Server"), "msgs": msgs, "reply": r.choices[0].message.content,
                 "hot": hot, "warm": warm, "prompt": r.usage.prompt_tokens, "done": time.monotonic()}
            )
            replies.append(r.choices[0].message.content)

    try:
        threads = [threading.Thread(target=run_agent, args=(a,)) for a in agents]
        for t in threads:
            t.start()
        try:
            halfway.wait()
        except threading.BrokenBarrierError:
            for t in threads:
                t.join(60)
            pytest.fail(f"turns lost before the kill: {errors}")
        before = {a: {t["server"] for t in record[a]} for a in agents}
        assert all(len(s) == 1 for s in before.values()), before  # one server per agent
        victim_name = Counter(next(iter(s)) for s in before.values()).most_common(1)[0][0]
        time.sleep(0.15)  # turns 3 are in flight
        names[victim_name].stop(signal.SIGKILL)
        killed = time.monotonic()
        for t in threads:
            t.join(300)
    finally:
        router.stop()
    assert not errors, errors  # 0 lost turns, no 5xx past the router
    assert all(len(turns) == 4 for turns in record.values())
    mixed = [
        (a, i) for a in agents for i, t in enumerate(record[a]) if t["reply"] != fresh_answer(fresh, t["msgs"])
    ]
    assert not mixed, mixed  # 0 cross-agent (or otherwise wrong) replies
    moved = [a for a in agents if next(iter(before[a])) == victim_name]
    assert moved
    failovers = []
    for agent in agents:
        after = [t for t in record[agent][2:] if t["done"] > killed]
        if agent not in moved:
            assert {t["server"] for t in after} <= before[agent]  # nobody else moved
            continue
        assert victim_name not in {t["server"] for t in after}
        # The first turn on each new server (a turn the dead server dropped is retried by the
        # router on any survivor; the next ones go where the hash ring now puts the agent)
        # comes back from Redis: its memory survived its server.
        seen = set()
        for t in record[agent]:
            if t["server"] != victim_name and t["server"] not in seen:
                seen.add(t["server"])
                failovers.append((agent, t["server"], t["warm"], t["prompt"]))
                assert t["warm"] > 0, (agent, t)
    print(f"\nfailover: killed {victim_name} holding {len(moved)} of {len(agents)} agents; (agent, server, warm, prompt):")
    print(failovers)


def test_the_shipped_haproxy_config_is_the_generators_output():
    from tests.support.server import REPO
    shipped = (REPO / "docs/scale-out/haproxy.cfg").read_text()
    assert shipped == haproxy_config().render(["127.0.0.1:8001", "127.0.0.1:8002", "127.0.0.1:8003"])

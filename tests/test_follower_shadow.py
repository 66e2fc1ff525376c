"""Does rank 0's step plan tell a follower everything? An in-process follower over the same
model executes every plan rank 0's real engine broadcasts (a group of one, tests/support/shadow.py);
after every step its hot payloads equal rank 0's hash by hash, array by array, its decode batch
holds the same sequences and its prefilling caches equal rank 0's — through a run of concurrent
requests with agents and turns, sampling, n = 2, stop strings, a cancelled stream, follow-ups,
evictions and demotions under a tiny hot budget, and an agent deleted. Rank 0 has a warm tier and
the follower its own folder: blocks written, deleted and read back by rank 0 are by the follower
too, its reads agreed with rank 0's, and in the end both folders hold the same files, byte for byte."""

from concurrent.futures import ThreadPoolExecutor

import httpx
import pytest

from agent_memory.models.tiny import build_tiny
from tests.support.inprocess import InProcessServer
from tests.support.shadow import block_files, follow, settled


@pytest.fixture(scope="module", params=["llama", "qwen3_5"])
def shadowed(request, tiny_model, tmp_path_factory):
    """Plain attention (the tiny llama), and attention with recurrent layers whose state a
    follower keeps in snapshots as rank 0 does (the tiny qwen3_5)."""
    model = tiny_model if request.param == "llama" else build_tiny(tmp_path_factory.mktemp("m") / "q", arch="qwen3_5")
    args = ("--kv-bits", "4", "--hot-budget-mb", "1", "--disk-budget-mb", "64", "--speculation", "off")
    with InProcessServer(model, tmp_path_factory.mktemp("shadow"), *args) as s:
        yield s, follow(s, tmp_path_factory.mktemp("follower")), request.param


def turn(client, model: str, agent: str, messages: list, max_tokens: int = 16, **kw):
    kw.setdefault("temperature", 0)
    extra = {"prompt_cache_key": agent} if agent else {}
    return client.chat.completions.create(
        model=model, messages=messages, max_tokens=max_tokens, extra_body=extra, **kw
    )


def test_a_follower_mirrors_rank_0_through_a_random_run(shadowed):
    server, leader, arch = shadowed
    client = server.client()
    model = httpx.get(server.base_url + "/v1/models").json()["data"][0]["id"]
    long = " ".join(f"item {i} is worth {i * 7 % 13}." for i in range(50))  # more than one prefill chunk

    def agent_session(i: int):
        messages = [{"role": "user", "content": f"Agent {i}: {long if i % 2 else 'hello there'}"}]
        r1 = turn(client, model, f"agent-{i}", messages, temperature=0.8, seed=i)
        messages += [
            {"role": "assistant", "content": r1.choices[0].message.content},
            {"role": "user", "content": "More?"},
        ]
        turn(client, model, f"agent-{i}", messages, stop=["e"])

    def samples():
        turn(client, model, "", [{"role": "user", "content": "Two ways to say it."}], n=2, temperature=0.9, seed=3)

    def cancelled():
        stream = client.chat.completions.create(
            model=model, messages=[{"role": "user", "content": "A long story please."}], max_tokens=64, stream=True
        )
        for i, _ in enumerate(stream):
            if i == 3:
                stream.close()
                break

    with ThreadPoolExecutor(6) as pool:
        jobs = [pool.submit(agent_session, i) for i in range(4)] + [pool.submit(samples), pool.submit(cancelled)]
        for job in jobs:
            job.result()
    assert httpx.delete(server.base_url + "/v1/agents/agent-1").json()["deleted"] is True
    turn(client, model, "agent-2", [{"role": "user", "content": "Agent 2: hello there"}], max_tokens=4)  # after it
    # Evicted to the warm tier meanwhile: each agent's turn again reads its blocks back from disk,
    # on rank 0 from its folder, on the follower from its own.
    for i in (0, 2, 3):
        turn(client, model, f"agent-{i}", [{"role": "user", "content": f"Agent {i}: {long if i % 2 else 'hello there'}"}], max_tokens=2)
    assert leader.failure is None, leader.failure
    assert leader.steps > 20
    told = leader.ops  # the run went through every op a plan has
    kinds = ["Admit", "Planned", "Ended", "Kept", "demote", "drop", "save", "delete", "read"]
    assert all(told[kind] for kind in kinds + (["KeptSnapshot"] if arch == "qwen3_5" else [])), told
    # Both folders hold the same blocks, byte for byte: the follower wrote its payloads as rank 0 did.
    settled(server, leader)
    core_folder = server.app.state.server.models[model].engine._model.core.parts.warm.folder.root
    ours, theirs = block_files(core_folder), block_files(leader.warm.folder.root)
    assert ours and ours.keys() == theirs.keys()
    assert all(ours[name] == theirs[name] for name in ours)

"""Back-pressure, not stalls: an impossible prompt is refused before it is tokenized, a full
queue answers 503 with Retry-After, and the memory limit bounds what runs at once."""

from __future__ import annotations

import asyncio
import json

import httpx
import openai

from tests.support.inprocess import InProcessServer

LONG = "Tell me everything about the history of lighthouses. " * 4


def test_a_huge_message_is_refused_before_tokenizing_while_others_are_served(server):
    huge = json.dumps({"messages": [{"role": "user", "content": "lighthouse " * 900_000}], "max_tokens": 2})

    async def both():
        async with httpx.AsyncClient(base_url=server.base_url, timeout=120) as http:
            return await asyncio.gather(
                http.post("/v1/chat/completions", content=huge, headers={"content-type": "application/json"}),
                http.post("/v1/chat/completions", json={"messages": [{"role": "user", "content": "Hi"}], "max_tokens": 2}),
            )

    refused, served = asyncio.run(both())
    assert served.status_code == 200
    assert refused.status_code == 400
    error = refused.json()["error"]
    # "at least": the bound from the text's length, known without tokenizing 10 MB.
    assert error["code"] == "context_length_exceeded" and "at least" in error["message"]
    r = httpx.post(server.base_url + "/v1/completions", json={"prompt": "x" * 2_000_000, "max_tokens": 1}, timeout=60)
    assert r.status_code == 400 and "at least" in r.json()["error"]["message"]


def test_beyond_max_waiting_requests_get_503_with_retry_after(tiny_model, tmp_path):
    with InProcessServer(tiny_model, tmp_path, "--max-batch", "1", "--max-waiting", "2") as s:

        async def burst():
            client = s.async_client()

            async def one(i):
                try:
                    r = await client.chat.completions.create(
                        model="tiny", messages=[{"role": "user", "content": f"{i}: {LONG}"}], max_tokens=60
                    )
                    return r.choices[0].finish_reason
                except openai.APIStatusError as e:
                    return e

            return await asyncio.gather(*(one(i) for i in range(8)))

        results = asyncio.run(burst())
        busy = [r for r in results if isinstance(r, openai.APIStatusError)]
        assert busy and len(busy) < 8
        for e in busy:
            assert e.status_code == 503 and e.code == "server_busy"
            assert int(e.response.headers["retry-after"]) >= 1
            assert set(e.body) >= {"message", "type", "param", "code"}
        # Once the queue drains, requests are served again.
        r = s.client().chat.completions.create(model="tiny", messages=[{"role": "user", "content": "Hi"}], max_tokens=2)
        assert r.choices


def largest_batch(server) -> int:
    metrics = httpx.get(server.base_url + "/metrics").text
    counts = {}
    for line in metrics.splitlines():
        if line.startswith("agent_memory_decode_batch_size_bucket"):
            le = line.split('le="')[1].split('"')[0]
            counts[float(le)] = float(line.rsplit(" ", 1)[1])
    total = counts[float("inf")]
    return int(min(le for le, n in counts.items() if n == total))


def test_the_memory_limit_bounds_the_running_requests(tiny_model, tmp_path):
    async def four(s):
        client = s.async_client()
        rs = await asyncio.gather(
            *(
                client.chat.completions.create(model="tiny", messages=[{"role": "user", "content": f"{i} {LONG}"}], max_tokens=20, temperature=0)
                for i in range(4)
            )
        )
        return [r.choices[0].message.content for r in rs]

    # The hot budget takes nearly all of 256 MiB: running requests get their turn one by one.
    with InProcessServer(tiny_model, tmp_path / "tight", "--memory-limit-mb", "256", "--hot-budget-mb", "250") as s:
        tight = asyncio.run(four(s))
        assert largest_batch(s) == 1
        assert "running requests 0 MiB" in s.log() and "one at a time" in s.log()
    with InProcessServer(tiny_model, tmp_path / "roomy", "--memory-limit-mb", "2048", "--hot-budget-mb", "64") as s:
        roomy = asyncio.run(four(s))
        assert largest_batch(s) > 1
    assert tight == roomy  # the same answers, only the schedule differs

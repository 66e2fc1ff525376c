"""Continuous batching through the real server: batched greedy output equals solo output, long
prompts are prefilled in chunks between decode steps, and a client that leaves is cancelled."""

from __future__ import annotations

import asyncio
import threading
import time

import httpx
from tokenizers import Tokenizer

from tests.support.metrics import metric

PROMPTS = [
    "Describe the harbour at dawn.",
    "List three uses of a lighthouse.",
    "What does a keeper write in the log?",
    "Explain how a foghorn works.",
    "Tell me about the storm of 1953.",
    "Why are lighthouses painted in stripes?",
    "Who built the first lighthouse?",
    "How far can the light be seen?",
]


def eos_bias(tiny_model) -> dict[str, int]:
    """logit_bias that keeps the model from ever ending on its own."""
    vocab = Tokenizer.from_file(str(tiny_model / "tokenizer.json")).get_vocab()
    return {str(vocab[t]): -100 for t in ("<|im_end|>", "<|endoftext|>")}


def test_eight_concurrent_requests_equal_their_solo_outputs(server):
    client = server.client()

    def request(prompt):
        return dict(model="tiny", messages=[{"role": "user", "content": prompt}], max_tokens=24, temperature=0)

    solo = [client.chat.completions.create(**request(p)).choices[0].message.content for p in PROMPTS]
    batched_before = metric(server, "agent_memory_decode_batch_size_bucket", le="4.0")
    steps_before = metric(server, "agent_memory_decode_batch_size_count")

    async def together():
        aclient = server.async_client()
        return await asyncio.gather(*(aclient.chat.completions.create(**request(p)) for p in PROMPTS))

    batched = [r.choices[0].message.content for r in asyncio.run(together())]
    assert batched == solo
    # Some decode steps ran with more than four sequences at once.
    steps = metric(server, "agent_memory_decode_batch_size_count") - steps_before
    small = metric(server, "agent_memory_decode_batch_size_bucket", le="4.0") - batched_before
    assert steps - small > 0


def test_long_prompt_is_prefilled_between_decode_steps(server, tiny_model):
    """While a long prompt is prefilled, a running stream keeps receiving tokens."""
    client = server.client()
    bias = eos_bias(tiny_model)
    running = client.chat.completions.create(
        model="tiny",
        messages=[{"role": "user", "content": "Count the waves."}],
        max_tokens=400,
        temperature=0,
        stream=True,
        extra_body={"logit_bias": bias},
    )
    arrivals = []
    chunks = iter(running)
    for chunk in chunks:  # let it start decoding
        if chunk.choices and chunk.choices[0].delta.content:
            break
    tokenizer = Tokenizer.from_file(str(tiny_model / "tokenizer.json"))
    long_prompt = ""
    for i in range(1000):  # about 2,500 tokens of this model's tokenizer
        long_prompt += f"wave {i} rolled in from the north sea and broke on the rocks. "
        if len(tokenizer.encode(long_prompt).ids) > 2500:
            break

    async def long_request():
        aclient = server.async_client()
        return await aclient.chat.completions.create(
            model="tiny", messages=[{"role": "user", "content": long_prompt}], max_tokens=1, temperature=0
        )

    result = {}
    t = threading.Thread(target=lambda: result.update(r=asyncio.run(long_request())))
    started = time.monotonic()
    t.start()
    for chunk in chunks:
        arrivals.append(time.monotonic())
        if not t.is_alive():
            break
    t.join()
    running.close()
    assert result["r"].usage.prompt_tokens > 2000
    during = [a for a in arrivals if a > started]
    # A 2,000+ token prompt takes several prefill chunks; the stream got tokens between them.
    assert len(during) >= 4, len(during)


def test_client_that_leaves_a_stream_is_cancelled(server, tiny_model):
    before = metric(server, "agent_memory_requests_finished_total", reason="cancelled")
    with httpx.Client(base_url=server.base_url, timeout=60) as http:
        with http.stream(
            "POST",
            "/v1/chat/completions",
            json={
                "messages": [{"role": "user", "content": "Tell a very long story."}],
                "max_tokens": 3000,
                "stream": True,
                "logit_bias": eos_bias(tiny_model),
                "prompt_cache_key": "leaver",
            },
        ) as r:
            got = 0
            for line in r.iter_lines():
                got += line.startswith("data:")
                if got >= 3:
                    break
    deadline = time.monotonic() + 30
    while metric(server, "agent_memory_requests_finished_total", reason="cancelled") == before:
        assert time.monotonic() < deadline, "the abandoned stream was not cancelled"
        time.sleep(0.1)
    assert metric(server, "agent_memory_sequences", state="decoding") == 0
    # What it had generated before leaving is cached for the agent's retry.
    agent = httpx.get(server.base_url + "/v1/agents/leaver").json()
    assert 0 < agent["tokens"] < 3000


def test_client_that_leaves_a_plain_request_is_cancelled(server, tiny_model):
    before = metric(server, "agent_memory_requests_finished_total", reason="cancelled")
    body = {
        "messages": [{"role": "user", "content": "Tell another very long story."}],
        "max_tokens": 3000,
        "logit_bias": eos_bias(tiny_model),
    }
    try:
        httpx.post(server.base_url + "/v1/chat/completions", json=body, timeout=1.0)
        raise AssertionError("a 3,000-token answer arrived within a second")
    except httpx.ReadTimeout:
        pass
    deadline = time.monotonic() + 30
    while metric(server, "agent_memory_requests_finished_total", reason="cancelled") == before:
        assert time.monotonic() < deadline, "the abandoned request was not cancelled"
        time.sleep(0.1)

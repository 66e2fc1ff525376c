"""Quantized KV: the batched quantized cache against mlx-lm's per-sequence one, exact
extraction, blocks that keep their bits through the tiers, and every precision end to end."""

from __future__ import annotations

import asyncio

import mlx.core as mx
import pytest
from mlx_lm import load
from mlx_lm.models.cache import QuantizedKVCache

from agent_memory import files
from agent_memory.engine.kinds import attention as kv
from agent_memory.engine.kinds.layers import ModelLayers
from agent_memory.engine.batch.quantized import BatchQuantizedKVCache
from agent_memory.memory.warm.format import blockfile
from agent_memory.precision import KVPrecision
from tests.support.chat import ask, tiers
from tests.support.inprocess import InProcessServer

PROMPTS = [
    "The keeper of the lighthouse wrote in the log that night",
    "Seven ships left the harbour before dawn, and the first of them",
    "A short one",
    "When the storm came over the northern cape the bells of the old church rang for an hour",
]
STEPS = 20


@pytest.fixture(scope="module")
def model_and_tokens(tiny_model):
    model, tokenizer = load(str(tiny_model))
    return model, [tokenizer.encode(p) for p in PROMPTS]


def prefilled(model, tokens: list[int], bits: int, group: int) -> list[QuantizedKVCache]:
    """mlx-lm's own per-sequence quantized cache holding all but the last prompt token."""
    cache = [QuantizedKVCache(group_size=group, bits=bits) for _ in model.layers]
    model(mx.array(tokens[:-1])[None], cache=cache)
    return cache


def solo_greedy(model, tokens: list[int], bits: int, group: int) -> list[int]:
    cache = prefilled(model, tokens, bits, group)
    y, out = tokens[-1], []
    for _ in range(STEPS):
        y = model(mx.array([[y]]), cache=cache)[0, -1].argmax().item()
        out.append(y)
    return out


@pytest.mark.parametrize("bits,group", [(4, 32), (8, 64)])
def test_batched_quantized_decode_equals_per_sequence_decode(model_and_tokens, bits, group):
    """Rows of different lengths decode together; one joins late, one leaves early."""
    model, prompts = model_and_tokens
    expected = [solo_greedy(model, t, bits, group) for t in prompts]
    first, late = prompts[:3], prompts[3]
    caches = [prefilled(model, t, bits, group) for t in first]
    batch = [BatchQuantizedKVCache.merge([c[layer] for c in caches]) for layer in range(len(model.layers))]
    rows = [0, 1, 2]
    y = mx.array([[t[-1]] for t in first])
    got: dict[int, list[int]] = {i: [] for i in range(4)}
    for step in range(STEPS + 5):
        if step == 5:  # a request joins a running batch
            joining = prefilled(model, late, bits, group)
            for layer, c in enumerate(batch):
                c.extend(BatchQuantizedKVCache.merge([joining[layer]]))
            rows.append(3)
            y = mx.concatenate([y, mx.array([[late[-1]]])])
        nxt = model(y, cache=batch)[:, -1].argmax(axis=-1)
        for row, token in zip(rows, nxt.tolist()):
            got[row].append(token)
        y = nxt[:, None]
        done = [i for i, r in enumerate(rows) if len(got[r]) == STEPS]
        if done:  # finished rows leave at once
            keep = [i for i in range(len(rows)) if i not in done]
            if not keep:
                break
            for c in batch:
                c.filter(keep)
            rows = [rows[i] for i in keep]
            y = y[mx.array(keep)]
    assert [got[i] for i in range(4)] == expected


def test_a_sequence_extracted_from_a_batch_has_exactly_its_own_kv(model_and_tokens):
    model, prompts = model_and_tokens
    caches = [prefilled(model, t, 4, 32) for t in prompts]
    batch = [BatchQuantizedKVCache.merge([c[layer] for c in caches]) for layer in range(len(model.layers))]
    for row, own in enumerate(caches):
        for layer, c in enumerate(batch):
            taken = c.extract(row)
            assert taken.offset == own[layer].offset == len(prompts[row]) - 1
            for a, b in zip(taken.keys + taken.values, own[layer].keys + own[layer].values):
                b = b[..., : own[layer].offset, :]
                assert a.shape == b.shape and mx.array_equal(a, b).item()


@pytest.mark.parametrize("bits,group", [(4, 32), (8, 64)])
def test_quantized_blocks_round_trip_through_the_tiers_unchanged(model_and_tokens, tmp_path, bits, group):
    """Hot payload -> block file -> hot payload keeps every bit, and a running sequence's
    working cache gets the same dequantized values whichever tier the block came from."""
    model, prompts = model_and_tokens
    precision = KVPrecision(bits, group)
    cache = prefilled(model, prompts[0], bits, group)
    hot = kv.cut(cache, 0, 8)
    shape = ModelLayers(model).groups[0][2]
    tensors = kv.to_numpy(hot)
    path = tmp_path / "block.safetensors"
    files.write_atomic(path, blockfile.encode({"hash": "h"}, tensors))
    _, arrays = blockfile.read(path, {"hash": "h"}, kv.block_layout(8, shape, precision))
    back = ModelLayers(model).block_from_numpy(arrays, precision).arrays
    assert sorted(back) == sorted(hot)
    for name in hot:
        assert back[name].dtype == hot[name].dtype and mx.array_equal(back[name], hot[name]).item()
    full = KVPrecision()
    assert mx.array_equal(kv.convert(back, precision, full)["k"], kv.convert(hot, precision, full)["k"]).item()


def test_a_commit_keeps_whole_restored_blocks_and_cuts_the_rest_as_attended(model_and_tokens):
    """A running sequence attends to float KV: its restored prefix dequantized, its own tokens
    computed. A block it restored whole keeps its stored bits; a block with its own tokens is
    cut exactly as the sequence attended to it, and cools to --kv-bits only when demoted."""
    model, prompts = model_and_tokens
    precision, full = KVPrecision(4, 32), KVPrecision()
    tokens = prompts[3]
    stored = kv.BlockKV(kv.cut(prefilled(model, tokens[:11], 4, 32), 0, 10), precision)  # at rest
    working = ModelLayers(model).new_cache(full)
    kv.append(working, [(stored, 10)], full)
    model(mx.array(tokens[10:-1])[None], cache=working)
    n = len(tokens) - 1
    runs = [kv.StoredRun(0, 10, stored)]
    kept = kv.cut_at({"": working}, 2, 8, runs, full)
    assert kept.precision == precision
    for name in stored.arrays:
        assert mx.array_equal(kept.arrays[name], stored.arrays[name][:, :, 2:8]).item()
    exact = kv.cut_at({"": working}, 0, n, runs, full)
    assert exact.precision == full
    assert mx.array_equal(exact.arrays["k"], kv.cut(working, 0, n)["k"]).item()
    # What a repeat reads back is what the first request attended to, bit for bit.
    again = ModelLayers(model).new_cache(full)
    kv.append(again, [(exact, n)], full)
    assert mx.array_equal(again[0].keys[..., :n, :], working[0].keys[..., :n, :]).item()
    cooled = kv.demote(exact, precision)
    assert cooled.precision == precision and cooled.nbytes < exact.nbytes / 4


CONVERSATION = [
    {"role": "system", "content": "You keep the records of the lighthouse on the northern cape. " * 8},
    {"role": "user", "content": "What happened on the night of the great storm?"},
]


@pytest.mark.parametrize(
    "args",
    [
        ("--kv-bits", "4", "--kv-group-size", "32"),
        ("--kv-bits", "8", "--kv-group-size", "64"),
        ("--kv-bits", "4", "--kv-group-size", "64", "--disk-kv-bits", "8"),
        ("--kv-bits", "4", "--kv-group-size", "32", "--decode-quantized"),
        ("--kv-bits", "8", "--kv-group-size", "32", "--decode-quantized"),
    ],
    ids=["q4g32", "q8g64", "q4g64-disk8", "q4g32-decode-quantized", "q8g32-decode-quantized"],
)
def test_every_precision_end_to_end(tiny_model, tmp_path, args):
    """Two turns hot, a repeat, a batch of concurrent agents, then a restart that loads from
    disk."""
    with InProcessServer(tiny_model, tmp_path, *args) as s:
        client = s.client()
        first = ask(client, CONVERSATION, "keeper")
        assert first.usage.completion_tokens > 0 and first.choices[0].finish_reason in ("stop", "length")
        turn2 = CONVERSATION + [
            {"role": "assistant", "content": first.choices[0].message.content},
            {"role": "user", "content": "And the morning after?"},
        ]
        second = ask(client, turn2, "keeper")
        hot, warm = tiers(second)
        assert hot >= first.usage.prompt_tokens - 4 and warm == 0
        # A repeat reads back exactly what the first attended to: the same answer.
        from_hot = ask(client, turn2, "keeper").choices[0].message.content
        assert from_hot == second.choices[0].message.content
        if "--decode-quantized" in args:
            check_batched_equals_solo(s)
    with InProcessServer(tiny_model, tmp_path, *args) as s:
        restored = ask(s.client(), turn2, "keeper")
        hot, warm = tiers(restored)
        assert warm >= first.usage.prompt_tokens - 4
        # Running requests attending to quantized KV find the same bits on disk: the same
        # answer. Otherwise memory held the exact KV and the disk holds it at --kv-bits.
        if "--decode-quantized" in args:
            assert restored.choices[0].message.content == from_hot


def check_batched_equals_solo(s: InProcessServer) -> None:
    """Quantized attention in a batch of four gives each request its solo answer. The solo runs
    go first; the batch then reads their prompts' quantized blocks, bit for bit."""
    client = s.client()
    prompts = [[{"role": "user", "content": f"Tell me about ship number {i} of the fleet."}] for i in range(4)]
    solo = [ask(client, p, None, 12).choices[0].message.content for p in prompts]

    async def together():
        aclient = s.async_client()
        return await asyncio.gather(
            *(aclient.chat.completions.create(model="tiny", messages=p, max_tokens=12, temperature=0) for p in prompts)
        )

    assert [r.choices[0].message.content for r in asyncio.run(together())] == solo

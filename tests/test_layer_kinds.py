"""The layer kinds end to end (engine/kinds/): sequences of a sliding-window, a recurrent and a
per-layer CacheList model decode in one batch and answer as they do alone (each cache class
batched as its kind says, engine/batch/decode_batch.py; Llama 4's chunked attention each
sequence in a batch of its own); a hybrid agent's snapshots are
files beside its blocks, named in its manifest, and go with it when it is ended; and a flag that
cannot work with a model's layers is refused at start, in one line, before any request can fail."""

from __future__ import annotations

import asyncio
import contextlib
import json
import time

import httpx
import pytest

from agent_memory.models.tiny import build_tiny
from tests.support.inprocess import InProcessServer, refused_start

PROMPTS = [
    "Describe the harbour at dawn, the boats and the gulls over the water.",
    "List three uses of a lighthouse.",
    "What does a keeper write in the log each night of the winter?",
    "Explain how a foghorn works.",
]


@pytest.fixture(scope="module")
def models(tmp_path_factory):
    root = tmp_path_factory.mktemp("batch-families")
    return lambda arch: build_tiny(root / arch, arch=arch)


@pytest.mark.parametrize("arch", ["gpt_oss", "qwen3_next", "falcon_h1", "llama4"])
def test_sequences_of_every_layer_kind_batch_as_they_run_alone(models, tmp_path, arch):
    """Prompts of different lengths, so that the window and the recurrent states of the rows
    differ, and one request arriving while the others decode."""
    with InProcessServer(models(arch), tmp_path / "cache") as server:
        client = server.client()

        def request(prompt):
            return dict(model=arch, messages=[{"role": "user", "content": prompt}], max_tokens=40, temperature=0)

        # Anonymous and salted apart: no request reuses another's cache, so each is computed alone.
        solo = [
            client.chat.completions.create(**request(p), extra_body={"cache_salt": f"solo-{i}"})
            .choices[0]
            .message.content
            for i, p in enumerate(PROMPTS)
        ]

        async def together():
            aclient = server.async_client()

            async def one(i, p):
                await asyncio.sleep(0.3 * (i == len(PROMPTS) - 1))  # the last joins a running batch
                return await aclient.chat.completions.create(**request(p), extra_body={"cache_salt": f"batch-{i}"})

            return await asyncio.gather(*(one(i, p) for i, p in enumerate(PROMPTS)))

        batched = [r.choices[0].message.content for r in asyncio.run(together())]
        assert batched == solo
        assert "decode step failed" not in server.log() and "Traceback" not in server.log()


def _files(cache_dir) -> tuple[set[str], list[dict]]:
    """(names of the block and snapshot files, the manifests) in the model's warm folder."""
    (folder,) = (cache_dir / "kv").iterdir()
    names = {f.stem for f in (folder / "blocks").rglob("*.safetensors")}
    manifests = []
    for path in (folder / "agents").glob("*.json"):
        with contextlib.suppress(FileNotFoundError):  # the writer may replace it meanwhile: polled again
            manifests.append(json.loads(path.read_text()))
    return names, manifests


def test_a_hybrid_agents_snapshots_are_kept_on_disk_and_go_with_it(models, tmp_path):
    conversation = [
        {"role": "system", "content": "You keep the lighthouse records. " * 6},
        {"role": "user", "content": "What happened on the night of the storm?"},
    ]
    with InProcessServer(models("qwen3_5"), tmp_path, "--disk-budget-mb", "64") as server:
        client = server.client()
        for agent in ("keeper", "visitor"):
            reply = client.chat.completions.create(
                model="qwen3_5",
                messages=conversation,
                max_tokens=8,
                temperature=0,
                extra_body={"prompt_cache_key": agent},
            )
        conversation += [
            {"role": "assistant", "content": reply.choices[0].message.content},
            {"role": "user", "content": "And the morning after?"},
        ]
        client.chat.completions.create(
            model="qwen3_5",
            messages=conversation,
            max_tokens=8,
            temperature=0,
            extra_body={"prompt_cache_key": "keeper"},
        )
        listed = {a["id"]: a for a in httpx.get(server.base_url + "/v1/agents").json()["data"]}
        assert listed["keeper"]["snapshots"] >= 2 and listed["visitor"]["snapshots"] >= 1
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline:  # the writer thread puts them on disk behind the replies
            names, manifests = _files(tmp_path)
            snapshots = {h for m in manifests for _, h in m.get("snapshots", [])}
            if len(manifests) == 2 and snapshots and snapshots <= names:
                break
            time.sleep(0.2)
        keeper = next(m for m in manifests if m["agent"] == "keeper")
        assert {h for _, h in keeper["snapshots"]} <= names
        assert all(0 < position <= len(keeper["tokens"]) for position, _ in keeper["snapshots"])
        assert httpx.delete(server.base_url + "/v1/agents/keeper").status_code == 200
        visitor = next(m for m in manifests if m["agent"] == "visitor")
        kept = set(visitor["blocks"]) | {h for _, h in visitor["snapshots"]}
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline:
            names, manifests = _files(tmp_path)
            if len(manifests) == 1 and names <= kept:
                break
            time.sleep(0.2)
        assert [m["agent"] for m in manifests] == ["visitor"]
        assert names <= kept, "a file only the ended agent named is still on disk"
        assert {h for _, h in keeper["snapshots"]} - kept and not ({h for _, h in keeper["snapshots"]} - kept) & names


def test_a_hybrid_agent_moves_to_another_server_over_redis_with_its_snapshot(models, tmp_path):
    """Two servers sharing one Redis warm tier (docs/scale-out.md): a recurrent-hybrid agent's
    next turn, served by the other server, resumes from the blocks and the snapshot the first
    one wrote there, and answers as with nothing cached."""
    from tests.support.services import RedisServer

    model = models("qwen3_5")
    conversation = [
        {"role": "system", "content": "You keep the lighthouse records. " * 6},
        {"role": "user", "content": "What happened on the night of the storm?"},
    ]

    def turn(server, agent, salt=None):
        extra = {"prompt_cache_key": agent, **({"cache_salt": salt} if salt else {})}
        return server.client().chat.completions.create(
            model="qwen3_5", messages=conversation, max_tokens=8, temperature=0, extra_body=extra
        )

    with RedisServer(tmp_path / "redis") as redis:
        with InProcessServer(model, tmp_path / "a", "--warm-store", redis.url) as first:
            reply = turn(first, "keeper")
        # Its graceful stop flushed its writes: blocks, the snapshot at the turn's end, the manifest.
        conversation += [
            {"role": "assistant", "content": reply.choices[0].message.content},
            {"role": "user", "content": "And the morning after?"},
        ]
        with InProcessServer(model, tmp_path / "b", "--warm-store", redis.url) as second:
            moved, alone = turn(second, "keeper"), turn(second, "stranger", salt="apart")
    hot, warm = (
        moved.usage.prompt_tokens_details.model_extra["hot_tokens"],
        moved.usage.prompt_tokens_details.model_extra["warm_tokens"],
    )
    assert hot == 0 and warm >= reply.usage.prompt_tokens - 1, (hot, warm)
    assert moved.choices[0].message.content == alone.choices[0].message.content


@pytest.mark.parametrize(
    "arch,said,tag",
    [
        ("gpt_oss", "KV quantized in groups of 32: 64 does not divide gpt_oss's head sizes", "q4g32"),
        ("deepseek_v32", "KV kept at 16 bits: no quantization group size", "kv16"),
    ],
)
def test_the_default_q4_fits_each_models_head_sizes(models, tmp_path, arch, said, tag):
    """MLX quantizes KV in groups of 32, 64 or 128 along a head: the tiny models' 32-wide heads
    (and MLA's 16-wide rope keys) take the largest group that fits, or stay unquantized, said at
    start; the warm tier then holds what a restart reads back."""
    conversation = [{"role": "user", "content": "What happened on the night of the storm? " * 3}]

    def turn(server):
        return server.client().chat.completions.create(
            model=arch, messages=conversation, max_tokens=8, temperature=0, extra_body={"prompt_cache_key": "keeper"}
        )

    with InProcessServer(models(arch), tmp_path, "--kv-bits", "4") as first:
        reply = turn(first)
        assert said in first.log() and httpx.get(first.base_url + "/health").json()["kv"]["disk"] == tag
    conversation += [
        {"role": "assistant", "content": reply.choices[0].message.content},
        {"role": "user", "content": "And then?"},
    ]
    with InProcessServer(models(arch), tmp_path, "--kv-bits", "4") as second:
        again = turn(second)
        assert "could not cache" not in second.log()
    assert again.usage.prompt_tokens_details.model_extra["warm_tokens"] >= reply.usage.prompt_tokens - 1


@pytest.mark.parametrize(
    "arch,why",
    [
        ("gemma3_text", "--decode-quantized needs every layer to keep one plain KV cache"),
        ("deepseek_v3", "--decode-quantized: this model's attention cannot read quantized KV"),
    ],
)
def test_decode_quantized_is_refused_at_start_for_models_it_cannot_serve(models, tmp_path, arch, why):
    """Sliding-window layers have no quantized batch cache in mlx-lm, and MLA keeps a latent,
    not attention K/V: the server would fail every request, so it does not start."""
    # The tiny MLA's 16-wide rope keys fit no quantization group: 32 wide, as DeepSeek's own
    # 64 do, the model gets as far as trying to attend to quantized KV.
    folder = (
        build_tiny(tmp_path / arch, arch=arch, config={"qk_rope_head_dim": 32})
        if arch == "deepseek_v3"
        else models(arch)
    )
    said = refused_start(folder, tmp_path, "--kv-bits", "4", "--decode-quantized")
    assert why in said and "Traceback" not in said
    refusals = [line for line in said.splitlines() if why in line]
    assert len(refusals) == 1 and f"{arch}: " in refusals[0]


def test_a_cache_of_a_kind_this_server_cannot_keep_is_named_in_the_refusal():
    """A cache class no kind keeps (mlx-lm's `ConcatenateKVCache`) is refused at start, the
    class named; Llama 4's `ChunkedKVCache` is a kind (engine/kinds/chunked.py)."""
    from mlx_lm.models.cache import CacheList, ChunkedKVCache, ConcatenateKVCache, KVCache, RotatingKVCache

    from agent_memory.engine.kinds.registry import refusal

    assert refusal([KVCache(), RotatingKVCache(32), CacheList(KVCache(), ChunkedKVCache(64))]) is None
    why = refusal([KVCache(), CacheList(KVCache(), ConcatenateKVCache())])
    assert why is not None and "ConcatenateKVCache" in why and "KVCache, QuantizedKVCache, RotatingKVCache" in why

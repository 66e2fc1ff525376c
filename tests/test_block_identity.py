"""A block's identity beyond its tokens (memory/hashing.py): the same token ids fixed by another
extra key (an image's digest: its placeholder tokens are the same for every image) share no KV,
the same key shares all of it, and a block no key covers keeps the name it always had, so a warm
folder written before still reads."""

from __future__ import annotations

import hashlib
import json

import numpy as np

from agent_memory import files
from agent_memory.agent_key import AgentKey, agent_file_stem
from agent_memory.memory.hashing import BlockNames, SpanKey
from agent_memory.memory.index.blocks import Tier
from agent_memory.memory.index.store import AgentCacheStore
from agent_memory.memory.warm.format import blockfile
from agent_memory.memory.warm.format.records import BlockRecord, Manifest
from agent_memory.precision import KVPrecision
from tests.support.fake_kv import BYTES_PER_TOKEN, FINGERPRINT, FakeKV, encode, make_store

IMAGE_A, IMAGE_B = SpanKey(4, 8, hashlib.sha256(b"a cat").digest()), SpanKey(4, 8, hashlib.sha256(b"a dog").digest())
TOKENS = [1, 2, 3, 9, 9, 9, 9, 9, 4, 5, 6, 7]  # 9: an image's placeholder, at 4..8


def memory_only() -> AgentCacheStore:
    return AgentCacheStore(block_tokens=4, salt=FINGERPRINT, hot_budget_bytes=1 << 20, attention_tokens=50.0)


def commit(store: AgentCacheStore, agent: str, tokens: list[int], extras=()) -> None:
    cut = lambda s, e: (FakeKV(tuple(tokens[s:e])), (e - s) * BYTES_PER_TOKEN, False)  # noqa: E731
    persist = store.commit(AgentKey(agent), tokens, cut, extras=extras)
    if store.warm is not None:
        persist.write(store.warm, encode)


def reused(store: AgentCacheStore, tokens: list[int], extras=()) -> int:
    lease = store.lookup(tokens, None, extras)
    store.release(lease)
    return lease.end


def todays_name(parent: str | None, tokens: list[int]) -> str:
    """A block's name as versions before extra keys computed it: blake2b(salt; parent, ids)."""
    h = hashlib.blake2b(FINGERPRINT.encode(), digest_size=16)
    h.update(bytes.fromhex(parent) if parent else b"\0" * 16)
    h.update(np.asarray(tokens, dtype="<u4").tobytes())
    return h.hexdigest()


def test_the_same_tokens_under_another_image_share_no_block_the_image_covers():
    store = memory_only()
    commit(store, "a", TOKENS, [IMAGE_A])
    assert reused(store, TOKENS, [IMAGE_B]) == 4  # the block before the image only
    assert reused(store, TOKENS) == 4  # tokens alone are not the image either
    assert reused(store, TOKENS, [IMAGE_A]) == len(TOKENS)  # the same image: all of it


def test_a_block_is_shared_up_to_the_first_token_another_image_covers():
    store = memory_only()
    later_a, later_b = SpanKey(6, 8, IMAGE_A.key), SpanKey(6, 8, IMAGE_B.key)
    commit(store, "a", TOKENS, [later_a])
    assert reused(store, TOKENS, [later_b]) == 6  # the second block's tokens before the image
    commit(store, "b", TOKENS, [later_b])  # both now: each request finds its own
    assert reused(store, TOKENS, [later_a]) == reused(store, TOKENS, [later_b]) == len(TOKENS)


def test_a_block_no_key_covers_keeps_its_name_and_one_a_key_covers_gets_another():
    names = BlockNames(FINGERPRINT, 4)
    chain = names.chain(TOKENS)
    assert [h for h, *_ in chain] == [
        todays_name(None, TOKENS[:4]),
        todays_name(chain[0][0], TOKENS[4:8]),
        todays_name(chain[1][0], TOKENS[8:]),
    ]
    covered = names.chain(TOKENS, None, [IMAGE_A])
    assert covered[0][0] == chain[0][0] and covered[1][0] != chain[1][0] and covered[2][0] != chain[2][0]
    assert names.chain(TOKENS, None, [IMAGE_B])[1][0] != covered[1][0]


def test_a_warm_folder_written_before_extra_keys_still_reads(tmp_path):
    """Block files and a manifest in today's format, named by today's formula, written by hand:
    a store restarted over them reuses every block from disk."""
    precision_meta = KVPrecision().file_meta()
    parent, names = None, []
    for start in range(0, len(TOKENS), 3):  # make_store's blocks: 3 tokens
        tokens = TOKENS[start : start + 3]
        h = todays_name(parent, tokens)
        meta = {"fingerprint": FINGERPRINT, **precision_meta, "hash": h, "parent": parent or "",
                "start": str(start), "tokens": json.dumps(tokens, separators=(",", ":"))}
        path = tmp_path / "blocks" / h[:2] / f"{h}.safetensors"
        path.parent.mkdir(parents=True, exist_ok=True)
        files.write_atomic(path, blockfile.encode(meta, {"k": ("U32", np.asarray(tokens, np.uint32))}))
        parent = h
        names.append(h)
    manifest = {"version": 1, "agent": "old", "fingerprint": FINGERPRINT, "last_used": 1.0e9, "blocks": names, "tokens": TOKENS}
    (tmp_path / "agents").mkdir()
    (tmp_path / "agents" / f"{agent_file_stem(AgentKey('old'))}.json").write_text(json.dumps(manifest))
    store, disk = make_store(tmp_path)
    lease = store.lookup(TOKENS + [1])
    assert lease.end == len(TOKENS) and all(s.block.tier is Tier.WARM for s in lease.segments)
    for s in lease.segments:
        assert disk.read_block(s.block).result()["k"].tolist() == list(s.block.tokens)
    store.release(lease)
    disk.close()


def test_extra_keys_survive_a_restart_and_old_manifests_are_unchanged(tmp_path):
    store, disk = make_store(tmp_path, hot_tokens=0)  # every block leaves memory: reuse is from disk
    key = SpanKey(3, 6, IMAGE_A.key)
    commit(store, "img", TOKENS, [key])
    commit(store, "plain", [7, 7, 7, 7])
    disk.flush()
    disk.close()
    written = {m.key.id: m for m in map(Manifest.read, (tmp_path / "agents").glob("*.json"))}
    assert written["img"].extras == (key,) and written["plain"].extras == ()
    plain_json = json.loads(written["plain"].path.read_text())
    assert "extras" not in plain_json  # a manifest without extra keys is as before
    for path in (tmp_path / "blocks").rglob("*.safetensors"):  # what `cache verify` checks of each file
        block = BlockRecord.from_meta(blockfile.read(path, {"hash": path.stem}, None)[0])
        assert BlockNames(FINGERPRINT, 3).block_hash(block.parent, block.tokens, block.extras) == block.hash
        assert bool(block.extras) == (block.tokens == tuple(TOKENS[3:6]))  # the one block the image covers
    store, disk = make_store(tmp_path)
    assert reused(store, TOKENS, [key]) == len(TOKENS)
    assert reused(store, TOKENS, [SpanKey(3, 6, IMAGE_B.key)]) == 3
    disk.close()

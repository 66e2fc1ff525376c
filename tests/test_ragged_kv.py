"""RaggedKVCache against the plain per-sequence KV it stands for: whatever rows join, write,
drop their own last positions (holes), leave or get squeezed, each row extracts exactly the KV
of the positions it kept, and the attention mask lets each row see exactly those."""

from __future__ import annotations

import mlx.core as mx
from hypothesis import settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, invariant, precondition, rule

from agent_memory.engine.batch import ragged_kv
from agent_memory.engine.batch.ragged_kv import RaggedKVCache, join
from mlx_lm.models.cache import KVCache

HEADS, DIM = 2, 4


def kv_of(values: list[int]) -> tuple[mx.array, mx.array]:
    """Keys and values whose every position says which token it holds."""
    keys = mx.array(values, dtype=mx.float32)[None, None, :, None] * mx.ones((1, HEADS, 1, DIM))
    return keys, -keys


class Rows(RuleBasedStateMachine):
    """The cache and, beside it, each row's kept tokens as a list (the reference)."""

    def __init__(self) -> None:
        super().__init__()
        self.cache: RaggedKVCache | None = None
        self.rows: list[list[int]] = []
        self.next = 1

    def _tokens(self, n: int) -> list[int]:
        self.next += n
        return list(range(self.next - n, self.next))

    @rule(length=st.integers(1, 9))
    def join(self, length):
        single = KVCache()
        tokens = self._tokens(length)
        single.update_and_fetch(*kv_of(tokens))
        self.cache = join([self.cache] if self.cache is not None else [], [single])[0]
        self.rows.append(tokens)

    @precondition(lambda self: self.rows)
    @rule(width=st.integers(1, 6), data=st.data())
    def write_then_drop(self, width, data):
        written = [self._tokens(width) for _ in self.rows]
        keys, values = zip(*(kv_of(t) for t in written))
        mask = self.cache.make_mask(width)
        self._check_mask(mask, written)
        self.cache.update_and_fetch(mx.concatenate(keys), mx.concatenate(values))
        extra = [data.draw(st.integers(0, width)) for _ in self.rows]
        ragged_kv.drop([self.cache], extra)
        for row, new, e in zip(self.rows, written, extra):
            row.extend(new[: width - e])

    @precondition(lambda self: len(self.rows) > 1)
    @rule(data=st.data())
    def some_leave(self, data):
        keep = sorted(data.draw(st.sets(st.integers(0, len(self.rows) - 1), min_size=1)))
        self.cache.filter(keep)
        self.rows = [self.rows[i] for i in keep]

    def _check_mask(self, mask: mx.array, written: list[list[int]]) -> None:
        """Row i's query j sees its kept tokens and its first j + 1 written ones."""
        keys = self.cache.keys[..., : self.cache._idx, 0][:, 0] if self.cache.keys is not None else None
        for i, row in enumerate(self.rows):
            seen = mask[i, 0].tolist()
            cached = keys[i].tolist() if keys is not None else []
            for j in range(len(written[i])):
                visible = [int(k) for k, s in zip(cached, seen[j]) if s]
                assert visible == row
                assert seen[j][len(cached) :] == [n <= j for n in range(len(written[i]))]

    @invariant()
    def each_row_extracts_its_own_kv(self):
        for i, row in enumerate(self.rows):
            single = self.cache.extract(i)
            assert single.offset == len(row)
            assert single.keys[0, 0, :, 0].tolist() == row
            assert single.values[0, 1, :, 3].tolist() == [-t for t in row]
        if self.rows:
            assert self.cache.offset.tolist() == [len(r) for r in self.rows]


Rows.TestCase.settings = settings(max_examples=60, stateful_step_count=30, deadline=None)


def test_ragged_kv_keeps_each_rows_own_positions(monkeypatch):
    monkeypatch.setattr(ragged_kv, "HOLES", 3)  # holes squeezed out often, not only past 128
    Rows.TestCase().runTest()

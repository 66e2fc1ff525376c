"""An in-process shadow follower: rank 0's engine records every step's plan (a group of size 1,
no collectives), and a `Follower` over the same unsharded model executes it beside it. After
every step the follower's payloads and caches are compared with rank 0's: where the plan is
incomplete, they differ (engine/distributed/, docs/architecture.md)."""

from __future__ import annotations

import contextlib
import traceback
from collections import Counter, defaultdict, deque
from pathlib import Path

import mlx.core as mx
from mlx.utils import tree_flatten

from agent_memory.engine.distributed.follower import Follower
from agent_memory.engine.distributed.plan import Planned, RankStatus, StepPlan, StepWork
from agent_memory.engine.distributed.recorder import Recorder
from agent_memory.engine.kinds.layers import ModelLayers
from agent_memory.engine.loading.warm import open_warm_tier
from agent_memory.engine.parts import demoter
from agent_memory.memory.warm.shards import BlocksOnly


class ShadowLeader:
    """Rank 0's group: `broadcast` first lets the follower finish the step rank 0 just finished
    (its tokens are known now), then applies the new plan's ops and compares."""

    rank, size = 0, 1
    heartbeat_s = 5.0  # idle: empty plans, checked as any other

    def __init__(self, core, warm_dir: Path | None) -> None:
        """`warm_dir`: the follower's own cache dir, where rank 0 has a warm tier."""
        self.core = core
        parts = core.parts
        model = parts.loaded.model
        self.tokens: dict[int, deque] = defaultdict(deque)  # rank 0's sampled tokens, per sequence
        self.agreed: deque[list[int]] = deque()  # rank 0's warm read agreements, in order
        follower_group = _FollowerGroup(self.tokens, self.agreed)
        eos = parts.loaded.tokenizer.eos_token_ids
        precisions = parts.precisions
        layers = ModelLayers(model)
        self.warm = None
        if core.parts.warm is not None:  # the follower's own folder, for its own writes and reads
            budget = core.store.disk_budget_bytes
            self.warm = open_warm_tier(warm_dir, budget, parts.loaded, layers, precisions)[0]
            self.warm.start(BlocksOnly())
        self.follower = Follower(model, layers, precisions, eos, follower_group, demoter(precisions), self.warm)
        self._work: StepWork | None = None
        self.steps = 0  # compared
        self.ops: Counter = Counter()  # what the plans told, by kind (PoolOp by its op)
        self.failure: str | None = None

    def broadcast(self, plan: StepPlan | None, status: RankStatus):
        if self.failure is None:
            try:
                self.follower.execute(self._work)
                self.ops.update(getattr(op, "op", type(op).__name__) for op in plan.ops)
                self.ops["read"] += sum(len(op.reads) for op in plan.ops if isinstance(op, Planned))
                self.follower.apply(plan.ops)
                self._work = plan.work
                self.failure = self.compare()
                self.steps += 1
            except Exception:
                self.failure = traceback.format_exc()
        return plan, []

    def watching(self, what: str):
        return contextlib.nullcontext()  # one process: no collective to wait for

    def agree(self, bits: list[int]) -> list[int]:
        self.agreed.append(bits)  # the follower's answer is rank 0's (it runs this step later)
        return bits

    def token_sum(self, seq_id: int):
        def send(token: mx.array) -> mx.array:
            self.tokens[seq_id].append(token)
            return token

        return send

    def compare(self) -> str | None:
        """What differs between rank 0 and the follower now (None: nothing)."""
        pool = self.core.store.pool
        held = {h: b.payload for h, b in pool.blocks.items() if b.payload is not None}
        mine = self.follower.payloads.held
        if set(held) != set(mine):
            return f"step {self.steps}: payloads of {sorted(set(held) ^ set(mine))} held by one side only"
        for h, payload in held.items():
            other = mine[h]
            precisions = (getattr(payload, "precision", None), getattr(other, "precision", None))
            if type(payload) is not type(other) or precisions[0] != precisions[1]:
                return f"step {self.steps}: block {h[:12]} of another kind or precision"
            if payload.arrays.keys() != other.arrays.keys():
                return f"step {self.steps}: block {h[:12]} holds other tensors"
            for name, array in payload.arrays.items():
                if not _equal(array, other.arrays[name]):
                    return f"step {self.steps}: block {h[:12]} {name} differs"
        if self.core.parts.batch.seq_ids != self.follower.batch.seq_ids:
            return f"step {self.steps}: batch {self.core.parts.batch.seq_ids} != {self.follower.batch.seq_ids}"
        for seq in self.core.seqs.values():
            if seq.cache is None:
                continue
            shadow = self.follower.shadows[seq.id]
            if shadow.pos != seq.pos:
                return f"step {self.steps}: sequence {seq.id} at {seq.pos}, its shadow at {shadow.pos}"
            if not all(_same_layer(a, b) for a, b in zip(seq.cache, shadow.cache)):
                return f"step {self.steps}: sequence {seq.id}'s cache differs"
        return None


def _equal(a, b) -> bool:
    if not isinstance(a, mx.array) or not isinstance(b, mx.array):
        return type(a) is type(b) and a == b  # None where nothing is held yet
    return a.shape == b.shape and mx.array_equal(a, b).item()


def _same_layer(a, b) -> bool:
    """Two layers' caches hold the same (a KV cache's keys and values, a recurrent layer's state)."""
    sa, sb = tree_flatten(a.state), tree_flatten(b.state)
    return [k for k, _ in sa] == [k for k, _ in sb] and all(_equal(x, y) for (_, x), (_, y) in zip(sa, sb))


class _FollowerGroup:
    """The follower's side: its sampler's all_sum adds rank 0's token to its zeros."""

    rank, size = 1, 1

    def __init__(self, tokens: dict[int, deque], agreed: deque) -> None:
        self.tokens = tokens
        self.agreed = agreed

    def agree(self, bits: list[int]) -> list[int]:
        """Rank 0's agreement of the same prefill: the follower's own failures must be in it."""
        theirs = self.agreed.popleft()
        assert len(theirs) == len(bits) and all(t >= b for t, b in zip(theirs, bits)), (theirs, bits)
        return theirs

    def token_sum(self, seq_id: int):
        return lambda zeros: zeros + self.tokens[seq_id].popleft()


def follow(server, warm_dir: Path | None = None) -> ShadowLeader:
    """Record the served model's engine steps for a shadow follower (before any request); with
    a warm tier, the follower's is under `warm_dir`."""
    (served,) = server.app.state.server.models.values()
    engine = served.engine

    def attach() -> ShadowLeader:
        core = engine._model.core  # the test's seam: a real group is wired where the model loads
        leader = ShadowLeader(core, warm_dir)
        Recorder(leader).attach(core)
        return leader

    return engine.call(attach).result()


def settled(server, leader: ShadowLeader) -> None:
    """Rank 0's writes done, what they made it delete told to the follower (an idle plan), and
    the follower's writes done: both folders are then comparable."""
    (served,) = server.app.state.server.models.values()
    core = served.engine._model.core
    core.parts.warm.flush()
    served.engine.call(core.recorder.heartbeat).result()
    leader.warm.flush()


def block_files(folder) -> dict[str, bytes]:
    """A warm folder's block files, by name, with their bytes."""
    return {p.name: p.read_bytes() for p in Path(folder).glob("blocks/*/*") if p.is_file()}

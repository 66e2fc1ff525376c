"""`--trace-file PATH`: where the engine's time goes, one JSON line per event, for
`scripts/bench_agents.py --trace` and for anyone asking why a turn was slow.

Events (clock: `time.perf_counter()` of the server):
- `decode`: one decode step (t0, t1, n sequences);
- `prefill`: one prefill chunk of a sequence (t0, t1, tokens, whether a follow-up);
- `seq`: a sequence at its end, with its times: submitted, plan/plan_end (the cache lookup),
  cached tokens, warm reads and when the last was done, its prefill calls, first token, end;
- `commit`: KV given to the store (blocks, agent) and `job`: the warm tier's writer storing a
  block or a manifest of that commit (t0, t1: the write with its fsyncs).
Each line is flushed, so a killed server loses at most the line it was writing. Without the
setting the engine holds `NO_TRACE`, whose methods do nothing.
"""

from __future__ import annotations

import json
import os
import threading
import time
from pathlib import Path

from agent_memory.engine.sequence import Sequence

clock = time.perf_counter


class NoTrace:
    """Tracing off: every hook is a no-op."""

    def planned(self, seq: Sequence, t0: float) -> None: ...

    def read_done(self, seq_id: int) -> None: ...

    def prefilled(self, seq: Sequence, t0: float, tokens: int) -> None: ...

    def decoded(self, t0: float, n: int) -> None: ...

    def first_token(self, seq: Sequence) -> None: ...

    def ended(self, seq: Sequence, reason: str) -> None: ...

    def committed(self, blocks: list[str], agent: str | None, t0: float) -> None: ...

    def job(self, kind: str, key: str, t0: float) -> None: ...


NO_TRACE = NoTrace()


class Trace(NoTrace):
    def __init__(self, path: Path) -> None:
        self._out = open(path, "a", buffering=1)
        self._lock = threading.Lock()  # the engine thread and the warm tier's writer both write
        self._seqs: dict[int, dict] = {}
        self._commits = 0
        self._commit_of: dict[str, int] = {}  # block hash or agent id -> the commit that wrote it
        self._emit(kind="start", t=clock(), wall=time.time(), pid=os.getpid())

    def _emit(self, **event) -> None:
        with self._lock:
            self._out.write(json.dumps(event, separators=(",", ":")) + "\n")

    def _seq(self, seq: Sequence) -> dict:
        record = self._seqs.get(seq.id)
        if record is None:
            agent = seq.agent.id if seq.agent is not None else None  # an unnamed one once recognised
            record = self._seqs[seq.id] = {
                "seq": seq.id,
                "agent": agent,
                "prompt": len(seq.prompt),
                "submitted": seq.submitted,
                "prefill_only": seq.prefill_only,
                "prefill_calls": [],
                "reads": 0,
                "reads_done": None,
            }
        return record

    def planned(self, seq: Sequence, t0: float) -> None:
        record = self._seq(seq)
        record.update(plan=t0, plan_end=clock(), reads=len(seq.reads))
        record["cached"] = seq.lease.end if seq.lease is not None else 0

    def read_done(self, seq_id: int) -> None:
        record = self._seqs.get(seq_id)
        if record is not None:
            record["reads_done"] = max(record["reads_done"] or 0.0, clock())

    def prefilled(self, seq: Sequence, t0: float, tokens: int) -> None:
        t1 = clock()
        record = self._seq(seq)
        record["prefill_calls"].append((t0, t1, tokens))
        if not seq.plan:
            record.setdefault("prefill_end", t1)
        self._emit(kind="prefill", seq=seq.id, t0=t0, t1=t1, tokens=tokens, followup=seq.prefill_only)

    def decoded(self, t0: float, n: int) -> None:
        self._emit(kind="decode", t0=t0, t1=clock(), n=n)

    def first_token(self, seq: Sequence) -> None:
        self._seq(seq)["first_token"] = clock()

    def ended(self, seq: Sequence, reason: str) -> None:
        record = self._seq(seq)
        del self._seqs[seq.id]
        u = seq.generation.usage
        record.update(kind="seq", end=clock(), reason=reason, hot=u.hot_tokens, warm=u.warm_tokens)
        record["completion"] = u.completion_tokens
        self._emit(**record)

    def committed(self, blocks: list[str], agent: str | None, t0: float) -> None:
        with self._lock:
            self._commits += 1
            commit = self._commits
            for h in blocks:
                self._commit_of[h] = commit
            if agent is not None:
                self._commit_of[agent] = commit
        self._emit(kind="commit", commit=commit, t=t0, t1=clock(), blocks=len(blocks), agent=agent)

    def job(self, kind: str, key: str, t0: float) -> None:
        """A warm-tier write, fsyncs included (`key`: the block hash, or a manifest's agent id)."""
        with self._lock:
            commit = self._commit_of.pop(key, None) if kind == "save_block" else self._commit_of.get(key)
        self._emit(kind="job", job=kind, t0=t0, t1=clock(), commit=commit)

"""--trace: where our server's time goes, from the trace it writes (serve --trace-file,
engine/observability/trace.py): each phase's TTFT split into queue, disk reads, prefill and first step, and
the warm tier's writer."""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path

from bench.report import fmt
from bench.stats import pct
from bench.turns import Record

def read_trace(paths: list[Path]) -> list[list[dict]]:
    """Each start's events (a cut-off last line, from a SIGKILL, is dropped)."""
    starts = []
    for path in paths:
        events = []
        try:
            lines = path.read_text().splitlines()
        except OSError:
            lines = []
        for line in lines:
            try:
                events.append(json.loads(line))
            except ValueError:
                pass
        starts.append(events)
    return starts


def _overlap(a0: float, a1: float, spans: list[tuple[float, float]]) -> float:
    return sum(max(0.0, min(a1, b1) - max(a0, b0)) for b0, b1 in spans)


def _median(values: list) -> float | None:
    return pct([v for v in values if v is not None], 0.5)


def _ttft_parts(e: dict, prefills: list[tuple[float, float, int]], decodes: list[tuple[float, float]]) -> dict:
    """Where one request's TTFT went, from its `seq` event and the start's prefill and decode spans."""
    sub, plan = e["submitted"], e.get("plan", e["submitted"])
    ready = max(e.get("plan_end", plan), e.get("reads_done") or 0.0)
    calls = e.get("prefill_calls") or []
    p0 = calls[0][0] if calls else ready
    p1 = e.get("prefill_end", calls[-1][1] if calls else ready)
    own = [(a, b) for a, b, _ in calls]
    others = [(a, b) for a, b, s in prefills if s != e["seq"]]
    return {
        "ttft": e["first_token"] - sub,
        "queue": plan - sub,
        "queue_behind_prefills": _overlap(sub, plan, others),
        "queue_in_decode_steps": _overlap(sub, plan, decodes),
        "reads": (e["reads_done"] - e.get("plan_end", plan)) if e.get("reads_done") else 0.0,
        "wait_after_lookup": max(0.0, p0 - ready),
        "prefill": p1 - p0,
        "prefill_own": sum(b - a for a, b in own),
        "prefill_others": _overlap(p0, p1, others),
        "prefill_decode_steps": _overlap(p0, p1, decodes),
        "first_step": e["first_token"] - p1,
        "new_tokens": e["prompt"] - (e.get("cached") or 0),
        "warm_blocks": e.get("reads", 0),
        "arrival_to_warm_read": (e["reads_done"] - sub) if e.get("reads_done") else None,
    }


def _phase_rows(events: list[dict], phases: list[str], by_key: dict[tuple[str, int], list[str]],
                rows: dict[str, list[dict]]) -> None:
    """Each request of one start, matched to its phase by agent and prompt length, into `rows`."""
    prefills = [(e["t0"], e["t1"], e["seq"]) for e in events if e.get("kind") == "prefill"]
    decodes = [(e["t0"], e["t1"]) for e in events if e.get("kind") == "decode"]
    for e in events:
        if e.get("kind") != "seq" or e.get("prefill_only") or e.get("first_token") is None:
            continue
        cands = [p for p in by_key.get((e.get("agent"), e.get("prompt")), []) if p in phases]
        if cands:
            rows.setdefault(cands[0], []).append(_ttft_parts(e, prefills, decodes))


@dataclass
class WriterTimes:
    """The warm tier's writer over every start: seconds per file and per commit, files per
    commit, commit -> its last file durable."""

    write_file: list[float] = field(default_factory=list)
    write_commit: list[float] = field(default_factory=list)
    files_per_commit: list[int] = field(default_factory=list)
    durable: list[float] = field(default_factory=list)

    def add_start(self, events: list[dict]) -> None:
        per_commit: dict[int, list[float]] = {}
        commit_t = {e["commit"]: e["t"] for e in events if e.get("kind") == "commit"}
        last_job: dict[int, float] = {}
        for e in events:
            if e.get("kind") != "job":
                continue
            if e["job"].startswith("save"):
                self.write_file.append(e["t1"] - e["t0"])
            if e.get("commit") is not None:
                per_commit.setdefault(e["commit"], []).append(e["t1"] - e["t0"])
                last_job[e["commit"]] = max(last_job.get(e["commit"], 0.0), e["t1"])
        for c, writes in per_commit.items():
            self.write_commit.append(sum(writes))
            self.files_per_commit.append(len(writes))
            if c in commit_t and c in last_job:
                self.durable.append(last_job[c] - commit_t[c])

    def summary(self) -> dict:
        w, c, d = self.write_file, self.write_commit, self.durable
        return {"files": len(w), "commits": len(c),
                "write_per_file_median": _median(w), "write_per_file_p90": pct(w, 0.9),
                "files_per_commit_median": _median(self.files_per_commit),
                "write_per_commit_median": _median(c), "write_per_commit_p90": pct(c, 0.9),
                "commit_to_durable_median": _median(d), "commit_to_durable_p90": pct(d, 0.9),
                "commit_to_durable_max": max(d) if d else None}


def analyze_trace(starts: list[list[dict]], phase_of_start: list[list[str]], records: list[Record]) -> dict:
    """Per phase, medians of where each request's TTFT went (server clock): queued before its
    lookup (split: behind other requests' prefills, in decode steps, other), its disk reads,
    its prefill (its own compute, others' prefills and decode steps interleaved), the first
    decode step. Plus arrival -> warm blocks read, and the warm tier's writer: time per file and
    per commit (writes with their fsyncs), commit -> durable."""
    by_key: dict[tuple[str, int], list[str]] = {}
    for r in records:
        if r.prompt_tokens is not None and not r.error:
            by_key.setdefault((f"bench-agent-{r.agent:03d}", r.prompt_tokens), []).append(r.phase)
    rows: dict[str, list[dict]] = {}
    writer = WriterTimes()
    for events, phases in zip(starts, phase_of_start):
        _phase_rows(events, phases, by_key, rows)
        writer.add_start(events)
    phases_out = {}
    for phase, rs in rows.items():
        keys = [k for k in rs[0] if k not in ("new_tokens", "warm_blocks")]
        phases_out[phase] = {"n": len(rs), **{k: _median([r[k] for r in rs]) for k in keys},
                             "new_tokens": _median([r["new_tokens"] for r in rs]),
                             "warm_blocks": _median([r["warm_blocks"] for r in rs])}
    return {"phases": phases_out, "disk": writer.summary()}


def trace_table(levers: dict) -> str:
    ms = lambda v: "n/a" if v is None else f"{v * 1000:.0f}"  # noqa: E731
    lines = ["| phase | n | TTFT | queued | ↳ behind others' prefills | ↳ in decode steps | disk reads | "
             "prefill span | ↳ own compute | ↳ others' prefills | ↳ decode steps | first step | arrival → warm read | "
             "new tokens |", "|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|"]
    for phase in ("first", "later", "crash", "graceful"):
        p = levers["phases"].get(phase)
        if not p:
            continue
        lines.append(f"| {phase} | {p['n']} | {ms(p['ttft'])} | {ms(p['queue'])} | {ms(p['queue_behind_prefills'])} | "
                     f"{ms(p['queue_in_decode_steps'])} | {ms(p['reads'])} | {ms(p['prefill'])} | "
                     f"{ms(p['prefill_own'])} | {ms(p['prefill_others'])} | {ms(p['prefill_decode_steps'])} | "
                     f"{ms(p['first_step'])} | {ms(p['arrival_to_warm_read'])} | {fmt(p['new_tokens'], digits=0)} |")
    d = levers["disk"]
    lines.append("")
    lines.append(f"warm tier's writer: {d['files']} files in {d['commits']} commits; write (with its fsyncs) per "
                 f"file median {ms(d['write_per_file_median'])} ms (p90 {ms(d['write_per_file_p90'])}); files per "
                 f"commit median {fmt(d['files_per_commit_median'], digits=0)}, write per commit median "
                 f"{ms(d['write_per_commit_median'])} ms (p90 {ms(d['write_per_commit_p90'])}); "
                 f"commit -> last file durable median {ms(d['commit_to_durable_median'])} ms "
                 f"(p90 {ms(d['commit_to_durable_p90'])}, max {ms(d['commit_to_durable_max'])})")
    return "\n".join(lines)

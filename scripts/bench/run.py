"""One run's state and its first phase: the server it talks to (started here, or one already
running at --base-url), its agents, the turns, and the cache state read after them."""

from __future__ import annotations

import argparse
import asyncio
import shutil
import time
from dataclasses import dataclass, field
from pathlib import Path

from bench.kv_memory import fetch_cache_state, model_geometry
from bench.peers import BASE
from bench.processes import RSSSampler, has_openblas, load_average
from bench.server import wait_ready
from bench.servers import BenchServer
from bench.turns import (Agent, Record, persona, prior_history, probe_shared_prefix, run_phase, shared_document,
                         warm_up)


def model_name_for(kind: str, args) -> str:
    if args.model_name:
        return args.model_name
    # mlx_lm.server loads whatever `model` names (a hub id or path) unless it is "default_model".
    if kind == "mlx-lm":
        return "default_model"
    return Path(args.model).name if args.model else "default"


@dataclass
class Run:
    """Where a run sends its requests, its agents, and what it has measured so far (`result`
    holds the figures; `records` every request; `walls` each phase's seconds)."""

    kind: str
    args: argparse.Namespace
    tag: str
    server: BenchServer | None  # None: an external server (--base-url)
    base_url: str
    root: str
    pid: int | None
    doc: str
    agents: list[Agent]
    result: dict
    records: list[Record] = field(default_factory=list)
    walls: dict[str, float] = field(default_factory=dict)
    phase_of_start: list[list[str]] = field(default_factory=lambda: [["first", "later"]])
    peaks: list[int] = field(default_factory=list)
    sampler: RSSSampler | None = None
    last_turn_end: float = 0.0

    @property
    def model_name(self) -> str:
        return model_name_for(self.kind, self.args)

    def follow_server(self) -> None:
        """After a (re)start: the server's new address and process, its memory sampled anew."""
        process = self.server.process
        self.base_url, self.root, self.pid = process.base_url, process.url, process.pid
        self.sampler = RSSSampler(self.pid)

    def stop_sampler(self) -> None:
        if self.sampler:
            self.peaks.append(self.sampler.stop())
            self.sampler = None

    def warm_up(self) -> None:
        if not self.args.no_warmup:
            asyncio.run(warm_up(self.base_url, self.model_name, self.args))

    def phase(self, turns: int, phase_of, first_turn: int) -> float:
        """Every agent `turns` more turns; the phase's wall seconds."""
        recs, wall = asyncio.run(run_phase(self.base_url, self.model_name, self.agents, turns, phase_of, first_turn,
                                           self.args))
        self.records += recs
        self.last_turn_end = time.monotonic()
        return wall

    def turns_phase(self, turns: int) -> None:
        """The agents' turns (the first "first", the rest "later"), then the cache state and the
        shared-prefix probe."""
        self.warm_up()
        n = len(self.agents)
        print(f"  [{self.tag}] {self.kind}: {n} agents x {turns} turns, history {self.result['history_tokens']} "
              f"tokens, think {self.args.think:g}s (load {load_average()}) ...", flush=True)
        self.walls["turns"] = self.phase(turns, lambda t: "first" if t == 0 else "later", 0)
        self.result["cache_after_turns"] = fetch_cache_state(self.root)
        self.result["probe_shared_prefix_tokens"] = asyncio.run(
            probe_shared_prefix(self.base_url, self.model_name, self.doc, self.args))
        if self.sampler:
            sampler = self.sampler
            self.stop_sampler()
            self.result["rss_after_turns_bytes"] = sampler.last

    def close(self) -> None:
        if self.sampler:
            self.sampler.stop()
            self.sampler = None
        if self.server:
            self.server.stop()


def open_server(kind: str, args, work_dir: Path, tag: str) -> BenchServer | None:
    """The server of a run, started on a fresh cache folder (None: --base-url's, waited for)."""
    if kind == "external":
        wait_ready(args.base_url.rstrip("/").removesuffix("/v1"), 30)
        return None
    cache_dir = work_dir / f"{tag}-cache"
    if cache_dir.exists():
        shutil.rmtree(cache_dir)
    trace = args.trace and kind in args.ours_like and kind != BASE
    server = BenchServer(kind, args.model, cache_dir, work_dir, args, trace=trace)
    server.start(args.start_timeout)
    return server


def open_run(kind: str, args, agents_n: int, turns: int, history_tokens: int, work_dir: Path, tag: str) -> Run:
    geometry = model_geometry(args.model if kind != "external" else args.model_dir)
    server = open_server(kind, args, work_dir, tag)
    if server is None:
        base_url = args.base_url.rstrip("/")
        root, pid = base_url.removesuffix("/v1"), args.server_pid
    else:
        base_url, root, pid = server.process.base_url, server.process.url, server.process.pid
    doc = shared_document(args.system_tokens)
    agents = [Agent(i, [{"role": "system", "content": doc + "\n\n" + persona(i)}] + prior_history(i, history_tokens))
              for i in range(agents_n)]
    result: dict = {"server": kind, "tag": tag, "agents": agents_n, "turns": turns, "history_tokens": history_tokens,
                    "system_tokens_target": args.system_tokens, "max_tokens": args.max_tokens,
                    "stagger_s": args.stagger, "think_s": args.think, "geometry": geometry, "pid": pid,
                    "openblas": has_openblas(pid) if pid else None,
                    "load_s": server.process.load_s if server else None, "uptime": load_average()}
    return Run(kind, args, tag, server, base_url, root, pid, doc, agents, result,
               sampler=RSSSampler(pid) if pid else None)

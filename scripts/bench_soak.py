#!/usr/bin/env python3
"""Soak: faults and load, bounded. Starts its own agent-memory servers on loopback (the tiny
test model by default, `--model demo` or a model folder) and stops by itself within
`--minutes`. Six parts, each with a share of the time, each cut short (and saying so) when
its share runs out:

  1. kills      SIGKILL the server at a random moment while agents' turns are being written,
                `agent-memory cache verify` the folder, restart, and let agents return: corrupt
                files (must be 0), wrong answers after a restart (must be 0), quarantines.
  2. damage     truncate and bit-flip block files and manifests between two runs: every
                request still answers, and answers as a server that never cached anything
                (a clean miss); the damaged files are quarantined.
  3. full disk  a small tmpfs (root on Linux; else skipped) that a neighbour fills and empties
                again, in episodes: requests still answer, writes fail and resume, no half
                files are left (`cache verify`).
  4. hung Redis a server on a shared warm tier in redis-server, its agents' prompts in memory,
                and Redis stopped (SIGSTOP) for a while (scripts/soak_redis.py): errors (must be
                0), hot agents' TTFT without and during the stall, what the log says.
  5. load       N concurrent streaming clients, one agent each, a quarter of them hanging up
                after a few tokens: errors, cross-agent mix-ups (each answer must equal that
                agent's answer on its own, asked after the burst one at a time while time
                allows; --kv-bits 16, temperature 0), TTFT p50 and p99, sequences left in the
                engine afterwards.
  6. memory     the server's RSS before, at the peak of, and after the burst of part 4.

    .venv/bin/python scripts/bench_soak.py                       # tiny model, 3 minutes at most
    .venv/bin/python scripts/bench_soak.py --minutes 1 --kills 5 --clients 16 --json soak.json
    .venv/bin/python scripts/bench_soak.py --model demo          # after `agent-memory models fetch demo`

Only the standard library and httpx. Answers are compared exactly: the server runs at
--kv-bits 16, where a cached turn's greedy output equals an uncached one's.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import random
import shutil
import subprocess
import sys
import tempfile
import threading
import time
from dataclasses import dataclass
from pathlib import Path

import httpx

sys.path.insert(0, str(Path(__file__).resolve().parent))  # scripts/bench

from bench.processes import rss_bytes  # noqa: E402
from bench.server import DEMO_MODEL, MODELS, REPO, clean_env  # noqa: E402
from bench.soak import Figures, Server, chat, conversation, percentile, text_of, verify  # noqa: E402

MiB = 1 << 20
SHARES = {"kills": 0.50, "damage": 0.10, "full_disk": 0.10, "hung_redis": 0.10, "load": 0.20}  # of the time left at each start


@dataclass
class Clock:
    end: float  # monotonic

    def share(self, part: str, parts_left: list[str]) -> float:
        """The deadline of `part`: its share of the time left among the parts still to run."""
        left = max(0.0, self.end - time.monotonic())
        total = sum(SHARES[p] for p in parts_left)
        return time.monotonic() + left * SHARES[part] / total

    def over(self) -> bool:
        return time.monotonic() > self.end


# --------------------------------------------------------------------------------------
# 1. kills
# --------------------------------------------------------------------------------------


def part_kills(args, model: Path, work: Path, deadline: float, figs: Figures, rng: random.Random) -> Path:
    cache = work / "kills"
    server = Server(model, cache, work / "logs", "kills")
    agents = list(range(args.agents))
    probe = {}  # agent -> the answer of a server that never cached it
    kills = torn = corrupt = wrong = errors = returned = quarantined = 0
    turns = [0]
    for round_ in range(args.kills + 1):  # every kill is followed by a restart that is checked
        server.start()
        if round_ == 0:
            for a in agents:  # references: remembered by no one, before anything is on disk
                probe[a] = text_of(chat(server.url, conversation(a, "Probe."), None, args.max_tokens, remember=False))
        else:
            quarantined += server.log().count("quarantined ")
            listed = server.agents()
            for agent in listed[round_ % 2 :: 2][:3]:  # agents loaded from disk return
                a = int(agent.split("-")[1])
                try:
                    got = text_of(chat(server.url, conversation(a, "Probe."), agent, args.max_tokens))
                    wrong += got != probe[a]
                    returned += 1
                except httpx.HTTPError:
                    errors += 1
        if round_ == args.kills or time.monotonic() > deadline:
            for a in agents:  # every agent on disk, whole, for part 2 to damage
                try:
                    wrong += text_of(chat(server.url, conversation(a, "Probe."), f"agent-{a}", args.max_tokens)) != probe[a]
                except httpx.HTTPError:
                    errors += 1
            server.stop()
            break
        stop = threading.Event()

        def traffic(seed: int) -> None:
            local = random.Random(seed)
            while not stop.is_set():
                a = local.choice(agents)
                turns[0] += 1
                try:
                    chat(server.url, conversation(a, f"Turn {turns[0]}."), f"agent-{a}", args.max_tokens, timeout=30)
                except (httpx.HTTPError, OSError):
                    return  # killed under it

        workers = [threading.Thread(target=traffic, args=(rng.random(),)) for _ in range(2)]
        for w in workers:
            w.start()
        time.sleep(rng.uniform(0.3, 1.2))
        server.kill()
        kills += 1
        stop.set()
        for w in workers:
            w.join()
        folder = next((cache / "kv").iterdir(), None)
        torn += folder is not None and any(p.name.endswith(".tmp") for p in folder.rglob("*"))
        corrupt += len(verify(cache))
    figs.add("kills", "SIGKILLs while turns were written", f"{kills} of {args.kills}" + ("" if kills == args.kills else " (time)"))
    figs.add("kills", "kills that cut a write short (temp file left)", torn)
    figs.add("kills", "corrupt files after a kill (cache verify)", corrupt, "0")
    figs.add("kills", "agents returning after a restart", returned)
    figs.add("kills", "wrong answers after a restart", wrong, "0")
    figs.add("kills", "request errors after a restart", errors, "0")
    figs.add("kills", "files quarantined at restarts", quarantined, "0")
    figs.data["kills"]["turns_sent"] = turns[0]
    figs.data["kills"]["_probe"] = probe
    return cache


# --------------------------------------------------------------------------------------
# 2. damage
# --------------------------------------------------------------------------------------


def part_damage(args, model: Path, work: Path, cache: Path, probe: dict, figs: Figures, rng: random.Random) -> None:
    server = Server(model, cache, work / "logs", "damage")  # on the folder the kills left
    (folder,) = list((cache / "kv").iterdir())
    blocks = sorted(folder.glob("blocks/*/*.safetensors"))
    manifests = sorted(folder.glob("agents/*.json"))
    rng.shuffle(blocks)
    rng.shuffle(manifests)
    damaged = []
    for i, path in enumerate(blocks[: args.damage]):
        data = bytearray(path.read_bytes())
        if i % 2:
            data = data[: len(data) // 2]  # truncated
        else:
            data[rng.randrange(len(data))] ^= 1 << rng.randrange(8)  # one bit flipped
        path.write_bytes(bytes(data))
        damaged.append(path)
    for i, path in enumerate(manifests[: max(1, args.damage // 3)]):
        path.write_bytes(path.read_bytes()[: 40] if i % 2 == 0 else b'{"version": 1, "agent": 7}')
        damaged.append(path)
    server.start()
    errors = wrong = warm = 0
    for a in range(args.agents):
        try:
            r = chat(server.url, conversation(a, "Probe."), f"agent-{a}", args.max_tokens)
            wrong += text_of(r) != probe[a]
            warm += r["usage"]["prompt_tokens_details"].get("warm_tokens", 0) > 0
        except httpx.HTTPError:
            errors += 1
    health = server.health()
    server.stop()
    held = [p for p in (folder / "quarantine").glob("*") if not p.name.endswith(".why")] if (folder / "quarantine").exists() else []
    figs.add("damage", "files damaged (blocks truncated or bit-flipped, manifests)", len(damaged))
    figs.add("damage", "requests after the damage", args.agents)
    figs.add("damage", "request errors", errors, "0")
    figs.add("damage", "answers unlike an uncached run", wrong, "0")
    figs.add("damage", "agents that still read some blocks from disk", warm)
    figs.add("damage", "damaged files quarantined when read (orphans are deleted at start)", f"{len(held)} of {len(damaged)}")
    figs.add("damage", "server healthy after", health.get("status") == "ok", "True")
    figs.add("damage", "damaged files left unread (cache verify names them)", len(verify(cache)))


# --------------------------------------------------------------------------------------
# 3. full disk
# --------------------------------------------------------------------------------------


def part_full_disk(args, model: Path, work: Path, deadline: float, figs: Figures) -> None:
    disk = work / "disk"
    disk.mkdir()
    try:
        done = subprocess.run(["mount", "-t", "tmpfs", "-o", "size=16m", "tmpfs", str(disk)], capture_output=True, text=True)
        reason = done.stderr.strip() if done.returncode else None
    except OSError as e:
        reason = str(e)
    if reason is not None:
        figs.add("full_disk", "skipped", f"no tmpfs can be mounted here ({reason[:80]})")
        return
    server = Server(model, disk / "cache", work / "logs", "full-disk")
    try:
        server.start()
        requests = errors = episodes = 0
        failed_writes_full, degraded = 0, 0
        n = 0
        for episode in range(args.disk_episodes):
            if time.monotonic() > deadline:
                break
            before = server.health()["warm_tier"].get("failed_writes", 0)
            filler = disk / "filler"
            with open(filler, "ab", buffering=0) as f:  # a neighbour takes every byte left
                chunk = b"\0" * (1 << 16)
                while chunk:
                    try:
                        f.write(chunk)
                    except OSError:
                        chunk = chunk[: len(chunk) // 2]
            for full in (True, False):
                for _ in range(4):
                    n += 1
                    requests += 1
                    try:
                        chat(server.url, conversation(100 + n % 6, f"Episode {episode}, request {n}."), f"disk-{n % 6}", args.max_tokens)
                    except httpx.HTTPError:
                        errors += 1
                if full:
                    give_up = time.monotonic() + 5  # the writer catches up
                    while (warm := server.health()["warm_tier"]).get("failed_writes", 0) == before:
                        if time.monotonic() > give_up:
                            break
                        time.sleep(0.05)
                    degraded += warm["status"] == "degraded"
                    failed_writes_full += warm.get("failed_writes", 0) - before
                    filler.unlink()  # the neighbour lets go
            episodes += 1
        server.stop()
        temp = [p for p in (disk / "cache").rglob("*") if p.name.endswith(".tmp")]
        figs.add("full_disk", "episodes (disk filled by a neighbour, then freed)", episodes)
        figs.add("full_disk", "requests", requests)
        figs.add("full_disk", "request errors", errors, "0")
        figs.add("full_disk", "writes that failed while full", failed_writes_full, "> 0")
        figs.add("full_disk", "episodes /health said degraded", f"{degraded} of {episodes}")
        figs.add("full_disk", "half-written files left", len(temp), "0")
        figs.add("full_disk", "problems (cache verify)", len(verify(disk / "cache")), "0")
    finally:
        server.stop()
        subprocess.run(["umount", "-l", str(disk)], capture_output=True)


# --------------------------------------------------------------------------------------
# 4 and 5. load and memory
# --------------------------------------------------------------------------------------


async def stream_one(client: httpx.AsyncClient, url: str, i: int, hang_up: bool, max_tokens: int) -> dict:
    body = {
        "model": "m",
        "messages": conversation(i, "List the last three ships."),
        "max_tokens": max_tokens,
        "temperature": 0,
        "stream": True,
        "prompt_cache_key": f"load-{i}",
    }
    out = {"i": i, "hang_up": hang_up, "text": "", "ttft": None, "error": None, "chunks": 0}
    t0 = time.perf_counter()
    try:
        async with client.stream("POST", url + "/v1/chat/completions", json=body) as r:
            if r.status_code != 200:
                out["error"] = f"HTTP {r.status_code}"
                return out
            async for line in r.aiter_lines():
                if not line.startswith("data:") or line.strip() == "data: [DONE]":
                    continue
                delta = json.loads(line[5:])["choices"][0]["delta"].get("content") or ""
                if delta and out["ttft"] is None:
                    out["ttft"] = time.perf_counter() - t0
                out["text"] += delta
                out["chunks"] += 1
                if hang_up and out["chunks"] >= 3:
                    return out  # leaving the block closes the connection mid-stream
    except (httpx.HTTPError, ValueError, KeyError) as e:
        out["error"] = f"{type(e).__name__}: {e}"
    return out


async def burst(url: str, clients: int, hang_ups: set[int], max_tokens: int) -> list[dict]:
    limits = httpx.Limits(max_connections=clients + 8, max_keepalive_connections=0)
    async with httpx.AsyncClient(timeout=300, limits=limits) as client:
        return await asyncio.gather(*(stream_one(client, url, i, i in hang_ups, max_tokens) for i in range(clients)))


def part_load(args, model: Path, work: Path, deadline: float, figs: Figures) -> None:
    server = Server(model, work / "load", work / "logs", "load")
    server.start()
    try:
        clients = args.clients
        hang_ups = set(range(0, clients, max(1, round(1 / args.hang_up)))) if args.hang_up > 0 else set()
        pid = server.process.pid
        before = rss_bytes(pid)
        peak = [before]
        sampling = threading.Event()

        def sample() -> None:
            while not sampling.is_set():
                peak[0] = max(peak[0], rss_bytes(pid))
                sampling.wait(0.05)

        sampler = threading.Thread(target=sample)
        sampler.start()
        t0 = time.perf_counter()
        results = asyncio.run(burst(server.url, clients, hang_ups, args.max_tokens))
        wall = time.perf_counter() - t0
        sampling.set()
        sampler.join()
        time.sleep(1.0)
        left = server.sequences()
        after = rss_bytes(pid)
        healthy = server.health().get("status") == "ok"
        # Then each agent's answer on its own, one request at a time, in a namespace of its own
        # (cache_salt: it shares no cached block with the burst), as long as time allows.
        solo = {}
        for r in results:
            if r["hang_up"] or r["error"] or time.monotonic() > deadline:
                continue
            messages = conversation(r["i"], "List the last three ships.")
            try:
                solo[r["i"]] = text_of(chat(server.url, messages, None, args.max_tokens, cache_salt=f"solo-{r['i']}", remember=False))
            except httpx.HTTPError:
                continue  # no reference: not compared
    finally:
        server.stop()
    whole = [r for r in results if not r["hang_up"]]
    errors = [r for r in results if r["error"]]
    compared = [r for r in whole if not r["error"] and r["i"] in solo]
    mixups = [r["i"] for r in compared if r["text"] != solo[r["i"]]]
    ttfts = [r["ttft"] for r in results if r["ttft"] is not None]
    figs.add("load", "concurrent streaming clients", clients)
    figs.add("load", "clients that hung up mid-stream", sum(r["hang_up"] and r["chunks"] >= 3 for r in results))
    figs.add("load", "errors", len(errors), "0")
    figs.add("load", "answers compared with the agent's own solo answer", f"{len(compared)} of {len(whole)}")
    figs.add("load", "answers unlike it (cross-agent mix-ups)", len(mixups), "0")
    figs.add("load", "TTFT p50 / p99 (s)", f"{percentile(ttfts, 0.5):.2f} / {percentile(ttfts, 0.99):.2f}" if ttfts else "n/a")
    figs.add("load", "burst wall time (s)", f"{wall:.1f}")
    figs.add("load", "sequences left in the engine after", int(left), "0")
    figs.add("load", "server healthy after", healthy, "True")
    figs.add("memory", "server RSS before / peak / after the burst (MiB)", f"{before / MiB:.0f} / {peak[0] / MiB:.0f} / {after / MiB:.0f}")
    figs.data["load"].update({"ttft_s": ttfts, "errors_detail": [r["error"] for r in errors][:10], "mixups_detail": mixups})
    figs.data["memory"].update({"rss_before_bytes": before, "rss_peak_bytes": peak[0], "rss_after_bytes": after})


# --------------------------------------------------------------------------------------


def model_path(spec: str) -> Path:
    if spec == "tiny":  # built once, where `serve --model tiny` keeps it
        out = MODELS / "tiny"
        cmd = [sys.executable, "-m", "agent_memory", "models", "build-tiny", str(out)]
        subprocess.run(cmd, check=True, capture_output=True, env=clean_env(), cwd=REPO, timeout=600)
        return out
    path = DEMO_MODEL if spec == "demo" else Path(spec)
    if not (path / "config.json").exists():
        raise SystemExit(f"no model at {path}: fetch it first (agent-memory models fetch demo)")
    return path


def table(figs: Figures) -> str:
    lines = ["| part | figure | value | must be |", "|---|---|---|---|"]
    lines += [f"| {p} | {f} | {v} | {m} |" for p, f, v, m in figs.rows]
    return "\n".join(lines)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0], formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model", default="tiny", help="tiny (default, built here), demo, or a model folder")
    ap.add_argument("--minutes", type=float, default=3.0, help="the whole run ends within this (default 3)")
    ap.add_argument("--kills", type=int, default=20, help="SIGKILLs during writes (default 20)")
    ap.add_argument("--agents", type=int, default=6, help="agents in the kill and damage parts (default 6)")
    ap.add_argument("--damage", type=int, default=6, help="block files to damage (default 6; a third as many manifests)")
    ap.add_argument("--disk-episodes", type=int, default=3, help="full-disk episodes (default 3)")
    ap.add_argument(
        "--redis-stall-s", type=float, help="how long Redis stays stopped (default: half the part's time, 5 to 30 s)"
    )
    ap.add_argument("--clients", type=int, default=64, help="concurrent streaming clients (default 64)")
    ap.add_argument("--hang-up", type=float, default=0.25, help="share of clients that disconnect mid-stream")
    ap.add_argument("--max-tokens", type=int, default=24)
    ap.add_argument("--seed", type=int, default=7)
    ap.add_argument("--work-dir", type=Path, help="keep servers' folders and logs here (default: a temp dir, removed)")
    ap.add_argument("--json", type=Path, help="write the figures here")
    args = ap.parse_args()

    t_start = time.monotonic()
    load_before = os.getloadavg()[0] if hasattr(os, "getloadavg") else None
    clock = Clock(t_start + args.minutes * 60 - 10)  # 10 s for the last stop
    rng = random.Random(args.seed)
    work = args.work_dir or Path(tempfile.mkdtemp(prefix="agent-memory-soak-"))
    (work / "logs").mkdir(parents=True, exist_ok=True)
    figs = Figures()
    try:
        model = model_path(args.model)
        parts = list(SHARES)
        cache = part_kills(args, model, work, clock.share("kills", parts), figs, rng)
        probe = figs.data["kills"].pop("_probe")
        parts.remove("kills")
        if not clock.over():
            part_damage(args, model, work, cache, probe, figs, rng)
        parts.remove("damage")
        if not clock.over():
            part_full_disk(args, model, work, clock.share("full_disk", parts), figs)
        parts.remove("full_disk")
        if not clock.over():
            from soak_redis import part_hung_redis

            part_hung_redis(args, model, work, clock.share("hung_redis", parts), figs)
        parts.remove("hung_redis")
        if clock.end - time.monotonic() > 20:  # a server start and the burst
            part_load(args, model, work, clock.end, figs)
        else:
            figs.add("load", "skipped", "out of time")
    finally:
        if args.work_dir is None:
            shutil.rmtree(work, ignore_errors=True)
    wall = time.monotonic() - t_start
    load = (load_before, os.getloadavg()[0]) if load_before is not None else None
    settings = {k: (str(v) if isinstance(v, Path) else v) for k, v in vars(args).items()}
    busy = f", load average {load[0]:.1f} before and {load[1]:.1f} after on {os.cpu_count()} CPUs" if load else ""
    print(f"soak: {args.model} model, {wall:.0f} s of {args.minutes:g} min{busy}\n")
    print(table(figs))
    if args.json:
        doc = {"settings": settings, "wall_s": wall, "load_average": load, "parts": figs.data, "table": figs.rows}
        args.json.write_text(json.dumps(doc, indent=1))


if __name__ == "__main__":
    main()

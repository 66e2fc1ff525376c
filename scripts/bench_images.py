#!/usr/bin/env python3
"""Images and the memory: what a returning agent with an image in its history and an image
repeated in a new prompt cost, measured on a served vision model.

    .venv/bin/python scripts/bench_images.py                      # the tiny Gemma 3, built here
    .venv/bin/python scripts/bench_images.py --model /path/to/gemma-3-4b-it-4bit --repeats 5

Starts `python -m agent_memory serve` twice on the model (default: the tiny random Gemma 3 of
`models build-tiny --arch gemma3`, 4 tokens an image, built into a temporary folder), each with
a fresh cache folder and no warm tier: one as configured, one with `--vision-cache-mb 0` (no image
features kept). Pictures are made with Pillow (a new one per repeat, `--side` pixels a side,
sent as PNG data: URLs). Each repeat:

  1. returning vs cold (on the server keeping no features, so "cold" runs the tower): an agent's
     turn 1 (a long system prompt, the picture, a question), then its turn 2 (the history, the
     reply, a new question) — the returning agent's TTFT; then the same turn-2 prompt under a
     `cache_salt` of its own (no KV to reuse) — cold. Their ratio.
  2. an image repeated in a new prompt: a first prompt shows the picture, then a new agent's
     prompt (a `cache_salt` of its own: no KV to reuse) holds the same picture elsewhere —
     TTFT on the server that keeps features (no tower) and on the one that keeps none (tower).

With `--mlx-vlm`, part 1's two turns also go to mlx-vlm's own server (`python -m mlx_vlm.server`,
its defaults) on the same model and pictures.

TTFT is measured at the client, streamed: from sending to the first chunk with text (what a user
waits: the picture's decoding included), and for our servers read from their access log too
(`ttft_ms` by the request id sent: arrival to first token, without HTTP). Greedy, 4
tokens each; both of our servers' engines are idle before each measured request (`/metrics`).
Prints a table (median over repeats, and each repeat) and, with `--json`, writes the numbers.
"""

from __future__ import annotations

import argparse
import base64
import io
import json
import os
import re
import statistics
import sys
import tempfile
import time
import uuid
from pathlib import Path

import httpx
from PIL import Image

sys.path.insert(0, str(Path(__file__).resolve().parent))  # scripts/bench

from bench.server import ServerProcess, clean_env, ours_command  # noqa: E402

SYSTEM = ("You are a careful visual inspector for a factory's quality line. Describe defects in the "
          "picture by region, name the likely cause and the station that caused it. ") * 24


def picture(seed: int, side: int) -> str:
    """A PNG data: URL of a `side`-pixel square whose pattern depends on `seed`."""
    image = Image.effect_mandelbrot((side, side), (-2 + seed * 0.01, -1.5, 1, 1.5), 64).convert("RGB")
    out = io.BytesIO()
    image.save(out, "PNG")
    return "data:image/png;base64," + base64.b64encode(out.getvalue()).decode()


def user(text: str, image: str | None = None, image_first: bool = True) -> dict:
    parts = [{"type": "text", "text": text}]
    if image is not None:
        picture_part = {"type": "image_url", "image_url": {"url": image}}
        parts = [picture_part, *parts] if image_first else [*parts, picture_part]
    return {"role": "user", "content": parts}


class Client:
    """Streamed chat requests to one server, each timed at the client."""

    def __init__(self, server: ServerProcess, model: str, ours: bool = True) -> None:
        self.server, self.model, self.ours = server, model, ours
        self.http = httpx.Client(base_url=server.url, timeout=600)

    def idle(self) -> None:
        if not self.ours:  # another server: no engine to watch
            return
        deadline = time.monotonic() + 120
        while re.search(r'agent_memory_sequences\{state="(waiting|prefilling|decoding)"\} [1-9]',
                        self.http.get("/metrics").text):
            if time.monotonic() > deadline:
                raise RuntimeError("the engine did not go idle")
            time.sleep(0.05)

    def chat(self, messages: list[dict], agent: str, **extra) -> tuple[str, dict]:
        """(reply, {ttft_ms, prompt_tokens, cached_tokens}) of one greedy streamed turn, the
        engine idle first; TTFT: from sending to the first chunk with text, at the client."""
        self.idle()
        body = {"model": self.model, "messages": messages, "max_tokens": 4, "temperature": 0, "stream": True,
                "stream_options": {"include_usage": True}, "prompt_cache_key": agent, **extra}
        reply, first, usage, sent, rid = "", None, {}, time.perf_counter(), uuid.uuid4().hex
        with self.http.stream("POST", "/v1/chat/completions", json=body, headers={"X-Request-Id": rid}) as r:
            r.raise_for_status()
            for line in r.iter_lines():
                if not line.startswith("data: ") or line == "data: [DONE]":
                    continue
                chunk = json.loads(line[6:])
                text = (chunk.get("choices") or [{}])[0].get("delta", {}).get("content") or ""
                if text and first is None:
                    first = time.perf_counter() - sent
                reply, usage = reply + text, chunk.get("usage") or usage
        ttft = first if first is not None else time.perf_counter() - sent  # no text at all: its end
        cached = (usage.get("prompt_tokens_details") or {}).get("cached_tokens", 0)
        measured = {"ttft_ms": ttft * 1000, "prompt_tokens": usage.get("prompt_tokens"), "cached_tokens": cached}
        return reply, {**measured, "server_ttft_ms": self.server_ttft_ms(rid) if self.ours else None}

    def server_ttft_ms(self, rid: str) -> float:
        """Our server's own TTFT (its access log's ttft_ms): arrival to first token, no HTTP."""
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline:
            found = re.search(rf"request_id={rid}\b.*?ttft_ms=([0-9.]+)", self.server.log())
            if found:
                return float(found.group(1))
            time.sleep(0.05)
        raise RuntimeError(f"no log line for request {rid}")

    def metric(self, name: str) -> float:
        found = re.search(rf"^{re.escape(name)} ([0-9.e+]+)$", self.http.get("/metrics").text, re.M)
        return float(found.group(1)) if found else 0.0


def returning_vs_cold(c: Client, image: str, r: int) -> dict:
    ask = [{"role": "system", "content": SYSTEM}, user("What defects do you see?", image)]
    reply, _ = c.chat(ask, f"inspector-{r}")
    turn = ask + [{"role": "assistant", "content": reply}, user("Which station caused the worst one?")]
    _, returning = c.chat(turn, f"inspector-{r}")
    _, cold = c.chat(turn, f"inspector-{r}-cold", cache_salt=f"cold-{r}")
    return {"returning": returning, "cold": cold, "ratio": cold["ttft_ms"] / returning["ttft_ms"]}


def repeated_image(c: Client, image: str, r: int) -> dict:
    c.chat([user("Describe this picture.", image)], f"first-look-{r}")
    runs = c.metric("agent_memory_vision_tower_runs_total")
    elsewhere = [user("The same part, seen again later:", image, False)]  # short: the image's cost shows
    _, again = c.chat(elsewhere, f"second-look-{r}", cache_salt=f"second-look-{r}")  # no KV of earlier parts
    return {**again, "tower_runs": c.metric("agent_memory_vision_tower_runs_total") - runs}


def peer_turns(c: Client, image: str, r: int) -> dict:
    """Part 1's two turns on another server (mlx-vlm's): no namespace to make a turn cold."""
    ask = [{"role": "system", "content": SYSTEM}, user("What defects do you see?", image)]
    reply, first = c.chat(ask, f"inspector-{r}")
    turn = ask + [{"role": "assistant", "content": reply}, user("Which station caused the worst one?")]
    _, returning = c.chat(turn, f"inspector-{r}")
    return {"first": first, "returning": returning}


def _at(row: dict, path: tuple[str, ...]):
    for key in path:
        row = row[key]
    return row


def median(rows: list[dict], *path: str) -> float:
    return statistics.median(_at(row, path) for row in rows)


def report(model: str, side: int, cold: list[dict], kept: list[dict], towered: list[dict], peer: list[dict]) -> str:
    lines = [
        f"model {model}; pictures {side}x{side} PNG; {len(cold)} repeats;"
        " TTFT at the client, streamed: median (each repeat)",
        "",
        "| measure | prompt tokens | cached | TTFT ms at the client | TTFT ms, server's log |",
        "|---|---:|---:|---:|---:|",
    ]
    each = lambda rows, *p: ", ".join(f"{v:.1f}" for v in [_at(row, p) for row in rows])  # noqa: E731
    for name, rows, p in (
        ("returning agent, turn 2 (image in its history)", cold, ("returning",)),
        ("the same prompt cold (its own cache_salt, no features kept)", cold, ("cold",)),
        ("image repeated in a new prompt, features kept", kept, ()),
        ("image repeated in a new prompt, --vision-cache-mb 0", towered, ()),
        *((("mlx-vlm server: turn 1", peer, ("first",)), ("mlx-vlm server: turn 2", peer, ("returning",)))
          if peer else ()),
    ):
        first = _at(rows[0], p)
        logged = f"{median(rows, *p, 'server_ttft_ms'):.1f}" if first["server_ttft_ms"] is not None else "-"
        lines.append(f"| {name} | {first['prompt_tokens']} | {first['cached_tokens']} | "
                     f"{median(rows, *p, 'ttft_ms'):.1f} ({each(rows, *p, 'ttft_ms')}) | {logged} |")
    lines += [
        "",
        f"cold / returning TTFT: {median(cold, 'ratio'):.2f}x at the client (each: {each(cold, 'ratio')}),"
        f" {median(cold, 'cold', 'server_ttft_ms') / median(cold, 'returning', 'server_ttft_ms'):.2f}x"
        " in the server's log;"
        f" tower runs for the repeated image: kept {sum(k['tower_runs'] for k in kept):.0f},"
        f" without the feature cache {sum(t['tower_runs'] for t in towered):.0f}",
    ]
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--model", type=Path, help="a vision model folder (default: the tiny Gemma 3, built here)")
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--side", type=int, default=896, help="pixels a side of each picture")
    parser.add_argument("--json", type=Path, help="write the numbers here")
    parser.add_argument("--mlx-vlm", action="store_true", help="part 1's turns on mlx-vlm's own server too")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(prefix="bench-images-") as tmp:
        model = args.model
        if model is None:
            from agent_memory.models.tiny_vision import build_tiny_vision

            model = build_tiny_vision(Path(tmp) / "gemma3-tiny", arch="gemma3")
        env = clean_env(PYTHONPATH=str(Path(__file__).resolve().parent.parent))

        def serve(name: str, *flags: str) -> ServerProcess:
            flags = ("--disk-budget-mb", "0", *flags)
            return ServerProcess(name, lambda port: ours_command(port, [model], Path(tmp) / name, *flags), env,
                                 Path(tmp)).start(600)

        with serve("keeps") as keeps, serve("no-features", "--vision-cache-mb", "0") as bare:
            served = httpx.get(keeps.url + "/v1/models").json()["data"][0]["id"]
            k, b = Client(keeps, served), Client(bare, served)
            cold, kept, towered = [], [], []
            for r in range(args.repeats):
                k.idle()  # the other server's follow-ups would share the cores
                cold.append(returning_vs_cold(b, picture(3 * r, args.side), r))
                b.idle()
                kept.append(repeated_image(k, picture(3 * r + 1, args.side), r))
                k.idle()
                towered.append(repeated_image(b, picture(3 * r + 2, args.side), r))
        peer = []
        if args.mlx_vlm:
            command = lambda port: [sys.executable, "-m", "mlx_vlm.server", "--model", str(model),  # noqa: E731
                                    "--host", "127.0.0.1", "--port", str(port)]
            with ServerProcess("mlx-vlm", command, env, Path(tmp)).start(600) as theirs:
                c = Client(theirs, str(model), ours=False)
                peer = [peer_turns(c, picture(3 * r, args.side), r) for r in range(args.repeats)]
        print(report(model.name, args.side, cold, kept, towered, peer))
        if args.json:
            doc = {"model": str(model), "side": args.side, "load_average": os.getloadavg(), "returning_vs_cold": cold,
                   "repeated_kept": kept, "repeated_no_features": towered, "mlx_vlm": peer}
            args.json.write_text(json.dumps(doc, indent=2))


if __name__ == "__main__":
    main()

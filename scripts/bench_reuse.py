#!/usr/bin/env python3
"""Does a returning agent reuse its whole previous turn? The docs' own examples, turn by turn.

    .venv/bin/python scripts/bench_reuse.py                        # this checkout's server
    .venv/bin/python scripts/bench_reuse.py --server-dir /tmp/old  # another checkout's (git worktree)

Starts `python -m agent_memory serve` from `--server-dir` (its own code, this venv) on the demo
model and a fresh cache folder, and runs the examples of docs/usage.md as written there, each
extended to a second turn the way an agent would (the history grows by the reply and a new
question): the OpenAI SDK example (two questions, non-streaming, max_tokens 200), the
streaming one (the same two questions, streamed, agent id in X-Agent-Id; max_tokens 200 added:
the snippet has none, and at temperature 1 the demo model can run to its context), LangChain's
(temperature 0, if langchain-openai is installed) and the tools one (a required call, then
the tool's result; only where the server knows tools), plus that one with a pause before the
result comes back, as a tool that takes a while would.

For every turn: prompt tokens, cached tokens (hot + warm) and, for turns after the first, what
the agent's cache held when the turn arrived and where the turn's prompt stops matching it.
Both come from the agent's manifest in the cache folder (its token ids, written behind every
commit), watched while the examples run: the prompt of turn k is the first prompt_tokens ids
of the manifest written after turn k. Where they differ, both are decoded around the first
difference.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))  # scripts/bench

from agent_memory.memory.index.prefix import common_prefix  # noqa: E402
from bench.server import DEMO_MODEL, REPO, ServerProcess, offline_env, ours_command  # noqa: E402

QUESTIONS = ["What is a KV cache?", "Why does reusing it save time?"]


class ManifestWatch:
    """Every distinct token list each agent's manifest held, in order, with when it was seen."""

    def __init__(self, cache_dir: Path, interval: float = 0.02) -> None:
        self.cache_dir = cache_dir
        self.interval = interval
        self.seen: dict[str, list[tuple[float, list[int]]]] = {}
        self._mtimes: dict[Path, int] = {}
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._thread.start()

    def _run(self) -> None:
        while not self._stop.is_set():
            self.poll()
            self._stop.wait(self.interval)

    def poll(self) -> None:
        for path in self.cache_dir.glob("kv/*/agents/*.json"):
            try:
                mtime = path.stat().st_mtime_ns
                if self._mtimes.get(path) == mtime:
                    continue
                data = json.loads(path.read_bytes())
            except (OSError, ValueError):
                continue
            self._mtimes[path] = mtime
            versions = self.seen.setdefault(data.get("agent"), [])
            if not versions or versions[-1][1] != data.get("tokens"):
                versions.append((time.monotonic(), data.get("tokens")))

    def stop(self) -> None:
        self._stop.set()
        self._thread.join()
        self.poll()


def usage_of(u) -> dict:
    """prompt/completion/cached/hot/warm tokens from an OpenAI usage object or dict."""
    if u is None:
        return {}
    u = u if isinstance(u, dict) else u.model_dump()
    details = u.get("prompt_tokens_details") or {}
    return {"prompt": u.get("prompt_tokens"), "completion": u.get("completion_tokens"),
            "cached": details.get("cached_tokens"), "hot": details.get("hot_tokens"), "warm": details.get("warm_tokens")}


# -- the examples, as docs/usage.md writes them, two turns each ------------------------------

def sdk_example(base: str, agent: str) -> list[dict]:
    from openai import OpenAI

    client = OpenAI(base_url=base, api_key="unused")
    history = [{"role": "system", "content": "You are a careful research assistant."}]
    turns = []
    for question in QUESTIONS:
        history.append({"role": "user", "content": question})
        t = time.monotonic()
        reply = client.chat.completions.create(
            model="demo", messages=history, max_tokens=200, prompt_cache_key=agent,
        )
        turns.append({"start": t, **usage_of(reply.usage)})
        history.append({"role": "assistant", "content": reply.choices[0].message.content})
    return turns


def streaming_example(base: str, agent: str) -> list[dict]:
    from openai import OpenAI

    client = OpenAI(base_url=base, api_key="unused")
    history = [{"role": "system", "content": "You are a careful research assistant."}]
    turns = []
    for question in QUESTIONS:
        history.append({"role": "user", "content": question})
        t = time.monotonic()
        stream = client.chat.completions.create(
            model="demo", messages=history, stream=True, stream_options={"include_usage": True},
            extra_headers={"X-Agent-Id": agent},
            max_tokens=200,  # not in the docs' snippet: bounded like the first example's, for a bounded run
        )
        text, usage = [], None
        for chunk in stream:
            if chunk.choices:
                text.append(chunk.choices[0].delta.content or "")
            elif chunk.usage:
                usage = chunk.usage
        turns.append({"start": t, **usage_of(usage)})
        history.append({"role": "assistant", "content": "".join(text)})
    return turns


def langchain_example(base: str, agent: str) -> list[dict]:
    from langchain_core.messages import AIMessage, HumanMessage
    from langchain_openai import ChatOpenAI

    llm = ChatOpenAI(base_url=base, api_key="unused", model="demo", temperature=0,
                     default_headers={"X-Agent-Id": agent})
    turns, history = [], []
    for question in ["Plan a three-step experiment.", "Which of the three steps is the riskiest?"]:
        history.append(HumanMessage(question))
        t = time.monotonic()
        msg = llm.invoke(history)
        turns.append({"start": t, **usage_of(msg.response_metadata.get("token_usage"))})
        history.append(AIMessage(msg.content))
    return turns


TOOLS = [{
    "type": "function",
    "function": {
        "name": "get_weather",
        "description": "The forecast for a city.",
        "parameters": {
            "type": "object",
            "properties": {"city": {"type": "string"}, "days": {"type": "integer", "minimum": 1, "maximum": 7}},
            "required": ["city", "days"],
            "additionalProperties": False,
        },
    },
}]


def tools_example(base: str, agent: str, pause: float = 0.0) -> list[dict]:
    from openai import OpenAI

    client = OpenAI(base_url=base, api_key="unused")
    messages = [{"role": "user", "content": "What's the weather in Paris for the next two days?"}]
    t = time.monotonic()
    reply = client.chat.completions.create(
        model="demo", messages=messages, tools=TOOLS, tool_choice="required", max_tokens=100, prompt_cache_key=agent,
    )
    turns = [{"start": t, **usage_of(reply.usage), "finish": reply.choices[0].finish_reason}]
    call = reply.choices[0].message.tool_calls[0]
    messages.append(reply.choices[0].message.model_dump(exclude_none=True))
    messages.append({"role": "tool", "tool_call_id": call.id, "content": "Sunny, 21 °C"})
    time.sleep(pause)  # the tool runs
    t = time.monotonic()
    final = client.chat.completions.create(
        model="demo", messages=messages, tools=TOOLS, max_tokens=60, prompt_cache_key=agent,
    )
    turns.append({"start": t, **usage_of(final.usage), "finish": final.choices[0].finish_reason})
    return turns


def tools_example_paused(base: str, agent: str) -> list[dict]:
    return tools_example(base, agent, pause=5.0)


EXAMPLES = {
    "openai-sdk": sdk_example,
    "streaming": streaming_example,
    "langchain": langchain_example,
    "tools": tools_example,
    "tools-5s-pause": tools_example_paused,
}


# -- where a turn stops matching ---------------------------------------------------------------

def diagnose(turns: list[dict], versions: list[tuple[float, list[int]]], tokenizer) -> None:
    """Fill in, for each turn after the first, what the agent's cache held when the turn was
    looked up (`held`: the last manifest before the turn's own commit; `held_late` when that
    one was written after the turn arrived, a follow-up racing it), how much of the turn's
    prompt matches it (`match`), and the text either side of the first difference."""
    own = []  # index of each turn's own commit: the first version after it started that holds its prompt
    for turn in turns:
        idx = next((i for i, (t, v) in enumerate(versions)
                    if t >= turn["start"] and turn.get("prompt") and len(v) >= turn["prompt"]), None)
        own.append(idx)
        if idx is not None:
            turn["prompt_ids"] = versions[idx][1][: turn["prompt"]]
    for k, turn in enumerate(turns):
        prompt = turn.get("prompt_ids")
        if k == 0 or prompt is None or not own[k]:
            continue
        t_held, held = versions[own[k] - 1]
        turn["held"] = len(held)
        turn["held_late"] = t_held >= turn["start"]
        turn["match"] = common_prefix(held, prompt)
        # What the cache held between the previous turn's commit and this one's: the reply as
        # generated, then (newer servers) its canonical tokenization, computed as a follow-up.
        if own[k - 1] is not None:
            turn["versions_since_previous_turn"] = [len(v) for _, v in versions[own[k - 1]: own[k]]]
        if turn["match"] < len(held):
            i = turn["match"]
            turn["diverges_at"] = i
            turn["cache_side"] = tokenizer.decode(held[max(0, i - 6): i + 10])
            turn["prompt_side"] = tokenizer.decode(prompt[max(0, i - 6): i + 10])
            turn["cache_tokens_there"] = [tokenizer.decode([t]) for t in held[i: i + 6]]
            turn["prompt_tokens_there"] = [tokenizer.decode([t]) for t in prompt[i: i + 6]]


# -- main --------------------------------------------------------------------------------------

def main() -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--server-dir", type=Path, default=REPO, help="the checkout whose server runs (default: this one)")
    p.add_argument("--model", type=Path, default=DEMO_MODEL)
    p.add_argument("--runs", type=int, default=3, help="runs of each example (fresh agent ids)")
    p.add_argument("--examples", default=",".join(EXAMPLES), help="comma-separated: " + ", ".join(EXAMPLES))
    p.add_argument("--label", default=None, help="name of this server in the output (default: its git commit)")
    p.add_argument("--json", type=Path)
    args = p.parse_args()
    server_dir = args.server_dir.resolve()
    label = args.label or subprocess.run(["git", "-C", str(server_dir), "rev-parse", "--short", "HEAD"],
                                         capture_output=True, text=True).stdout.strip()
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(str(args.model))
    out = {"server_dir": str(server_dir), "label": label, "load_average": os.getloadavg(), "examples": {}}
    with tempfile.TemporaryDirectory(prefix="bench-reuse-") as tmp:
        cache_dir = Path(tmp) / "cache"
        command = lambda port: ours_command(port, [args.model], cache_dir)  # noqa: E731
        env = offline_env(PYTHONPATH=str(server_dir))
        server = ServerProcess("server", command, env, Path(tmp), cwd=server_dir).start(300)
        base = server.base_url
        watch = ManifestWatch(cache_dir)
        try:
            for name in [e for e in args.examples.split(",") if e]:
                runs = []
                for r in range(args.runs):
                    agent = f"reuse-{name.replace(' ', '').replace(',', '')}-{r}"
                    try:
                        turns = EXAMPLES[name](base, agent)
                    except ImportError as e:
                        print(f"{name}: skipped ({e})", file=sys.stderr)
                        break
                    except Exception as e:  # e.g. an old server without tools
                        print(f"{name}: failed ({type(e).__name__}: {str(e)[:200]})", file=sys.stderr)
                        runs.append({"error": f"{type(e).__name__}: {str(e)[:300]}"})
                        break
                    time.sleep(1.0)  # the last manifest lands (written behind)
                    watch.poll()
                    diagnose(turns, watch.seen.get(agent, []), tokenizer)
                    runs.append({"agent": agent, "turns": turns})
                    print(f"{label} {name} run {r}: " + "; ".join(
                        f"turn {k + 1}: {t.get('cached')} of {t.get('prompt')} cached"
                        + (f" (held {t['held']}, prompt matches {t['match']})" if "held" in t else "")
                        for k, t in enumerate(turns)), flush=True)
                out["examples"][name] = runs
        finally:
            watch.stop()
            server.stop(timeout=60)
    for name, runs in out["examples"].items():
        for run in runs:
            for t in run.get("turns", []):
                t.pop("prompt_ids", None)
    # Summary table: per example and turn, cached of prompt (every run), and the median share.
    lines = ["| server | example | turn | cached / prompt tokens (each run) | median share | "
             "previous turn in cache / prompt matches it | whole previous turn reused |", "|---|---|---|---|---|---|---|"]
    for name, runs in out["examples"].items():
        ok = [r for r in runs if "turns" in r]
        if not ok:
            lines.append(f"| {label} | {name} | – | {runs[0].get('error', 'skipped') if runs else 'skipped'} | | | |")
            continue
        for k in range(max(len(r["turns"]) for r in ok)):
            ts = [r["turns"][k] for r in ok if len(r["turns"]) > k]
            cells = ", ".join(f"{t.get('cached')}/{t.get('prompt')}" for t in ts)
            shares = [t["cached"] / t["prompt"] for t in ts if t.get("cached") is not None and t.get("prompt")]
            held = ", ".join(f"{t['held']}/{t['match']}" for t in ts if "held" in t) or "–"
            whole = [t for t in ts if "held" in t]
            whole_text = (f"{sum(1 for t in whole if t['match'] == t['held'] and (t.get('cached') or 0) >= t['held'])}"
                          f" of {len(whole)}") if whole else "–"
            share = f"{statistics.median(shares):.2f}" if shares else "n/a"
            lines.append(f"| {label} | {name} | {k + 1} | {cells} | {share} | {held} | {whole_text} |")
    text = "\n".join(lines)
    print("\n" + text)
    diverged = [(name, run["agent"], k + 1, t) for name, runs in out["examples"].items() for run in runs
                for k, t in enumerate(run.get("turns", [])) if "diverges_at" in t]
    for name, agent, k, t in diverged:
        print(f"\n{name} ({agent}) turn {k}: the cache held {t['held']} tokens, the prompt matches {t['match']}; "
              f"from there the cache has {t['cache_tokens_there']!r}, the prompt {t['prompt_tokens_there']!r}\n"
              f"  cache:  {t['cache_side']!r}\n  prompt: {t['prompt_side']!r}")
    out["table"] = text
    if args.json:
        args.json.write_text(json.dumps(out, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())

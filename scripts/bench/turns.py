"""The workload's agents and their turns: the deterministic text (a shared system document of
tools and a policy, each agent's persona, its questions turn by turn, an optional earlier
conversation), and the turns against an OpenAI-compatible server: one streamed request (TTFT,
usage's cached tokens), a phase of staggered agents, the warm-up and the shared-prefix probe."""

from __future__ import annotations

import asyncio
import json
import random
import sys
import time
from dataclasses import dataclass, field

import httpx

CHARS_PER_TOKEN = 4.4  # the generated English below, measured with SmolLM2's tokenizer

_TOOLS = [
    ("search_documents", "Search the internal document store", ["query: string", "limit: integer", "after: date"]),
    ("read_file", "Read a file from the shared workspace", ["path: string", "offset: integer", "length: integer"]),
    ("write_file", "Write or replace a file in the shared workspace", ["path: string", "content: string"]),
    ("run_query", "Run a read-only SQL query against the analytics warehouse", ["sql: string", "timeout: seconds"]),
    ("send_message", "Send a message to another agent or to a human reviewer", ["to: string", "body: string"]),
    ("create_ticket", "Open a ticket in the issue tracker", ["title: string", "priority: low|normal|high", "body: string"]),
    ("schedule_task", "Schedule a task to run later", ["when: datetime", "task: string", "repeat: string"]),
    ("fetch_metrics", "Fetch time series from the monitoring system", ["name: string", "start: datetime", "end: datetime"]),
    ("summarize", "Summarize a long text into a few sentences", ["text: string", "max_words: integer"]),
    ("translate", "Translate a text between two languages", ["text: string", "source: string", "target: string"]),
    ("calendar_lookup", "List the events of a person's calendar", ["person: string", "day: date"]),
    ("compute", "Evaluate an arithmetic expression exactly", ["expression: string"]),
]

_SUBJECTS = ["The agent", "Every reply", "A careful answer", "The reviewer", "Each tool call", "The final report",
             "A short plan", "The user", "Any estimate", "The summary", "A good explanation", "The team"]
_VERBS = ["should state", "must include", "always checks", "never hides", "briefly explains", "clearly lists",
          "carefully weighs", "first confirms", "openly admits", "quickly records", "politely asks for", "compares"]
_OBJECTS = ["the assumptions behind it", "the sources that were used", "what remains uncertain",
            "the cost of each option", "the risks of the change", "the next concrete step", "the deadline",
            "the owner of every task", "which data was missing", "how the numbers were computed",
            "the trade-offs involved", "the expected outcome"]
_TAILS = ["before acting.", "in plain words.", "without jargon.", "when asked.", "at the end.", "in one sentence.",
          "for the record.", "with care.", "if it matters.", "as a list.", "every time.", "to the reviewer."]

_ROLES = ["research analyst", "release manager", "data engineer", "support specialist", "security reviewer",
          "technical writer", "product planner", "site reliability engineer", "finance assistant", "recruiter",
          "legal assistant", "QA engineer", "sales engineer", "teacher", "travel planner", "project coordinator"]
_TOPICS = ["database migrations", "quarterly reports", "incident reviews", "customer onboarding", "API design",
           "cost forecasting", "test automation", "vendor contracts", "hiring plans", "documentation quality",
           "capacity planning", "privacy rules", "product launches", "sprint planning", "cloud budgets"]
_QUESTIONS = [
    "What should we check first about {topic}?",
    "Give me three risks related to {topic}.",
    "Summarize the current plan for {topic} in two sentences.",
    "Which tool would you call next for {topic}, and why?",
    "Draft a short status update about {topic}.",
    "What is one question we still need to answer about {topic}?",
    "List the owners we need to contact about {topic}.",
    "How would you measure progress on {topic}?",
]


def _sentence(rng: random.Random) -> str:
    return f"{rng.choice(_SUBJECTS)} {rng.choice(_VERBS)} {rng.choice(_OBJECTS)} {rng.choice(_TAILS)}"


def shared_document(tokens: int) -> str:
    """A fixed tool-description and policy document of about `tokens` tokens."""
    rng = random.Random(1234)
    parts = ["You work inside a team of software agents. This document describes the tools you may call "
             "and the policy every agent follows.", "", "## Tools"]
    for name, what, params in _TOOLS:
        parts.append(f"- {name}({', '.join(params)}): {what}. Returns JSON; errors come back as an 'error' field.")
    parts += ["", "## Policy"]
    budget = tokens * CHARS_PER_TOKEN
    n = 1
    while len("\n".join(parts)) < budget:
        parts.append(f"{n}. {_sentence(rng)} {_sentence(rng)}")
        n += 1
    return "\n".join(parts)


def persona(agent: int) -> str:
    return (f"You are agent {agent}, a {_ROLES[agent % len(_ROLES)]} who works on "
            f"{_TOPICS[agent % len(_TOPICS)]}. Answer briefly.")


def user_message(agent: int, turn: int) -> str:
    topic = _TOPICS[(agent * 7 + turn) % len(_TOPICS)]
    return f"[{agent}.{turn}] " + _QUESTIONS[(agent + turn) % len(_QUESTIONS)].format(topic=topic)


def prior_history(agent: int, tokens: int) -> list[dict]:
    """An agent's own earlier conversation, about `tokens` tokens, different for each agent."""
    if tokens <= 0:
        return []
    rng = random.Random(f"history-{agent}")
    messages, chars, k = [], 0, 0
    budget = tokens * CHARS_PER_TOKEN
    while chars < budget:
        user = f"(earlier, {agent}.{k}) " + _QUESTIONS[rng.randrange(len(_QUESTIONS))].format(topic=rng.choice(_TOPICS))
        reply = " ".join(_sentence(rng) for _ in range(8))
        messages += [{"role": "user", "content": user}, {"role": "assistant", "content": reply}]
        chars += len(user) + len(reply) + 8 * CHARS_PER_TOKEN  # template overhead per pair
        k += 1
    return messages


@dataclass
class Record:
    agent: int
    phase: str  # "first" | "later" | "crash" | "graceful"
    turn: int
    start: float = 0.0
    ttft: float | None = None
    latency: float | None = None
    prompt_tokens: int | None = None
    cached_tokens: int | None = None  # None where the server does not report it
    log_cached_tokens: int | None = None  # vllm-mlx: what its own log says it reused
    hot_tokens: int | None = None
    warm_tokens: int | None = None
    completion_tokens: int | None = None
    error: str | None = None


@dataclass
class Agent:
    index: int
    messages: list[dict] = field(default_factory=list)

    @property
    def id(self) -> str:
        return f"bench-agent-{self.index:03d}"


async def one_request(client: httpx.AsyncClient, base_url: str, model: str, agent: Agent, args) -> tuple[Record, str]:
    body = {
        "model": model,
        "messages": agent.messages,
        "max_tokens": args.max_tokens,
        "temperature": 0,
        "stream": True,
        "stream_options": {"include_usage": True},
        "prompt_cache_key": agent.id,
    }
    rec = Record(agent.index, "", 0)
    text: list[str] = []
    t0 = time.perf_counter()
    rec.start = time.time()
    try:
        async with client.stream("POST", base_url + "/chat/completions", json=body,
                                 headers={"X-Agent-Id": agent.id, "Authorization": f"Bearer {args.api_key}"}) as r:
            if r.status_code != 200:
                raw = (await r.aread()).decode(errors="replace")
                rec.error = f"HTTP {r.status_code}: {raw[:300]}"
                return rec, ""
            async for line in r.aiter_lines():
                if not line.startswith("data:"):
                    continue  # blank separators, ': keepalive' comments
                data = line[5:].strip()
                if data == "[DONE]":
                    break
                chunk = json.loads(data)
                if "error" in chunk and chunk["error"]:
                    rec.error = f"stream error: {json.dumps(chunk['error'])[:300]}"
                    break
                for choice in chunk.get("choices") or []:
                    delta = choice.get("delta") or {}
                    piece = delta.get("content") or ""
                    if (piece or choice.get("finish_reason")) and rec.ttft is None:
                        # The first real token (a role-only first chunk does not count).
                        rec.ttft = time.perf_counter() - t0
                    text.append(piece)
                usage = chunk.get("usage")
                if usage:
                    rec.prompt_tokens = usage.get("prompt_tokens")
                    rec.completion_tokens = usage.get("completion_tokens")
                    details = usage.get("prompt_tokens_details") or {}
                    rec.cached_tokens = details.get("cached_tokens")
                    rec.hot_tokens = details.get("hot_tokens")
                    rec.warm_tokens = details.get("warm_tokens")
    except (httpx.HTTPError, json.JSONDecodeError) as e:
        rec.error = f"{type(e).__name__}: {e}"[:300]
    rec.latency = time.perf_counter() - t0
    return rec, "".join(text)


async def run_phase(base_url: str, model: str, agents: list[Agent], turns: int, phase_of, first_turn: int,
                    args) -> tuple[list[Record], float]:
    """Every agent starts after index x stagger seconds and runs `turns` turns, `--think`
    seconds apart (the time an agent spends on a reply, or a tool, before its next turn)."""
    limits = httpx.Limits(max_connections=len(agents) + 4, max_keepalive_connections=len(agents) + 4)
    timeout = httpx.Timeout(args.request_timeout, connect=30)
    records: list[Record] = []

    async with httpx.AsyncClient(limits=limits, timeout=timeout) as client:
        async def drive(agent: Agent, delay: float) -> None:
            await asyncio.sleep(delay)
            for k in range(turns):
                turn = first_turn + k
                if k and args.think:
                    await asyncio.sleep(args.think)
                agent.messages.append({"role": "user", "content": user_message(agent.index, turn)})
                rec, reply = await one_request(client, base_url, model, agent, args)
                rec.phase, rec.turn = phase_of(turn), turn
                records.append(rec)
                if rec.error:
                    agent.messages.pop()
                    print(f"  ! agent {agent.index} turn {turn}: {rec.error}", file=sys.stderr)
                    return
                agent.messages.append({"role": "assistant", "content": reply})

        t0 = time.perf_counter()
        await asyncio.gather(*(drive(a, i * args.stagger) for i, a in enumerate(agents)))
        wall = time.perf_counter() - t0
    return records, wall


async def warm_up(base_url: str, model: str, args) -> None:
    """One tiny anonymous request so lazy initialisation is not billed to the first agent."""
    async with httpx.AsyncClient(timeout=args.request_timeout) as client:
        try:
            await client.post(base_url + "/completions", json={"model": model, "prompt": "Warm up.", "max_tokens": 2,
                                                                "temperature": 0},
                              headers={"Authorization": f"Bearer {args.api_key}"})
        except httpx.HTTPError as e:
            print(f"  warm-up failed: {e}", file=sys.stderr)


async def probe_shared_prefix(base_url: str, model: str, doc: str, args) -> int | None:
    """How many tokens the agents share, as the server sees it: an anonymous request with the
    shared document and a persona no agent has reports the longest cached prefix it reused.
    Sent after the cache state was read, so it does not count in the hot bytes."""
    async with httpx.AsyncClient(timeout=args.request_timeout) as client:
        try:
            r = await client.post(base_url + "/chat/completions", headers={"Authorization": f"Bearer {args.api_key}"},
                                  json={"model": model, "max_tokens": 1, "temperature": 0, "messages": [
                                      {"role": "system", "content": doc + "\n\nZ" + persona(10**6)[1:]},
                                      {"role": "user", "content": "?"}]})
            return ((r.json().get("usage") or {}).get("prompt_tokens_details") or {}).get("cached_tokens")
        except (httpx.HTTPError, ValueError, AttributeError):
            return None


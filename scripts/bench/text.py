"""The workload's deterministic text: the agents' shared system document (tools and a policy),
each agent's persona, its questions turn by turn and an optional earlier conversation."""

from __future__ import annotations

import random

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



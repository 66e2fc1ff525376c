"""Every mlx-lm family in models/tiny_archs.py is served with the whole memory, through the real
server: it loads and answers; an agent's next turn reuses at least its last prompt (but its
last token) and answers token for token as the same messages do with nothing cached; after a
restart the agent comes back from disk the same way. Sliding-window and recurrent layers cannot
be cut at any token as KV can, so the families that have them are held to it where it is
hardest: histories far past the window (32 tokens), hybrids over many turns, and a hybrid under
a hot budget too small to keep it (reuse may shrink, the answer may not change).

The families are served together, as several models of one server (`--model` once per family,
each loaded on its first request): every family then also shows that it keeps its own memory
beside the others'."""

from __future__ import annotations

import itertools
import json

import httpx
import pytest

from agent_memory.models.tiny import build_tiny
from agent_memory.models.tiny_archs import ARCHS, WINDOW
from tests.support.chat import tiers
from tests.support.inprocess import InProcessServer


TOKENS = 8  # each reply
SYSTEM = (
    "You keep the logbook of the lighthouse on the northern cape. You answer questions about "
    "ships, storms and the lamp in a few words, and say plainly when the log has no entry."
)
QUESTIONS = [
    "What happened on the night of the great storm?",
    "Which ship ran aground near the rocks?",
    "Who lit the lamp when the keeper was ill?",
    "How long did the fog last that winter?",
    "Why was the bell rung twice at dawn?",
    "What did the harbour master write about it?",
]
AGENT = "keeper"
_salts = itertools.count()  # each uncached request's own namespace, unique in the module
# (arch, messages) -> the answer with nothing cached, asked once in the module: every server here
# serves the same model folders, and what a model answers uncached does not depend on a server's
# budgets (the long histories' first turns and the second budget's turns ask the same again).
_uncached: dict[tuple[str, str], str] = {}


@pytest.fixture(scope="module")
def models(tmp_path_factory):
    """The tiny model of a family, built once for the module."""
    root = tmp_path_factory.mktemp("families")
    return lambda arch: build_tiny(root / arch, arch=arch)


def chat(client, arch: str, messages: list[dict], agent: str, salt: str | None = None):
    extra = {"prompt_cache_key": agent, **({"cache_salt": salt} if salt else {})}
    return client.chat.completions.create(
        model=arch, messages=messages, max_tokens=TOKENS, temperature=0, extra_body=extra
    )


def reused(response) -> int:
    return sum(tiers(response))


def text(response) -> str:
    return response.choices[0].message.content


def opening(system: str = SYSTEM) -> list[dict]:
    return [{"role": "system", "content": system}, {"role": "user", "content": QUESTIONS[0]}]


def follow(messages: list[dict], reply, question: str) -> list[dict]:
    """The agent's next messages: what it sent, the reply it got, a new question."""
    return messages + [{"role": "assistant", "content": text(reply)}, {"role": "user", "content": question}]


def uncached(client, arch: str, messages: list[dict]) -> str:
    """The answer to the same messages in a namespace of their own (`cache_salt`), where
    nothing is cached; its agent is ended after, so references take no memory from the agents
    under test."""
    key = (arch, json.dumps(messages))
    if key not in _uncached:
        n = next(_salts)
        response = chat(client, arch, messages, f"uncached-{n}", salt=f"uncached-{n}")
        assert tiers(response) == (0, 0), f"{arch}: a request with a new cache_salt reused {tiers(response)}"
        assert httpx.delete(f"{client.base_url}agents/uncached-{n}").status_code == 200
        _uncached[key] = text(response)
    return _uncached[key]


def next_turn(client, arch: str, agent: str, messages: list[dict], at_least: int):
    """A turn of `agent` that must reuse at least `at_least` prompt tokens and answer as uncached."""
    mine = chat(client, arch, messages, agent)
    assert reused(mine) >= at_least, (
        f"{arch}: a turn of {mine.usage.prompt_tokens} prompt tokens reused {tiers(mine)} (hot, warm); "
        f"its last turn's prompt leaves at least {at_least}"
    )
    reference = uncached(client, arch, messages)
    assert text(mine) == reference, f"{arch}: cached {text(mine)!r} != uncached {reference!r}"
    return mine


class Families:
    """One server serving several families, then the same server again on its cache folder."""

    def __init__(self, models, archs, folder, *flags: str) -> None:
        self.args = [models(a) for a in archs]
        self.folder, self.flags = folder, flags
        self.server = InProcessServer(self.args[0], folder, *self._more(), *flags).start()
        self.restarted = False
        self.turns: dict[str, tuple[list[dict], object]] = {}  # arch -> its agent's messages and second reply

    def _more(self) -> list[str]:
        return [arg for model in self.args[1:] for arg in ("--model", str(model))]

    def restart(self) -> InProcessServer:
        """Once: SIGTERM flushes every write; the new server has the agents on disk only."""
        if not self.restarted:
            self.server.stop()
            self.server = InProcessServer(self.args[0], self.folder, *self._more(), *self.flags).start()
            self.restarted = True
        return self.server


@pytest.fixture(scope="module")
def every_family(models, tmp_path_factory):
    families = Families(models, list(ARCHS), tmp_path_factory.mktemp("every-family"))
    yield families
    families.server.stop()


def first_turns(families: Families, arch: str) -> tuple[list[dict], object]:
    """The agent's first two turns on the first server, once per family: the messages of its
    third turn and its second reply (what the restart test continues from)."""
    if arch not in families.turns:
        assert not families.restarted, "the restart test ran first"
        client = families.server.client()
        messages = opening()
        first = chat(client, arch, messages, AGENT)
        assert first.choices[0].finish_reason in ("stop", "length") and first.usage.completion_tokens > 0, first
        assert tiers(first) == (0, 0), f"{arch}: a new server's first request reused {tiers(first)}"
        messages = follow(messages, first, QUESTIONS[1])
        second = next_turn(client, arch, AGENT, messages, first.usage.prompt_tokens - 1)
        families.turns[arch] = (follow(messages, second, QUESTIONS[2]), second)
    return families.turns[arch]


@pytest.mark.parametrize("arch", list(ARCHS))
def test_family_is_served_and_remembers_its_agent(every_family, arch):
    first_turns(every_family, arch)


@pytest.mark.parametrize("arch", list(ARCHS))
def test_family_remembers_its_agent_across_a_restart(every_family, arch):
    if arch not in every_family.turns and every_family.restarted:
        pytest.skip(f"{arch}: its first turns failed")
    messages, second = first_turns(every_family, arch)
    third = next_turn(every_family.restart().client(), arch, AGENT, messages, second.usage.prompt_tokens - 1)
    assert tiers(third)[1] > 0, f"{arch}: after a restart the agent reused {tiers(third)} (hot, warm)"


# Sliding-window families (gemma3_text, gpt_oss) many windows past their window, Llama 4 many
# chunks past its chunk, recurrent hybrids (qwen3_next, granitemoehybrid) over many turns; llama
# (full attention) beside them.
LONG = {"gemma3_text": 6, "gpt_oss": 6, "llama4": 6, "qwen3_next": 4, "granitemoehybrid": 4, "llama": 4}


@pytest.fixture(scope="module")
def long_histories(models, tmp_path_factory):
    families = Families(models, list(LONG), tmp_path_factory.mktemp("long"), "--disk-budget-mb", "0")
    yield families.server
    families.server.stop()


@pytest.mark.parametrize("arch", list(LONG))
def test_a_long_history_is_reused_on_every_turn(long_histories, arch):
    client = long_histories.client()
    messages = opening()
    reply = chat(client, arch, messages, AGENT)
    assert reply.usage.prompt_tokens > WINDOW  # the window has wrapped from the first turn
    for question in QUESTIONS[1 : LONG[arch]]:
        messages = follow(messages, reply, question)
        reply = next_turn(client, arch, AGENT, messages, reply.usage.prompt_tokens - 1)
    assert reply.usage.prompt_tokens > 200, f"{arch}: the history is only {reply.usage.prompt_tokens} tokens"


BUDGETS = {
    # 3 MiB shared by the two models (1-2 MiB each): agents push each other out, and a turn's
    # settle (api/serving/settle.py) still leaves some of its history for the next turn
    "hot-3MiB-shared-no-disk": ("--hot-budget-mb", "3", "--disk-budget-mb", "0"),
    "hot-0MiB-disk": ("--hot-budget-mb", "0"),  # nothing stays in memory; the disk keeps it all
}


@pytest.fixture(scope="module", params=list(BUDGETS))
def tight(request, models, tmp_path_factory):
    """Both archs on one server under a budget; the hot budget is shared out between them."""
    families = Families(models, ["qwen3_5", "llama"], tmp_path_factory.mktemp(request.param), *BUDGETS[request.param])
    yield request.param, families.server
    families.server.stop()


@pytest.mark.parametrize("arch", ["qwen3_5", "llama"])
def test_a_hybrid_under_a_tiny_hot_budget_answers_as_uncached(tight, arch):
    budget, s = tight
    client = s.client()
    agents = {f"agent-{i}": opening(f"Logbook {i}. " + SYSTEM) for i in range(3)}
    reuse = []
    for question in QUESTIONS[1:4]:  # the agents take turns, each turn evicting the others'
        for agent, messages in agents.items():
            mine = next_turn(client, arch, agent, messages, 0)
            reuse.append(tiers(mine))
            agents[agent] = follow(messages, mine, question)
    assert any(sum(t) for t in reuse), f"{arch}: no turn reused anything, the cached path was never taken"
    hot = httpx.get(s.base_url + "/v1/agents").json()["hot_bytes"]
    assert hot <= int(BUDGETS[budget][1]) << 20, f"{arch}: {hot} hot bytes over a {budget} budget"

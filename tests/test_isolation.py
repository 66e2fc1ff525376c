"""Agents that must not see each other don't: `cache_salt` and per-tenant API keys are
namespaces of the block hash chain, so no cached block is shared across them, in memory or on
disk, before or after a restart."""

from __future__ import annotations

import os

import httpx
import openai
import pytest
from typer.testing import CliRunner

from agent_memory.cli import app
from tests.support.inprocess import InProcessServer

SECRET_PROMPT = "You guard the vault. The code is 4711. Never tell it. " * 8


def ask(client, content: str, agent: str | None = None, salt: str | None = None):
    extra = {}
    if agent:
        extra["prompt_cache_key"] = agent
    if salt is not None:
        extra["cache_salt"] = salt
    return client.chat.completions.create(
        model="tiny",
        messages=[{"role": "system", "content": SECRET_PROMPT}, {"role": "user", "content": content}],
        max_tokens=4,
        temperature=0,
        extra_body=extra,
    )


def cached(response) -> int:
    return response.usage.prompt_tokens_details.cached_tokens


def test_requests_with_different_cache_salts_share_no_block(server, client):
    first = ask(client, "Hello.", salt="team-a")
    assert cached(first) == 0
    assert cached(ask(client, "Hello again.", salt="team-a")) > 100  # the same salt reuses
    assert cached(ask(client, "Hello.", salt="team-b")) == 0  # another salt finds nothing
    assert cached(ask(client, "Hello.")) == 0  # nor does the unsalted, shared namespace
    assert cached(ask(client, "Hello.", salt="team-b")) > 100


def test_an_agent_keeps_its_namespace_across_turns(server, client):
    ask(client, "Turn one.", agent="salted-agent", salt="s1")
    assert cached(ask(client, "Turn one.", agent="salted-agent", salt="s1")) > 100
    assert cached(ask(client, "Turn one.", agent="salted-agent", salt="s2")) == 0


@pytest.fixture(scope="module")
def tenants(tiny_model, tmp_path_factory):
    folder = tmp_path_factory.mktemp("tenants")
    keys = folder / "keys"
    keys.write_text("# name key\nalice key-alice\nbob key-bob\n\n")
    cache = folder / "cache"
    return InProcessServer(tiny_model, cache, "--api-keys-file", str(keys)), cache


def test_tenants_have_their_own_agents_and_blocks_even_after_a_restart(tenants):
    server, _ = tenants
    with server:
        alice, bob = server.client(api_key="key-alice"), server.client(api_key="key-bob")
        assert cached(ask(alice, "Open.", agent="same-id")) == 0
        assert cached(ask(bob, "Open.", agent="same-id")) == 0  # alice's blocks are not bob's
        assert cached(ask(alice, "Open.", agent="same-id")) > 100

        def listed(key: str) -> list[str]:
            r = httpx.get(server.base_url + "/v1/agents", headers={"Authorization": f"Bearer {key}"})
            return [a["id"] for a in r.json()["data"]]

        ask(bob, "Another.", agent="bobs-only")
        assert listed("key-alice") == ["same-id"]
        assert sorted(listed("key-bob")) == ["bobs-only", "same-id"]
        r = httpx.delete(server.base_url + "/v1/agents/bobs-only", headers={"x-api-key": "key-alice"})
        assert r.status_code == 404  # alice cannot end bob's agent
        r = httpx.delete(server.base_url + "/v1/agents/same-id", headers={"x-api-key": "key-alice"})
        assert r.status_code == 200
        assert listed("key-alice") == [] and sorted(listed("key-bob")) == ["bobs-only", "same-id"]
        with pytest.raises(openai.AuthenticationError):
            ask(server.client(api_key="key-carol"), "Hi.")
    with server:  # restored from disk: still apart
        alice, bob = server.client(api_key="key-alice"), server.client(api_key="key-bob")
        r = ask(bob, "Open.", agent="same-id")
        assert r.usage.prompt_tokens_details.model_extra["warm_tokens"] > 100
        assert cached(ask(alice, "Open.", agent="new-alice")) == 0


@pytest.mark.parametrize("content", ["alice\n", "alice key-1 extra\n", "al ice key\n", "a k\nb k\n", "# only comments\n"])
def test_a_broken_keys_file_stops_the_start_naming_its_line(tiny_model, tmp_path, content, monkeypatch):
    """`serve`'s own command, in process (tests/test_settings.py runs such a refusal as a process)."""
    keys = tmp_path / "keys"
    keys.write_text(content)
    for key in [k for k in os.environ if k.startswith("AGENT_MEMORY_")]:
        monkeypatch.delenv(key)
    serve = ["serve", "--model", str(tiny_model), "--api-keys-file", str(keys)]
    r = CliRunner().invoke(app, serve, env={"AGENT_MEMORY_CONFIG": str(tmp_path / "none.toml")})
    assert r.exit_code == 2 and str(keys) in r.stderr and "Traceback" not in r.output, r.output

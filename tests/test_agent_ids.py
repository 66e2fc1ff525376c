"""Agent ids: every (tenant, id, kind) has a record name of its own, so the shared key cannot
spell another tenant's agent; ids with control or bidi characters are refused wherever an id
is read (a 400 naming the field, in each API's error shape), while those an older version
stored are migrated, shown escaped and deletable."""

from __future__ import annotations

import json
import logging
from pathlib import Path
from urllib.parse import quote

import httpx
import pytest
from typer.testing import CliRunner

from agent_memory import files
from agent_memory.agent_key import RESPONSE, AgentKey, agent_file_stem, legacy_file_stem
from agent_memory.cli.cache.commands import cache_app
from agent_memory.memory.warm.folder.paths import Folder, model_folders
from agent_memory.memory.warm.format.records import Manifest
from agent_memory.memory.warm.redis.backend import RedisBackend
from agent_memory.memory.warm.redis.keys import CAS_MANIFEST
from tests.support.browser import browser, row, until, visible  # noqa: F401 - browser: the fixture
from tests.support.inprocess import InProcessServer


PROMPT = "You keep the ledger of the harbour. Every ship is written down with its cargo. " * 6
SHARED_KEY = "key-shared"
ALICE_KEY = "key-alice"
# Ids an older version accepted, as the API shows them (display_id) and the CLI prints them.
LEGACY_IDS = {
    "line1\nline2": '"line1\\nline2"',
    "\u202egnp.exe\u202c-rtl": '"\\u202egnp.exe\\u202c-rtl"',
    "tab\there": '"tab\\there"',
}


def chat_body(**extra) -> dict:
    return {"model": "tiny", "messages": [{"role": "user", "content": "Hi."}], "max_tokens": 2, **extra}


def completion_body(**extra) -> dict:
    return {"model": "tiny", "prompt": "Hi", "max_tokens": 2, **extra}


def responses_body(**extra) -> dict:
    return {"model": "tiny", "input": "Hi", "store": False, **extra}  # stored: the response is the agent


CLAUDE_CODE = {"user_id": json.dumps({"session_id": "s-1"})}  # its session names the agent, with the subagent


# -- names ------------------------------------------------------------------------------------


def test_no_key_names_another_keys_records():
    shared = AgentKey("alice\0victim\0agent")
    alices = AgentKey("victim", "alice")
    assert legacy_file_stem(shared) == agent_file_stem(alices)  # how af1c16f named them: one file
    assert agent_file_stem(shared) != agent_file_stem(alices)
    # A stored response's records, which the shared namespace could spell the same way.
    assert agent_file_stem(AgentKey("\0resp_1\0response")) != agent_file_stem(AgentKey("resp_1", "", RESPONSE))
    assert legacy_file_stem(alices) is None and legacy_file_stem(AgentKey("resp_1", "", RESPONSE)) is None


def test_a_manifest_parses_under_its_name_or_its_legacy_one_only():
    raw = Manifest(AgentKey("plain"), "f" * 32, [1, 2], [], 1.0).to_bytes()
    assert Manifest.parse(raw, agent_file_stem("plain")).key == AgentKey("plain")
    assert Manifest.parse(raw, legacy_file_stem("plain")).key == AgentKey("plain")
    with pytest.raises(ValueError, match="file name"):
        Manifest.parse(raw, agent_file_stem("other"))


# -- refused ids ------------------------------------------------------------------------------


def openai_refusal(r: httpx.Response, param: str) -> None:
    assert r.status_code == 400, r.text
    error = r.json()["error"]
    assert error["param"] == param and error["code"] == "invalid_agent_id" and param in error["message"]


def anthropic_refusal(r: httpx.Response, param: str) -> None:
    assert r.status_code == 400, r.text
    body = r.json()
    assert body["type"] == "error" and body["error"]["type"] == "invalid_request_error"
    assert param in body["error"]["message"]


@pytest.mark.parametrize(
    "path, body, headers, param",
    [
        ("/v1/chat/completions", chat_body(prompt_cache_key="line1\nline2"), {}, "prompt_cache_key"),
        ("/v1/chat/completions", chat_body(promptCacheKey="line1\nline2"), {}, "promptCacheKey"),  # the AI SDK's
        ("/v1/chat/completions", chat_body(), {"X-Agent-Id": "tab\there".encode()}, "X-Agent-Id"),
        ("/v1/chat/completions", chat_body(user="\u202egnp.exe\u202c-rtl"), {}, "user"),
        ("/v1/chat/completions", chat_body(metadata={"user_id": "del\x7f"}), {}, "metadata.user_id"),
        ("/v1/completions", completion_body(user="c1\x85"), {}, "user"),
        ("/v1/completions", completion_body(), {"X-Agent-Id": "x\u2066".encode()}, "X-Agent-Id"),
        ("/v1/responses", responses_body(prompt_cache_key="nul\x00"), {}, "prompt_cache_key"),
    ],
)
def test_openai_formats_refuse_control_and_bidi_characters_in_agent_ids(server, path, body, headers, param):
    with server.http() as http:
        openai_refusal(http.post(path, json=body, headers=headers), param)


@pytest.mark.parametrize(
    "metadata, headers, param",
    [
        ({"user_id": "line1\nline2"}, {}, "metadata.user_id"),
        ({"user_id": "\u200fmark"}, {}, "metadata.user_id"),
        (None, {"X-Agent-Id": "\u202eevil".encode()}, "X-Agent-Id"),
        (CLAUDE_CODE, {"x-claude-code-agent-id": "sub\tagent".encode()}, "x-claude-code-agent-id"),
    ],
)
def test_messages_refuse_them_in_anthropics_error_shape(server, metadata, headers, param):
    body = {"model": "tiny", "max_tokens": 2, "messages": [{"role": "user", "content": "Hi."}]}
    if metadata is not None:
        body["metadata"] = metadata
    with server.http() as http:
        anthropic_refusal(http.post("/v1/messages", json=body, headers=headers), param)


@pytest.mark.parametrize("method", ["GET", "DELETE"])
def test_agents_paths_refuse_an_id_none_may_name_rather_than_a_bare_404(server, method):
    with server.http() as http:
        for agent in ("line1\nline2", "nul\x00", "trailing\n", "\u202egnp"):
            openai_refusal(http.request(method, "/v1/agents/" + quote(agent, safe="")), "agent_id")
        assert http.request(method, "/v1/agents/absent").status_code == 404


# -- ids of older versions ------------------------------------------------------------------


def ask(server: InProcessServer, key: str, agent: str) -> httpx.Response:
    body = {"model": "tiny", "max_tokens": 2, "temperature": 0, "prompt_cache_key": agent}
    body["messages"] = [{"role": "system", "content": PROMPT}, {"role": "user", "content": "Next ship?"}]
    with server.http() as http:
        return http.post("/v1/chat/completions", json=body, headers={"Authorization": f"Bearer {key}"})


def agents(server: InProcessServer, key: str) -> dict[str, str]:
    """id -> display_id of the key's agents."""
    with server.http() as http:
        return {a["id"]: a["display_id"] for a in http.get("/v1/agents", headers={"x-api-key": key}).json()["data"]}


def write_as_af1c16f(cache: Path) -> Folder:
    """The shared agent "plain"'s manifest, and LEGACY_IDS' (copies of it), named as versions
    before this one named shared-namespace manifests: their bare id's hash."""
    (folder,) = model_folders(cache / "kv")
    plain = folder.agent_path(AgentKey("plain"))
    manifest = json.loads(plain.read_bytes())
    plain.unlink()
    for agent in ["plain", *LEGACY_IDS]:
        data = json.dumps({**manifest, "agent": agent}).encode()
        files.write_atomic(folder.agents / f"{legacy_file_stem(agent)}.json", [data])
    return folder


def test_an_older_versions_folder_is_migrated_read_and_its_odd_ids_shown_escaped_and_deleted(tiny_model, tmp_path):
    keys = tmp_path / "keys"
    keys.write_text(f"alice {ALICE_KEY}\n")
    cache = tmp_path / "cache"
    server = InProcessServer(tiny_model, cache, "--api-keys-file", str(keys), "--api-key", SHARED_KEY)
    with server:
        assert ask(server, ALICE_KEY, "victim").status_code == 200
        assert ask(server, SHARED_KEY, "plain").status_code == 200
        # The shared key spelling alice's record name: refused before it reaches any record.
        openai_refusal(ask(server, SHARED_KEY, "alice\0victim\0agent"), "prompt_cache_key")
    folder = write_as_af1c16f(cache)

    with server:
        assert "migrated 4 agent records" in server.log()
        usage = ask(server, SHARED_KEY, "plain").json()["usage"]["prompt_tokens_details"]
        assert usage["warm_tokens"] > 100  # read back from the migrated manifest
        assert agents(server, SHARED_KEY) == {"plain": "plain", **LEGACY_IDS}
        assert agents(server, ALICE_KEY) == {"victim": "victim"}
        with server.http() as http:
            r = http.delete("/v1/agents/" + quote("line1\nline2", safe=""), headers={"x-api-key": SHARED_KEY})
            assert r.status_code == 200 and r.json()["deleted"] is True
            r = http.get("/v1/agents/" + quote("tab\there", safe=""), headers={"x-api-key": SHARED_KEY})
            assert r.status_code == 200 and r.json()["display_id"] == '"tab\\there"'
        assert set(agents(server, SHARED_KEY)) == {"plain", "\u202egnp.exe\u202c-rtl", "tab\there"}
    names = {p.name for p in folder.agents.iterdir()}
    kept = [AgentKey("plain"), AgentKey("\u202egnp.exe\u202c-rtl"), AgentKey("tab\there"), AgentKey("victim", "alice")]
    assert names == {folder.agent_path(k).name for k in kept}  # every record under its new name

    # The cache commands show them escaped and delete them by id.
    run = lambda *args: CliRunner().invoke(cache_app, [*args, "--cache-dir", str(cache)])  # noqa: E731
    listed = run("ls")
    assert listed.exit_code == 0 and '"\\u202egnp.exe\\u202c-rtl"' in listed.stdout and "\u202e" not in listed.stdout
    shown = run("show", "tab\there")
    assert shown.exit_code == 0 and '"tab\\there"' in shown.stdout
    removed = run("rm", "--yes", "\u202egnp.exe\u202c-rtl")
    assert removed.exit_code == 0, removed.stdout
    assert not folder.agent_path(AgentKey("\u202egnp.exe\u202c-rtl")).exists()


def test_a_shared_namespaces_legacy_manifest_moves_to_its_name_once(tmp_path, caplog):
    from tests.support.services import RedisServer
    from tests.support.fake_kv import commit, discover, shared_store

    with RedisServer(tmp_path / "redis") as redis:
        ns = "legacy-0123456789ab-kv16"
        store, disk = shared_store(redis.url, ns)
        for agent in ("plain", "line1\nline2", "both"):
            commit(store, agent, list(range(10)))
        disk.flush()
        backend: RedisBackend = disk.backend
        client = backend.keys.client
        refs = client.hgetall(backend.keys.refs_key)
        legacy = {agent: f"am:{{{ns}}}:m:{legacy_file_stem(agent)}" for agent in ("plain", "line1\nline2", "both")}
        for agent in ("plain", "line1\nline2"):  # named as af1c16f named them
            client.rename(backend.keys.manifest_key(agent), legacy[agent])
        # "both": a newer server wrote its name, an older one its legacy name afterwards.
        data, blocks = client.hmget(backend.keys.manifest_key("both"), ["data", "blocks"])
        backend.keys.script(CAS_MANIFEST)(keys=[legacy["both"], backend.keys.refs_key], args=["", "old", data, blocks])
        client.delete(backend.keys.stems_key)
        disk.close()

        with caplog.at_level(logging.INFO, logger="agent_memory.memory.warm.stems"):
            store, disk = shared_store(redis.url, ns)
        assert "migrated 2 agent records" in caplog.text
        backend = disk.backend
        names = {k.decode() for k in client.scan_iter(match=f"am:{{{ns}}}:m:*")}
        assert names == {backend.keys.manifest_key(a) for a in ("plain", "line1\nline2", "both")}
        assert client.hgetall(backend.keys.refs_key) == refs  # the dropped copy's references with it
        discover(store, "plain", list(range(12)))
        assert store.agents[AgentKey("plain")].tokens == list(range(10))
        disk.close()
        caplog.clear()
        with caplog.at_level(logging.INFO, logger="agent_memory.memory.warm.stems"):
            shared_store(redis.url, ns)[1].close()
        assert "migrated" not in caplog.text  # once: the namespace says it is done


def test_the_dashboard_shows_an_older_versions_odd_id_escaped_and_deletes_it(
    browser, tiny_model, tmp_path  # noqa: F811 - the fixture imported above
):
    from selenium.webdriver.common.by import By

    rtl, shown = "\u202egnp.exe\u202c-rtl", LEGACY_IDS["\u202egnp.exe\u202c-rtl"]
    server = InProcessServer(tiny_model, tmp_path / "cache")
    with server:
        assert ask(server, "unused", "plain").status_code == 200
    write_as_af1c16f(tmp_path / "cache")
    with server:
        browser.get(server.base_url + "/dashboard")
        until(browser, lambda d: row(d, rtl) is not None, message="the agent never appeared")
        assert row(browser, rtl).find_element(By.CSS_SELECTOR, "th").text == shown
        assert row(browser, "line1\nline2").find_element(By.CSS_SELECTOR, "th").text == '"line1\\nline2"'
        row(browser, rtl).find_element(By.CSS_SELECTOR, "button.delete").click()
        until(browser, lambda d: visible(d, "confirm"))
        assert browser.find_element("id", "confirm-id").text == shown
        browser.find_element("id", "confirm-delete").click()
        until(browser, lambda d: row(d, rtl) is None, message="the row stayed")
        assert set(agents(server, "unused")) == {"plain", "line1\nline2", "tab\there"}

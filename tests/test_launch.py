"""`agent-memory launch`'s own behaviour, without running the programs (tests/test_agent_programs.py
runs them): `--print` shows each program's settings for the served model, `--write-config`
changes only what it names in the user's files (a diff shown, the old file kept as .bak), and
a program that is not installed is named with how to install it. All on a temporary HOME."""

from __future__ import annotations

import json
import os
import tomllib
from pathlib import Path

import pytest
import yaml
from click.testing import Result
from typer.testing import CliRunner

from agent_memory.cli import app
from tests.support.server import free_port

PROGRAMS = ["claude", "codex", "opencode", "qwen", "aider", "llm"]
USER_PLACES = ("XDG_CONFIG_HOME", "CLAUDE_CONFIG_DIR", "CODEX_HOME", "LLM_USER_PATH", "AGENT_MEMORY_")


def launch(home: Path, *args: str, path: str | None = None, cache: Path | None = None) -> Result:
    """`agent-memory launch ARGS` in this process (its logic is what these tests check) on a
    temporary HOME: `exit_code`, `stdout`, `stderr`."""
    env: dict[str, str | None] = {k: None for k in os.environ if k.startswith(USER_PLACES)}
    env.update(HOME=str(home), AGENT_MEMORY_CONFIG=str(home / "no-config.toml"), AGENT_MEMORY_PORT=str(free_port()))
    if path is not None:
        env["PATH"] = path
    return CliRunner().invoke(app, ["launch", *args, "--cache-dir", str(cache or home / "cache")], env=env)


@pytest.mark.parametrize(
    "program, shown",
    [
        ("claude", '"CLAUDE_CODE_MAX_CONTEXT_TOKENS": "4096"'),
        ("codex", "model_context_window = 4096"),
        ("opencode", '"context": 4096'),
        ("qwen", "export OPENAI_MODEL=tiny"),
        ("aider", '"max_input_tokens": 4096'),
        ("llm", "supports_schema: true"),
    ],
)
def test_print_shows_the_settings_and_runs_nothing(server, tmp_path, program, shown):
    done = launch(tmp_path, program, "--print", "--base-url", server.base_url + "/v1", path="/nonexistent")
    assert done.exit_code == 0, done.stderr
    assert shown in done.stdout and f"{server.base_url}" in done.stdout and "context 4096 tokens" in done.stdout
    assert sorted(p.name for p in tmp_path.iterdir()) == []  # nothing written, not even its cache folder


def test_write_config_changes_only_its_own_settings(server, tmp_path):
    codex = tmp_path / ".codex" / "config.toml"
    opencode = tmp_path / ".config" / "opencode" / "opencode.json"
    claude = tmp_path / ".claude" / "settings.json"
    qwen = tmp_path / ".qwen" / "settings.json"
    for path in (codex, opencode, claude, qwen):
        path.parent.mkdir(parents=True)
    codex.write_text(
        'approval_policy = "never"  # mine\n\n[profiles.agent-memory]\nmodel = "old"\n\n'
        '[mcp_servers.docs]\ncommand = "x"\n'
    )
    opencode.write_text(json.dumps({"theme": "tokyonight", "provider": {"other": {"npm": "x"}}}))
    claude.write_text(json.dumps({"permissions": {"allow": ["Bash"]}, "env": {"MINE": "1"}}))
    qwen.write_text(json.dumps({"ui": {"theme": "Dracula"}, "model": {"name": "qwen3-coder", "maxSessionTurns": 9}}))
    before = {path: path.read_text() for path in (codex, opencode, claude, qwen)}

    for program in ("codex", "opencode", "claude", "aider", "qwen"):
        done = launch(tmp_path, program, "--write-config", "--base-url", server.base_url, path="/nonexistent")
        assert done.exit_code == 0, done.stderr
        assert done.stdout.startswith("---") and "+" in done.stdout  # the diff
    config = tomllib.loads(codex.read_text())
    assert config["approval_policy"] == "never" and config["mcp_servers"] == {"docs": {"command": "x"}}
    assert config["profiles"]["agent-memory"] == {
        "model": "tiny", "model_provider": "agent-memory", "model_context_window": 4096,
        "model_auto_compact_token_limit": 3686,
    }
    assert config["model_providers"]["agent-memory"]["base_url"] == server.base_url + "/v1"
    assert "# mine" in codex.read_text()
    settings = json.loads(opencode.read_text())
    assert settings["theme"] == "tokyonight" and set(settings["provider"]) == {"other", "agent-memory"}
    assert settings["model"] == "agent-memory/tiny"
    assert settings["provider"]["agent-memory"]["models"]["tiny"]["limit"] == {"context": 4096, "output": 1024}
    env = json.loads(claude.read_text())["env"]
    assert env["MINE"] == "1" and env["ANTHROPIC_BASE_URL"] == server.base_url and env["ANTHROPIC_MODEL"] == "tiny"
    assert json.loads(claude.read_text())["permissions"] == {"allow": ["Bash"]}
    for path, text in before.items():  # the old file kept beside it
        [backup] = path.parent.glob(f"{path.name}.*.bak")
        assert backup.read_text() == text
    mine = json.loads(qwen.read_text())
    assert mine["ui"] == {"theme": "Dracula"} and mine["security"] == {"auth": {"selectedType": "openai"}}
    assert mine["model"] == {"name": "tiny", "maxSessionTurns": 9, "generationConfig": {"contextWindowSize": 4096}}
    aider = yaml.safe_load((tmp_path / ".aider.conf.yml").read_text())
    assert aider["model"] == "openai/tiny" and aider["openai-api-base"] == server.base_url + "/v1"
    metadata = json.loads((tmp_path / ".aider.model.metadata.json").read_text())
    assert metadata["openai/tiny"]["max_input_tokens"] == 4096

    again = launch(tmp_path, "codex", "--write-config", "--base-url", server.base_url, path="/nonexistent")
    assert again.exit_code == 0 and again.stdout == "" and "already set" in again.stderr
    assert len(list(codex.parent.glob("config.toml.*.bak"))) == 1


def test_a_missing_program_is_named_with_how_to_install_it(server, tmp_path):
    done = launch(tmp_path, "qwen", "--base-url", server.base_url, "--", "-p", "hi", path="/nonexistent")
    assert done.exit_code == 1 and "npm install -g @qwen-code/qwen-code" in done.stderr


def test_unknown_program_or_model(server, tmp_path):
    unknown = launch(tmp_path, "vim", "--print", "--base-url", server.base_url)
    assert unknown.exit_code == 2 and "one of: claude, codex, opencode, qwen, aider, llm" in unknown.stderr
    other = launch(tmp_path, "claude", "--print", "--base-url", server.base_url, "--model", "gpt-9")
    assert other.exit_code == 1 and "serves no model 'gpt-9' (it serves: tiny)" in other.stderr


def test_a_running_server_is_found_by_its_record(server, tmp_path):
    """No --base-url: the server recorded in the cache folder (server.json) is the one used."""
    done = launch(tmp_path, "codex", "--print", path="/nonexistent", cache=server.cache_dir)
    assert done.exit_code == 0, done.stderr
    assert f'base_url = "{server.base_url}/v1"' in done.stdout and "starting" not in done.stderr

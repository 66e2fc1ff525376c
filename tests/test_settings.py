"""Settings are what the user wrote: flag > environment > config file > default, for every
setting, checked at start; through the real CLI and a real server."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import httpx
import pytest
from typer.testing import CliRunner

from agent_memory.cli import app
from agent_memory.cli.serve import HELP_GROUPS
from agent_memory.config import ConfigError, Settings, load_settings
from tests.support.chat import chat
from tests.support.server import Server

pytestmark = pytest.mark.process
# For every setting, three valid values other than its default: (file, env, flag).
VALUES = {
    "model": (["from-file"], ["from-env", "small=from-env-2"], ["from-flag", "a=b", "c"]),
    "keep_loaded": (["f"], ["e1", "e2"], ["x"]),
    "unload_idle_s": (30, 60, 90),
    "host": ("127.0.0.2", "127.0.0.3", "localhost"),
    "port": (8101, 8102, 8103),
    "cache_dir": ("/tmp/am-file", "/tmp/am-env", "/tmp/am-flag"),
    "hot_budget_mb": (11, 12, 13),
    "disk_budget_mb": (21, 22, 23),
    "responses_budget_mb": (31, 32, 33),
    "vision_cache_mb": (41, 42, 43),
    "warm_store": ("redis://file:6379/0", "redis://env:6379/1", "rediss://flag:6380/2"),
    "kv_bits": (8, 16, 8),
    "kv_group_size": (32, 128, 32),
    "disk_kv_bits": (8, 16, 4),
    "decode_quantized": (True, False, True),
    "model_defaults": (False, True, False),
    "default_max_tokens": (["4096"], ["2048", "small=512"], ["1024", "a=16"]),
    "speculation": ("off", "lookup", "draft"),
    "draft_model": ("/tmp/draft-file", "/tmp/draft-env", "draft-flag/hub-id"),
    "max_batch": (3, 4, 5),
    "distributed": ("tensor", "pipeline", "tensor"),
    "distributed_timeout": (30.0, 45.5, 60.0),
    "max_waiting": (6, 7, 8),
    "max_images": (2, 3, 4),
    "max_image_mb": (1, 2, 3),
    "max_image_pixels": (1000, 2000, 3000),
    "image_urls": (True, False, True),
    "image_url_timeout_s": (1, 2, 3),
    "memory_limit_mb": (1000, 2000, 3000),
    "api_key": ("k-file", "k-env", "k-flag"),
    "log_level": ("debug", "warning", "error"),
    "log_format": ("json", "text", "json"),
    "log_agent_ids": (True, False, True),
    "api_keys_file": ("/tmp/keys-file", "/tmp/keys-env", "/tmp/keys-flag"),
    "trace_file": ("/tmp/trace-file", "/tmp/trace-env", "/tmp/trace-flag"),
    "seal_key_file": ("/tmp/seal-file", "/tmp/seal-env", "/tmp/seal-flag"),
    "warm_prompts": ("/tmp/warm-file.jsonl", "/tmp/warm-env.jsonl", "/tmp/warm-flag.jsonl"),
}


def _toml(value) -> str:
    return str(value).lower() if isinstance(value, bool) else repr(value) if isinstance(value, str) else str(value)


def _env(value) -> str:
    """As the environment gives it: a list comma-separated."""
    return ",".join(value) if isinstance(value, list) else str(value).lower() if isinstance(value, bool) else str(value)


def _plain(value):
    return (
        value.get_secret_value()
        if hasattr(value, "get_secret_value")
        else str(value)
        if isinstance(value, Path)
        else value
    )


def test_every_setting_is_covered():
    assert set(VALUES) == set(Settings.model_fields)
    grouped = [name for names in HELP_GROUPS.values() for name in names]
    assert sorted(grouped) == sorted(Settings.model_fields)  # each in exactly one group of --help


def test_serve_help_fits_80_columns():
    out = subprocess.run(
        [sys.executable, "-m", "agent_memory", "serve", "--help"],
        capture_output=True,
        text=True,
        env={**os.environ, "COLUMNS": "80"},
        check=True,
    ).stdout
    assert max(len(line) for line in out.splitlines()) <= 80
    assert "…" not in out
    for title in HELP_GROUPS:
        assert f"\n{title}:\n" in out
    for name in Settings.model_fields:
        assert f"--{name.replace('_', '-')}" in out


@pytest.mark.parametrize("name", sorted(VALUES))
def test_flag_beats_env_beats_file_beats_default(name, tmp_path, monkeypatch):
    file_value, env_value, flag_value = VALUES[name]
    config = tmp_path / "config.toml"
    monkeypatch.setenv("AGENT_MEMORY_CONFIG", str(config))
    for key in [k for k in os.environ if k.startswith("AGENT_MEMORY_") and k != "AGENT_MEMORY_CONFIG"]:
        monkeypatch.delenv(key)
    default = _plain(Settings.model_fields[name].get_default(call_default_factory=True))
    assert _plain(getattr(load_settings(), name)) == default
    config.write_text(f"{name} = {_toml(file_value)}\n")
    assert _plain(getattr(load_settings(), name)) == file_value
    monkeypatch.setenv(f"AGENT_MEMORY_{name.upper()}", _env(env_value))
    assert _plain(getattr(load_settings(), name)) == env_value
    assert _plain(getattr(load_settings(**{name: flag_value}), name)) == flag_value


@pytest.mark.parametrize(
    "toml, named",
    [
        ("hot_budget_mb = 12.5\n", "--hot-budget-mb"),
        ('max_batch = "many"\n', "--max-batch"),
        ("kv_bits = 5\n", "--kv-bits"),
        ("kv_group_size = 48\n", "--kv-group-size"),
        ("port = 70000\n", "--port"),
        ('warm_store = "http://cache:6379"\n', "--warm-store"),
        ("hot_budjet_mb = 10\n", "hot_budjet_mb"),
        ("kv_bits = \n", "config file"),
        ('default_max_tokens = ["0"]\n', "--default-max-tokens"),
        ('default_max_tokens = ["a=lots"]\n', "--default-max-tokens"),
    ],
)
def test_a_wrong_setting_is_a_clear_error_at_start(toml, named, tmp_path, tiny_model, monkeypatch):
    """`serve`'s own command, in process: the settings are read and refused before anything loads."""
    config = tmp_path / "config.toml"
    config.write_text(toml)
    for key in [k for k in os.environ if k.startswith("AGENT_MEMORY_")]:
        monkeypatch.delenv(key)
    serve = ["serve", "--model", str(tiny_model), "--cache-dir", str(tmp_path)]
    r = CliRunner().invoke(app, serve, env={"AGENT_MEMORY_CONFIG": str(config)})
    assert r.exit_code == 2, r.output
    assert named in r.stderr and "Traceback" not in r.output and isinstance(r.exception, SystemExit)


def test_a_wrong_setting_stops_the_process_with_status_2(tiny_model, tmp_path):
    """The same refusal from the process itself: its status and one clear line on stderr."""
    config = tmp_path / "config.toml"
    config.write_text("kv_bits = 5\n")
    r = subprocess.run(
        [sys.executable, "-m", "agent_memory", "serve", "--model", str(tiny_model), "--cache-dir", str(tmp_path)],
        capture_output=True,
        text=True,
        timeout=60,
        env={"AGENT_MEMORY_CONFIG": str(config), "PATH": "/usr/bin:/bin", "HOME": str(tmp_path)},
    )
    assert r.returncode == 2, r.stderr
    assert "--kv-bits" in r.stderr and "Traceback" not in r.stderr


def test_the_config_file_reaches_the_running_server(tiny_model, tmp_path):
    """The API key first: a key in the config file is enforced (it was once ignored)."""
    config = tmp_path / "config.toml"
    config.write_text(
        'api_key = "from-file"\nhot_budget_mb = 64\ndisk_budget_mb = 32\nkv_group_size = 32\n'
        "disk_kv_bits = 8\nmax_batch = 3\ndecode_quantized = true\nkv_bits = 4\n"
    )
    env = {"AGENT_MEMORY_CONFIG": str(config), "AGENT_MEMORY_MAX_BATCH": "5"}
    s = Server(tiny_model, tmp_path / "cache", "--kv-bits", "8", env=env)
    s.start()
    try:
        assert httpx.get(s.base_url + "/v1/models").status_code == 401
        assert chat(s.client(api_key="from-file"), "Hi", max_tokens=2).choices
        line = next(x for x in s.log().splitlines() if "settings: " in x)
        for expected in (
            "hot_budget_mb=64",
            "disk_budget_mb=32",
            "kv_bits=8",  # the flag beats the file
            "kv_group_size=32",
            "disk_kv_bits=8",
            "decode_quantized=True",
            "max_batch=5",  # the environment beats the file
            "api_key=set",
        ):
            assert expected in line.split(), (expected, line)
        assert "from-file" not in s.log()
    finally:
        s.stop()


def test_cache_commands_read_the_cache_dir_from_the_config_file(tmp_path):
    config = tmp_path / "config.toml"
    (tmp_path / "elsewhere" / "kv").mkdir(parents=True)
    config.write_text(f'cache_dir = "{tmp_path / "elsewhere"}"\n')
    r = subprocess.run(
        [sys.executable, "-m", "agent_memory", "cache", "stats", "--format", "json"],
        capture_output=True,
        text=True,
        timeout=60,
        env={"AGENT_MEMORY_CONFIG": str(config), "PATH": "/usr/bin:/bin", "HOME": str(tmp_path)},
    )
    assert r.returncode == 0, r.stderr
    assert str(tmp_path / "elsewhere") in r.stdout


def test_load_settings_refuses_unknown_keys(tmp_path, monkeypatch):
    config = tmp_path / "config.toml"
    config.write_text("frobnicate = 1\n")
    monkeypatch.setenv("AGENT_MEMORY_CONFIG", str(config))
    with pytest.raises(ConfigError, match="unknown setting 'frobnicate'"):
        load_settings()

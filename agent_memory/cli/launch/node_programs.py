"""The programs installed from npm: Claude Code (the Anthropic route), Codex CLI (Responses),
opencode and Qwen Code (chat completions). Each is told the model's context and output
limit, has telemetry, update checks and what else phones home turned off, and keeps its prompt
the same from request to request where it has a switch for that."""

from __future__ import annotations

import json
import os
from pathlib import Path

from agent_memory.cli.launch.config_files import UserFile, json_merge, toml_merge, toml_tables
from agent_memory.cli.launch.programs import PROVIDER, Launch, Program
from agent_memory.cli.launch.target import Target


class ClaudeCode(Program):
    name, binary, install = "claude", "claude", "npm install -g @anthropic-ai/claude-code"

    def env(self, target: Target) -> dict[str, str]:
        models = ("ANTHROPIC_MODEL", "ANTHROPIC_SMALL_FAST_MODEL", "ANTHROPIC_DEFAULT_HAIKU_MODEL",
                  "ANTHROPIC_DEFAULT_SONNET_MODEL", "ANTHROPIC_DEFAULT_OPUS_MODEL")  # every alias it may use
        return {
            "ANTHROPIC_BASE_URL": target.base_url,
            "ANTHROPIC_AUTH_TOKEN": target.key_or_placeholder,  # sent as Bearer, never asked to approve
            **dict.fromkeys(models, target.model),
            "CLAUDE_CODE_MAX_CONTEXT_TOKENS": str(target.context),  # else it assumes 1M and never compacts
            "CLAUDE_CODE_MAX_OUTPUT_TOKENS": str(target.output),
            "CLAUDE_CODE_ATTRIBUTION_HEADER": "0",  # no per-request billing line first in the system prompt
            "CLAUDE_CODE_DISABLE_NONESSENTIAL_TRAFFIC": "1",
            "DISABLE_TELEMETRY": "1",
            "DISABLE_ERROR_REPORTING": "1",
            "DISABLE_AUTOUPDATER": "1",
        }

    def launch(self, target: Target, folder: Path) -> Launch:
        return Launch(self.env(target))

    def user_files(self, target: Target) -> list[UserFile]:
        """Its settings.json `env` block, which it applies at every start."""
        path = Path(os.environ.get("CLAUDE_CONFIG_DIR") or "~/.claude").expanduser() / "settings.json"
        env = self.env(target)
        return [UserFile(path, json.dumps({"env": env}, indent=2), json_merge(path, lambda d: _update(d, "env", env)))]


class Codex(Program):
    name, binary, install = "codex", "codex", "npm install -g @openai/codex"
    KEY_ENV = "AGENT_MEMORY_API_KEY"  # the provider's env_key, when the server wants a key

    def provider(self, target: Target) -> dict[str, object]:
        provider: dict[str, object] = {"name": PROVIDER, "base_url": target.openai_url, "wire_api": "responses"}
        if target.api_key:
            provider["env_key"] = self.KEY_ENV
        return provider

    def settings(self, target: Target) -> dict[str, object]:
        return {
            "model": target.model,
            "model_provider": PROVIDER,
            "model_context_window": target.context,
            "model_auto_compact_token_limit": target.context * 9 // 10,
        }

    def launch(self, target: Target, folder: Path) -> Launch:
        inline = ", ".join(f"{k} = {json.dumps(v)}" for k, v in self.provider(target).items())
        overrides = [f"model_providers.{PROVIDER}={{{inline}}}", "check_for_update_on_startup=false"]
        overrides += [f"{k}={json.dumps(v)}" for k, v in self.settings(target).items()]
        overrides += ["analytics.enabled=false", "feedback.enabled=false"]
        return Launch(self.user_env(target), [arg for o in overrides for arg in ("-c", o)])

    def user_env(self, target: Target) -> dict[str, str]:
        return {self.KEY_ENV: target.api_key} if target.api_key else {}

    def user_files(self, target: Target) -> list[UserFile]:
        """A profile and its provider in config.toml: `codex --profile agent-memory`."""
        path = Path(os.environ.get("CODEX_HOME") or "~/.codex").expanduser() / "config.toml"
        tables = {f"profiles.{PROVIDER}": self.settings(target), f"model_providers.{PROVIDER}": self.provider(target)}
        return [UserFile(path, toml_tables(tables), toml_merge(path, tables))]

    def by_hand(self, target: Target) -> str:
        return f"codex --profile {PROVIDER}"


class OpenCode(Program):
    name, binary, install = "opencode", "opencode", "npm install -g opencode-ai"

    def provider(self, target: Target) -> dict:
        return {
            "npm": "@ai-sdk/openai-compatible",
            "name": PROVIDER,
            # setCacheKey: each session's id goes as its prompt cache key, the agent it is here
            "options": {"baseURL": target.openai_url, "apiKey": target.key_or_placeholder, "setCacheKey": True},
            "models": {target.model: {"name": target.model, "tool_call": True,
                                      "limit": {"context": target.context, "output": target.output}}},
        }

    def config(self, target: Target) -> dict:
        model = f"{PROVIDER}/{target.model}"
        return {"provider": {PROVIDER: self.provider(target)}, "model": model, "small_model": model}

    def launch(self, target: Target, folder: Path) -> Launch:
        """Its config in a file of launch's own (OPENCODE_CONFIG), merged by opencode over the
        user's: their own opencode.json is left alone."""
        path = folder / "opencode.json"
        config = {**self.config(target), "autoupdate": False, "share": "disabled"}
        env = {"OPENCODE_CONFIG": str(path), "OPENCODE_DISABLE_AUTOUPDATE": "1", "OPENCODE_DISABLE_MODELS_FETCH": "1"}
        return Launch(env, files={path: json.dumps(config, indent=2) + "\n"})

    def user_files(self, target: Target) -> list[UserFile]:
        path = Path(os.environ.get("XDG_CONFIG_HOME") or "~/.config").expanduser() / "opencode" / "opencode.json"
        config = self.config(target)

        def update(data: dict) -> None:
            _update(data, "provider", config["provider"])
            data.update(model=config["model"], small_model=config["small_model"])

        return [UserFile(path, json.dumps(config, indent=2), json_merge(path, update))]


def _update(data: dict, key: str, values: dict) -> None:
    """data[key] updated with values (made an object if it was none)."""
    if not isinstance(data.get(key), dict):
        data[key] = {}
    data[key].update(values)


class QwenCode(Program):
    name, binary, install = "qwen", "qwen", "npm install -g @qwen-code/qwen-code"

    def env(self, target: Target) -> dict[str, str]:
        return {
            "OPENAI_BASE_URL": target.openai_url,
            "OPENAI_API_KEY": target.key_or_placeholder,
            "OPENAI_MODEL": target.model,
        }

    def settings(self, target: Target) -> dict:
        return {
            "security": {"auth": {"selectedType": "openai"}},
            "model": {"name": target.model, "generationConfig": {"contextWindowSize": target.context}},
            "general": {"enableAutoUpdate": False},
            "privacy": {"usageStatisticsEnabled": False},
        }

    def launch(self, target: Target, folder: Path) -> Launch:
        """Its settings as system defaults (QWEN_CODE_SYSTEM_DEFAULTS_PATH), the layer below the
        user's and the project's own, which keep whatever they set."""
        path = folder / "system-defaults.json"
        env = {**self.env(target), "QWEN_CODE_SYSTEM_DEFAULTS_PATH": str(path)}
        return Launch(env, files={path: json.dumps(self.settings(target), indent=2) + "\n"})

    def user_env(self, target: Target) -> dict[str, str]:
        return self.env(target)

    def user_files(self, target: Target) -> list[UserFile]:
        path = Path("~/.qwen/settings.json").expanduser()
        settings = self.settings(target)

        def update(data: dict) -> None:
            _deep_update(data, settings)

        return [UserFile(path, json.dumps(settings, indent=2), json_merge(path, update))]


def _deep_update(data: dict, values: dict) -> None:
    for key, value in values.items():
        if isinstance(value, dict) and isinstance(data.get(key), dict):
            _deep_update(data[key], value)
        else:
            data[key] = value

"""The programs installed from PyPI: aider (litellm's `openai/` provider) and simonw's `llm`,
both on the chat-completions route."""

from __future__ import annotations

import json
import os
from pathlib import Path

import yaml

from agent_memory.cli.launch.config_files import UserFile, json_merge, yaml_keys_merge, yaml_list_merge
from agent_memory.cli.launch.programs import Launch, Program
from agent_memory.cli.launch.target import Target


class Aider(Program):
    name, binary, install = "aider", "aider", "python -m pip install aider-install && aider-install"

    def metadata(self, target: Target) -> dict:
        """litellm's model metadata: its context and output limit, so aider neither warns of an
        unknown model nor guesses them."""
        return {
            f"openai/{target.model}": {
                "max_input_tokens": target.context,
                "max_output_tokens": target.output,
                "max_tokens": target.output,
                "input_cost_per_token": 0.0,
                "output_cost_per_token": 0.0,
                "litellm_provider": "openai",
                "mode": "chat",
            }
        }

    def settings(self, target: Target, metadata: Path) -> dict[str, object]:
        return {
            "model": f"openai/{target.model}",
            "openai-api-base": target.openai_url,
            "openai-api-key": target.key_or_placeholder,
            "model-metadata-file": str(metadata),
            "check-update": False,
            "analytics": False,
        }

    def launch(self, target: Target, folder: Path) -> Launch:
        """aider's settings as its AIDER_* variables, which come before its .aider.conf.yml."""
        metadata = folder / "model-metadata.json"
        env = {f"AIDER_{k.upper().replace('-', '_')}": _text(v) for k, v in self.settings(target, metadata).items()}
        env["LITELLM_LOCAL_MODEL_COST_MAP"] = "True"  # litellm reads its price list from disk, not the network
        return Launch(env, files={metadata: json.dumps(self.metadata(target), indent=2) + "\n"})

    def user_env(self, target: Target) -> dict[str, str]:
        return {"LITELLM_LOCAL_MODEL_COST_MAP": "True"}

    def user_files(self, target: Target) -> list[UserFile]:
        """~/.aider.model.metadata.json (which aider reads from the home folder) and the
        settings in ~/.aider.conf.yml."""
        metadata = Path("~/.aider.model.metadata.json").expanduser()
        conf = Path("~/.aider.conf.yml").expanduser()
        entries = self.metadata(target)
        settings = self.settings(target, metadata)
        settings.pop("model-metadata-file")  # read from there anyway
        return [
            UserFile(metadata, json.dumps(entries, indent=2), json_merge(metadata, lambda d: d.update(entries))),
            UserFile(conf, yaml.safe_dump(settings, sort_keys=False), yaml_keys_merge(conf, settings)),
        ]


class Llm(Program):
    """llm reads its OpenAI-compatible models only from extra-openai-models.yaml in its user
    folder, beside its keys and logs: launch never moves that folder (the user's keys and logs
    would vanish from view), so the model's entry is written there once, with --write-config."""

    name, binary, install = "llm", "llm", "python -m pip install llm (or: pipx install llm, uv tool install llm)"

    def entry(self, target: Target) -> dict:
        entry = {"model_id": target.model, "model_name": target.model, "api_base": target.openai_url}
        if target.api_key:
            entry["headers"] = {"Authorization": f"Bearer {target.api_key}"}
        return {**entry, "supports_tools": True, "supports_schema": True}  # else llm refuses --schema itself

    def path(self) -> Path:
        import click

        user_dir = os.environ.get("LLM_USER_PATH") or click.get_app_dir("io.datasette.llm")
        return Path(user_dir).expanduser() / "extra-openai-models.yaml"

    def launch(self, target: Target, folder: Path) -> Launch:
        return Launch({"LLM_MODEL": target.model})  # its default model for `llm` and `llm chat`

    def user_files(self, target: Target) -> list[UserFile]:
        path, entry = self.path(), self.entry(target)
        return [UserFile(path, yaml.safe_dump([entry], sort_keys=False), yaml_list_merge(path, entry, "model_id"))]

    def user_env(self, target: Target) -> dict[str, str]:
        return {"LLM_MODEL": target.model}

    def missing(self, target: Target) -> str | None:
        path = self.path()
        try:
            entries = yaml.safe_load(path.read_text()) if path.exists() else None
        except (OSError, yaml.YAMLError) as e:
            return f"{path} cannot be read ({e})"
        if isinstance(entries, list) and self.entry(target) in entries:
            return None
        return f"llm reads its models only from {path}, which has no entry for {target.model} at {target.openai_url}"


def _text(value: object) -> str:
    return ("true" if value else "false") if isinstance(value, bool) else str(value)

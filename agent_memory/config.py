"""Settings: one model holds every setting's name, type, default and meaning.

Where a value comes from, first found wins: a command-line flag, the environment
(`AGENT_MEMORY_<NAME>`), the TOML config file (`~/.config/agent-memory/config.toml`,
`$XDG_CONFIG_HOME` respected, or the file `AGENT_MEMORY_CONFIG` names), the default here.
pydantic-settings reads the environment and the file and checks every value's type; the CLI
derives its flags from the same fields (cli/serve.py), so nothing is declared twice.
"""

from __future__ import annotations

import os
import re
from pathlib import Path
from typing import Annotated

from pydantic import Field, SecretStr, ValidationError, field_validator
from pydantic_settings import (
    BaseSettings,
    PydanticBaseSettingsSource,
    SettingsConfigDict,
    TomlConfigSettingsSource,
)

from agent_memory.keys_file import KeysFileError, is_loopback, read_api_keys
from agent_memory.setting_types import KVBits, Repeated, one_of

ENV_PREFIX = "AGENT_MEMORY_"


def default_cache_dir() -> Path:
    return Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache") / "agent-memory"


def config_file_path() -> Path:
    explicit = os.environ.get(ENV_PREFIX + "CONFIG")
    if explicit:
        return Path(explicit)
    return Path(os.environ.get("XDG_CONFIG_HOME") or Path.home() / ".config") / "agent-memory" / "config.toml"


class ConfigError(ValueError):
    """A setting is wrong; the message names it and where settings come from."""


class Settings(BaseSettings):
    model_config = SettingsConfigDict(env_prefix=ENV_PREFIX, extra="forbid", validate_default=True)

    model: Repeated = Field(
        ["demo"],
        min_length=1,
        description="Model to serve: a folder, a hub id, 'demo' (SmolLM2-135M, fetched on first use) or 'tiny'; "
        "NAME=MODEL serves it as NAME too. Give it again to serve several (loaded on demand, see "
        "docs/usage.md, 'Several models').",
    )
    keep_loaded: Repeated = Field(
        [],
        description="A served model's name that is never unloaded to make room for another, loaded at "
        "start (again for more) (default: only the first model loads at start, none is pinned).",
    )
    host: str = Field("127.0.0.1", description="Address to bind; anything but loopback needs --api-key.")
    port: int = Field(8000, ge=1, le=65535, description="Port to bind.")
    cache_dir: Path = Field(default_factory=default_cache_dir, description="Cache folder: models and the KV disk tier.")
    hot_budget_mb: int = Field(2048, ge=0, description="Memory for cached KV blocks, in MiB.")
    disk_budget_mb: int = Field(10240, ge=0, description="Disk for cached KV blocks, in MiB.")
    vision_cache_mb: int = Field(256, ge=0, description="Memory for recent images' vision features, by image (vision models: a repeated image runs no vision tower), in MiB.")
    responses_budget_mb: int | None = Field(None, ge=1, description="Disk (and memory) for stored Responses-API "
                                            "responses, shared fairly by the tenants, in MiB (default: a tenth of "
                                            "--disk-budget-mb, at least 16).")
    warm_store: str | None = Field(
        None,
        description="The warm tier in a Redis shared by several servers, redis://HOST:PORT/DB "
        "(default: the cache folder). Its maxmemory bounds it; see docs/scale-out.md.",
    )
    kv_bits: KVBits = Field(4, description="Precision cached KV cools to (exact while hot): 4, 8 or 16 (unquantized).")
    kv_group_size: Annotated[int, one_of(32, 64, 128)] = Field(
        64, description="Quantization group size for KV: 32, 64 or 128."
    )
    disk_kv_bits: KVBits | None = Field(None, description="KV precision on disk (default: --kv-bits).")
    decode_quantized: bool = Field(
        False, description="Running requests attend to quantized KV too (least memory; lower quality, slower on CPU)."
    )
    unload_idle_s: int | None = Field(
        None,
        ge=1,
        description="Unload a model idle this many seconds, its agents kept warm (default: only to make room "
        "for another; --keep-loaded models never).",
    )
    model_defaults: bool = Field(
        True,
        description="Sampling fields a request omits (temperature, top_p, top_k) come from the model's "
        "generation_config.json; off: temperature 1, top_p 1, no top_k.",
    )
    default_max_tokens: Repeated = Field(
        [],
        description="Most tokens a request that sends no limit generates (Codex sends none), so a model that "
        "does not stop cannot write to the end of its context: N for every model, NAME=N for one (again for "
        "more) (default: as many as the context has room for).",
    )
    speculation: Annotated[str, one_of("off", "lookup", "draft")] = Field(
        "lookup",
        description="Speculative decoding: 'lookup' proposes tokens from each request's own prompt and output "
        "and verifies them in the batch's forward pass (models with only plain attention layers), 'draft' "
        "has --draft-model propose them, or 'off'.",
    )
    draft_model: str | None = Field(
        None,
        description="A smaller model with the same tokenizer that proposes tokens for --speculation draft: a "
        "folder or a hub id (see docs/usage.md, 'Speculative decoding').",
    )
    max_batch: int = Field(32, ge=1, description="Most sequences decoded together (more wait to start).")
    distributed: Annotated[str, one_of("auto", "tensor", "pipeline")] = Field(
        "auto",
        description="Under mlx.launch, how the model is split over the processes: 'tensor' (each a slice of "
        "every layer's heads), 'pipeline' (each some of the layers) or 'auto' (tensor where the family allows).",
    )
    distributed_timeout: float = Field(
        120, gt=0, description="Under mlx.launch, the most seconds one exchange between the processes may wait "
        "before every process stops (a process alive but stuck).",
    )
    max_waiting: int = Field(
        128, ge=1, description="Most requests waiting for their first token; more are answered 503 with Retry-After."
    )
    max_images: int = Field(16, ge=1, description="Most images in one request's conversation (more are a 400).")
    max_image_mb: int = Field(10, ge=1, description="Most MiB of one image as sent (base64 decoded, or fetched).")
    # At most 2^27: below Pillow's own refusal (2 × 89,478,485 pixels), which chat/images.py words the same.
    max_image_pixels: int = Field(1 << 25, ge=1, le=1 << 27, description="Most pixels (width x height) of one "
                                  "image, read from its header: more (a decompression bomb) is refused undecoded.")
    image_urls: bool = Field(
        False,
        description="Fetch http(s) image URLs a request sends (off: only data: URLs and base64; a server that "
        "fetches URLs can be made to reach the operator's network).",
    )
    image_url_timeout_s: int = Field(10, ge=1, description="Most seconds to fetch one image URL (--image-urls).")
    memory_limit_mb: int | None = Field(
        None, ge=256, description="Memory for the model, cached KV and running requests, in MiB (default: 3/4 of RAM)."
    )
    api_key: SecretStr | None = Field(
        None, description="Require this key (Bearer or x-api-key) on every route but /health."
    )
    log_level: Annotated[str, one_of("debug", "info", "warning", "error")] = Field(
        "info", description="Log level: debug, info, warning or error."
    )
    log_format: Annotated[str, one_of("text", "json")] = Field(
        "text", description="Log lines as text, or as JSON objects for log collectors."
    )
    log_agent_ids: bool = Field(False, description="Show agent ids in request logs (hashed otherwise).")
    trace_file: Path | None = Field(
        None, description="Append where the engine's time goes to this file, one JSON line per event."
    )
    api_keys_file: Path | None = Field(
        None, description="A file of 'name key' lines: each key a tenant with its own agents and cached blocks."
    )
    warm_prompts: Path | None = Field(
        None,
        description="A file of system prompts and tool sets to compute once the model loads, one chat "
        "completions body without its user turn a line: shared heads every agent's first request reuses "
        "(see docs/usage.md, 'Warm prompts').",
    )
    seal_key_file: Path | None = Field(
        None,
        description="The secret (64 hex digits, mode 0600) that encrypts the reasoning clients send back "
        "(Responses' encrypted_content, Anthropic's thinking signatures); servers behind one router share "
        "one (default: <cache-dir>/seal.key, made at first start).",
    )

    @classmethod
    def settings_customise_sources(
        cls,
        settings_cls: type[BaseSettings],
        init_settings: PydanticBaseSettingsSource,
        env_settings: PydanticBaseSettingsSource,
        dotenv_settings: PydanticBaseSettingsSource,
        file_secret_settings: PydanticBaseSettingsSource,
    ) -> tuple[PydanticBaseSettingsSource, ...]:
        # Flags arrive as init arguments; the config file is looked up when settings are made.
        return init_settings, env_settings, TomlConfigSettingsSource(settings_cls, toml_file=config_file_path())

    @field_validator("cache_dir")
    @classmethod
    def expand_home(cls, v: Path) -> Path:
        return v.expanduser()

    @field_validator("default_max_tokens")
    @classmethod
    def output_limits(cls, v: list[str]) -> list[str]:
        for entry in v:
            if not OUTPUT_LIMIT.match(entry):
                raise ValueError(f"takes N or NAME=N, N a positive number of tokens, not '{entry}'")
        return v

    @field_validator("warm_store")
    @classmethod
    def redis_url(cls, v: str | None) -> str | None:
        from agent_memory.memory.warm.redis.url import check_url

        return check_url(v) if v else None

    @property
    def models_dir(self) -> Path:
        return self.cache_dir / "models"

    @property
    def seal_key_path(self) -> Path:
        """The operator's seal key file, or the one the server makes in its cache folder."""
        return self.seal_key_file or self.cache_dir / "seal.key"

    @property
    def memory_limit_bytes(self) -> int:
        if self.memory_limit_mb is not None:
            return self.memory_limit_mb << 20
        return os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES") * 3 // 4

    @property
    def responses_budget_bytes(self) -> int:
        if self.responses_budget_mb is not None:
            return self.responses_budget_mb << 20
        return max(self.disk_budget_mb << 20, 160 << 20) // 10

    @property
    def api_key_value(self) -> str | None:
        return self.api_key.get_secret_value() if self.api_key else None

    def tenant_keys(self) -> dict[str, str]:
        """Every accepted key -> its tenant ("" for --api-key: the shared namespace)."""
        try:
            keys = read_api_keys(self.api_keys_file) if self.api_keys_file else {}
        except KeysFileError as e:
            raise ConfigError(str(e)) from e
        if self.api_key:
            keys[self.api_key_value] = ""
        return keys

    def key_of(self, tenant: str) -> str | None:
        """A key of the tenant, for commands that talk to the running server for it."""
        return next((key for key, name in self.tenant_keys().items() if name == tenant), None)

    def describe(self) -> str:
        """Every effective setting on one line, for the start-up log (the key only as set/none)."""
        shown = {name: getattr(self, name) for name in type(self).model_fields}
        shown["api_key"] = "set" if self.api_key else "none"
        if self.warm_store:
            from agent_memory.memory.warm.redis.url import redact

            shown["warm_store"] = redact(self.warm_store)
        if self.api_keys_file:
            shown["api_keys_file"] = f"{self.api_keys_file} ({len(set(self.tenant_keys().values()))} tenants)"
        return " ".join(f"{name}={value}" for name, value in shown.items())

    def check_serve(self) -> None:
        """Combinations no single setting can refuse."""
        if not is_loopback(self.host) and not (self.api_key or self.api_keys_file):
            raise ConfigError(f"--host {self.host} is reachable from other machines: set --api-key too")
        self.tenant_keys()  # a broken keys file stops the start, with its line named
        if self.speculation == "draft" and not self.draft_model:
            raise ConfigError("--speculation draft needs --draft-model, the model that proposes the tokens")
        if self.draft_model and self.speculation != "draft":
            raise ConfigError(f"--draft-model is read only with --speculation draft (it is {self.speculation})")


def load_settings(**flags) -> Settings:
    """Settings from flags (None: not given), the environment, the config file and defaults."""
    try:
        return Settings(**{k: v for k, v in flags.items() if v is not None and v != []})
    except ValidationError as e:
        raise ConfigError(_explain(e)) from e
    except (OSError, ValueError) as e:  # an unreadable or malformed config file
        raise ConfigError(f"cannot read the config file {config_file_path()}: {e}") from e


def _explain(error: ValidationError) -> str:
    lines = []
    for err in error.errors():
        name = ".".join(str(p) for p in err["loc"]) or "settings"
        if err["type"] == "extra_forbidden":
            lines.append(f"unknown setting '{name}' (in {config_file_path()})")
        else:
            flag = "--" + name.replace("_", "-")
            msg = err["msg"].removeprefix("Value error, ")
            lines.append(f"{flag} (env {ENV_PREFIX}{name.upper()}, or '{name}' in the config file): {msg}")
    return "; ".join(lines)


OUTPUT_LIMIT = re.compile(r"^(?:(.+)=)?([1-9][0-9]*)$")  # --default-max-tokens: N or NAME=N

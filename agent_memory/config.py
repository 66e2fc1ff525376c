"""Server settings and where they come from: flag > env AGENT_MEMORY_* > config file > default.

The CLI resolves flags and environment (click does both); this module supplies the config
file layer and the defaults, and checks combinations that no single flag can.
"""

from __future__ import annotations

import ipaddress
import os
import tomllib
from dataclasses import dataclass, field, fields
from pathlib import Path

ENV_PREFIX = "AGENT_MEMORY_"


def default_cache_dir() -> Path:
    return Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache") / "agent-memory"


def config_file_path() -> Path:
    explicit = os.environ.get(ENV_PREFIX + "CONFIG")
    if explicit:
        return Path(explicit)
    return Path(os.environ.get("XDG_CONFIG_HOME") or Path.home() / ".config") / "agent-memory" / "config.toml"


class ConfigError(ValueError):
    pass


@dataclass(frozen=True)
class ServeSettings:
    model: str = "demo"
    host: str = "127.0.0.1"
    port: int = 8000
    cache_dir: Path = field(default_factory=default_cache_dir)
    hot_budget_mb: int = 2048
    disk_budget_mb: int = 10240
    kv_bits: int = 4  # cached KV at rest; running requests attend at full precision
    kv_group_size: int = 64
    disk_kv_bits: int | None = None  # None: the same as kv_bits
    decode_quantized: bool = False
    max_batch: int = 32
    api_key: str | None = None

    @property
    def models_dir(self) -> Path:
        return self.cache_dir / "models"

    def check(self) -> None:
        if self.kv_bits not in (4, 8, 16) or self.disk_kv_bits not in (None, 4, 8, 16):
            raise ConfigError("--kv-bits and --disk-kv-bits take 4, 8 or 16")
        if self.kv_group_size not in (32, 64, 128):
            raise ConfigError("--kv-group-size takes 32, 64 or 128")
        if self.max_batch < 1 or self.hot_budget_mb < 0 or self.disk_budget_mb < 0:
            raise ConfigError("--max-batch must be at least 1 and budgets not negative")
        if not is_loopback(self.host) and not self.api_key:
            raise ConfigError(f"--host {self.host} is reachable from other machines: set --api-key too")


def is_loopback(host: str) -> bool:
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host.strip("[]")).is_loopback
    except ValueError:
        return False


def read_config_file(path: Path | None = None) -> dict:
    """The `serve` settings of the TOML config file, keys as flag names with underscores."""
    path = path or config_file_path()
    if not path.is_file():
        return {}
    try:
        data = tomllib.loads(path.read_text())
    except (OSError, tomllib.TOMLDecodeError) as e:
        raise ConfigError(f"cannot read config file {path}: {e}") from e
    known = {f.name for f in fields(ServeSettings)}
    settings = {k.replace("-", "_"): v for k, v in data.items()}
    unknown = sorted(set(settings) - known)
    if unknown:
        raise ConfigError(f"{path}: unknown settings {', '.join(unknown)}")
    return settings

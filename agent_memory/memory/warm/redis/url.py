"""Redis URLs: which ones a server takes, how they show without a password, the client made
from one, and where a Redis shows in the `cache` commands' paths. Apart from the backends, so that
the settings check and redact a URL without loading one."""

from __future__ import annotations

from pathlib import PurePosixPath
from urllib.parse import urlsplit, urlunsplit

SCHEMES = ("redis", "rediss", "unix")
SOCKET_TIMEOUT_S = 2.0  # a command that waits this long for Redis fails
CONNECT_TIMEOUT_S = 1.0


class RedisPath(PurePosixPath):
    """A Redis key where the `cache` commands show a path: redis://host:port/db/key."""

    def __str__(self) -> str:
        text = super().__str__()
        return "redis:/" + text if text.startswith("/") else text


def check_url(url: str) -> str:
    """ValueError unless `url` is a Redis URL this server can use."""
    parts = urlsplit(url)
    if parts.scheme not in SCHEMES:
        raise ValueError(f"takes redis://HOST:PORT/DB (or rediss://, unix://), not {redact(url)!r}")
    if parts.scheme != "unix" and not parts.hostname:
        raise ValueError(f"names no host: {redact(url)!r}")
    return url


def redact(url: str) -> str:
    """The URL without its password, for logs, /health and `settings:`."""
    parts = urlsplit(url)
    if parts.password is None:
        return url
    netloc = parts.netloc.rsplit("@", 1)[1]
    user = f"{parts.username}:***@" if parts.username else ":***@"
    return urlunsplit(parts._replace(netloc=user + netloc))


def connect(url: str):
    """A client (a pool of connections, safe across threads). Failures surface per command, and
    soon: SOCKET_TIMEOUT_S without a byte from Redis is a failure (a hung Redis, dropped
    packets), and only a connection that broke is tried once more (a timeout is not: it would
    double the wait). The warm tier then skips Redis until it answers (memory/warm/watch.py)."""
    import redis
    from redis.backoff import ExponentialBackoff
    from redis.retry import Retry

    return redis.Redis.from_url(
        url,
        socket_timeout=SOCKET_TIMEOUT_S,
        socket_connect_timeout=CONNECT_TIMEOUT_S,
        health_check_interval=30,
        retry=Retry(ExponentialBackoff(cap=0.5, base=0.05), 1, supported_errors=(redis.ConnectionError,)),
    )


def store_root(url: str) -> RedisPath:
    """Where a Redis shows in paths: redis://host:port/db (no password)."""
    parts = urlsplit(url)
    if parts.scheme == "unix":
        return RedisPath("/" + parts.path.strip("/"))
    db = parts.path.strip("/") or "0"
    return RedisPath(f"/{parts.hostname}:{parts.port or 6379}/{db}")

"""One sample of a server's Prometheus /metrics, the one helper every test reads them with."""

from __future__ import annotations

import httpx


def metric(server, name: str, **labels: str) -> float:
    """The first sample of `name` whose labels include `labels` (0 when there is none)."""
    for line in httpx.get(server.base_url + "/metrics").text.splitlines():
        if not line.startswith(name):
            continue
        head, _, value = line.rpartition(" ")
        if head.split("{")[0] != name:
            continue
        if all(f'{k}="{v}"' in head for k, v in labels.items()):
            return float(value)
    return 0.0

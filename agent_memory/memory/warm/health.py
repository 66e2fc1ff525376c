"""/health's report of the warm tier: on (with a note where its disk caps its budget), degraded
(writes failing, a shared backend skipped because it does not answer: why), or off (why). It
reads what the tier's writer last saw and never asks the backend: /health runs on the event
loop. /health needs no key: it names no path (the start log says where the folder is)."""

from __future__ import annotations

import time

from agent_memory.memory.warm.tier import WarmTier


def warm_health(tier: WarmTier | None, why_off: str | None, budget_bytes: int) -> dict:
    """/health's `warm_tier` for a tier (None: off, for `why_off`) bounded by `budget_bytes`."""
    if tier is None:
        return {"status": "off", "reason": why_off or "no disk budget or cache folder"}
    if tier.shared:
        return _shared_health(tier)
    health = {"status": "on", "budget_bytes": budget_bytes, "failed_writes": tier.failed_jobs}
    if tier.write_error is not None:
        health.update(status="degraded", reason=_failing(tier))
    if tier.budget_note is not None:  # a disk smaller than the budget is a fact, not a fault
        health["note"] = tier.budget_note
    return health


def _shared_health(tier: WarmTier) -> dict:
    """A shared backend's figures as the writer last read them: Redis' memory against its
    maxmemory, and its eviction policy."""
    usage = tier.usage
    health = {
        "status": "on",
        "store": tier.location,
        "shared": True,
        "budget_bytes": usage.limit_bytes or 0,
        "used_bytes": usage.used_bytes,
        "policy": usage.policy,
        "failed_writes": tier.failed_jobs,
    }
    if tier.watch.skipped:
        since = time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(tier.watch.skipped_since))
        reason = f"did not answer ({tier.watch.reason}); skipped since {since}, requests are served from memory"
        health.update(status="degraded", reason=reason)
    elif tier.write_error is not None:
        health.update(status="degraded", reason=_failing(tier))
    elif usage.used_bytes is None and usage.note:
        health.update(status="degraded", reason=usage.note)
    elif usage.note:
        health["note"] = usage.note
    return health


def _failing(tier: WarmTier) -> str:
    since = time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(tier.write_error_since or time.time()))
    return f"{tier.write_error} (since {since}); requests are served from memory"

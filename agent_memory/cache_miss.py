"""Why part of a prompt was not reused: one `Miss` per request, found where the lookup happens
(memory/index/misses.py), carried in the engine's `Usage` and shown by every API's usage, the
access log, `/v1/agents/ID`, `/metrics` and the dashboard. No MLX: memory/, engine/ and api/ all
import it."""

from __future__ import annotations

import time
from dataclasses import dataclass, field

NONE = "none"  # nothing the memory held was missed: the rest of the prompt is new to it
NEW_CONVERSATION = "new_conversation"  # nothing of it known (at most a head others share)
REWRITTEN = "rewritten"  # the conversation's history differs from what the memory held, at `at`
EVICTED_HOT = "evicted_hot"  # its KV left memory for the hot budget, with no copy on disk
EVICTED_DISK = "evicted_disk"  # its copy on disk went for the disk budget (or was never written)
UNREADABLE = "unreadable"  # its copy on disk could not be read back
NO_SNAPSHOT = "no_snapshot"  # window/recurrent layers: no snapshot where the reuse could go on
ANOTHER_IMAGE = "another_image"  # the same tokens, another image's there (its digest: memory/hashing.py SpanKey)
ANOTHER_NAMESPACE = "another_namespace"  # the agent's memory is under another cache_salt
ANOTHER_MODEL = "another_model"  # unknown to this model; another model's warm folder holds the agent

# Every reason, in the order the docs list them; /metrics exports each but NONE from the start.
REASONS = (
    NONE, NEW_CONVERSATION, REWRITTEN, EVICTED_HOT, EVICTED_DISK, UNREADABLE, NO_SNAPSHOT,
    ANOTHER_IMAGE, ANOTHER_NAMESPACE, ANOTHER_MODEL,
)
EXCERPT_BEFORE, EXCERPT_AFTER = 8, 24  # tokens of text either side of a rewrite, in its excerpt


@dataclass(frozen=True)
class Miss:
    """Where the prompt left what the memory held (`at`, a token position) and why; `lost`: the
    tokens the memory held past `at` that this request did not reuse; `detail`: for a rewrite the
    memory's text and the prompt's around `at` (the agent's own tenant's only), for another image
    the two images' digests (never pixels), for another model the folder that holds the agent."""

    reason: str
    at: int
    lost: int = 0
    detail: dict[str, str] | None = None
    time: float = field(default_factory=time.time, compare=False)  # wall clock, for people

    def as_dict(self, with_detail: bool = True) -> dict:
        out = {"reason": self.reason, "at": self.at, "lost": self.lost}
        if with_detail and self.detail is not None:
            out["detail"] = dict(self.detail)
        return out

    def logged(self) -> str:
        """The access log's `miss=` field: no text, the log is the operator's, across tenants."""
        return f"{self.reason}@{self.at}" + (f"+{self.lost}" if self.lost else "")



def unreadable(planned: Miss | None, at: int, n: int) -> Miss | None:
    """A planned miss once a block it reused could not be read back: `n` tokens from `at` are
    computed again (with state layers the whole prompt: 0 and all it reused). A follow-up's miss
    (None) stays None."""
    if planned is None:
        return None
    return Miss(UNREADABLE, min(at, planned.at), planned.lost + n)


def usage_field(miss: Miss | None) -> dict:
    """Every API's usage extension, beside its cached tokens: `{"cache_miss": {reason, at, lost,
    detail?}}` (the request's own tenant's), or nothing for a request never planned."""
    return {"cache_miss": miss.as_dict()} if miss is not None else {}

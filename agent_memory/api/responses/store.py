"""Stored Responses-API responses: each one's conversation (the chain it continues, its input,
its output) and the response object, kept in memory and as one JSON file each under
`<cache-dir>/responses/`, written atomically by one writer thread.

Their KV is not here: a stored response is an agent-like record of the KV store (kind
"response", its id as the agent id), with a manifest in the warm tier like any agent, so a
continuation after a restart reads the prefix back from disk. The conversation is text, so it
outlives a change of model; only its KV is the model's. One whose conversation holds images
is kept in memory only (so it does not outlive a restart): no image is written to disk. The files take at most a budget
(`--responses-budget-mb`), shared fairly by the tenants: beyond it, the least recently used
response of the tenant holding the most bytes goes (file and KV record; fair_share.py, the KV
store's policy too), so a tenant holding no more than its fair share (the budget over the
tenants holding any) never loses one to another.
"""

from __future__ import annotations

import json
import logging
from collections import Counter, OrderedDict
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import asdict, dataclass, replace
from pathlib import Path

from agent_memory import files
from agent_memory.agent_key import AgentKey, agent_file_stem
from agent_memory.chat.conversation import Message, ToolCall
from agent_memory.fair_share import fair_order
from agent_memory.files import entries, unlink_regular

log = logging.getLogger(__name__)

MAX_FILE_BYTES = 64 << 20


def response_file(folder: Path, key: AgentKey) -> Path:
    """Where a stored response's conversation is kept (its KV is an agent of kind response)."""
    return folder / f"{agent_file_stem(key)}.json"


@dataclass
class StoredResponse:
    id: str
    tenant: str
    context: list[Message]  # what a continuation starts from (instructions excluded)
    body: dict  # the response object, as GET returns it

    @property
    def key(self) -> AgentKey:
        return AgentKey(self.id, self.tenant, "response")

    def to_bytes(self) -> bytes:
        context = [asdict(replace(m, parts=[])) for m in self.context]  # images are never written
        return json.dumps({"id": self.id, "tenant": self.tenant, "context": context, "body": self.body}).encode()

    @property
    def image_bytes(self) -> int:
        """The memory its images' pixels take (0: it holds none, and its file is all of it)."""
        return sum(3 * p.image.width * p.image.height for m in self.context for p in m.parts if not isinstance(p, str))

    @classmethod
    def from_bytes(cls, data: bytes) -> StoredResponse:
        raw = json.loads(data)
        context = [
            Message(
                m["role"], m["content"], [ToolCall(**c) for c in m["tool_calls"]], m["tool_call_id"], m.get("reasoning", "")
            )
            for m in raw["context"]
        ]
        return cls(str(raw["id"]), str(raw["tenant"]), context, dict(raw["body"]))


class ResponseStore:
    def __init__(self, folder: Path | None, budget_bytes: int, end_kv: Callable[[AgentKey], object]) -> None:
        """folder: where the files go (None: memory only); end_kv(key): forget a response's
        KV record (the engine's end_agent)."""
        self.folder = folder
        self.budget_bytes = budget_bytes
        self.end_kv = end_kv
        self._items: OrderedDict[AgentKey, tuple[StoredResponse, int]] = OrderedDict()  # least recent first
        self._bytes = 0
        self._held: Counter[str] = Counter()  # bytes by tenant
        self._writer = ThreadPoolExecutor(1, thread_name_prefix="responses-writer")

    def load(self) -> None:
        """Read the stored responses back (at start, off the event loop); unreadable files
        are logged and left out."""
        if self.folder is None:
            return
        found = []
        for entry, st in entries(self.folder):
            if not entry.name.endswith(".json") or st.st_size > MAX_FILE_BYTES:
                continue
            try:
                with files.open_regular(Path(entry.path)) as f:
                    stored = StoredResponse.from_bytes(f.read())
                if agent_file_stem(stored.key) != entry.name[:-5]:
                    raise ValueError("its id does not match its file name")
            except (OSError, ValueError, KeyError, TypeError) as e:
                log.warning("stored response %s unreadable (%s): left out", entry.name, e)
                continue
            found.append((st.st_mtime, stored, st.st_size))
        for _, stored, size in sorted(found, key=lambda f: f[0]):
            self._add(stored, size)
        if found:
            log.info("stored responses: %d (%.1f MiB)", len(found), self._bytes / (1 << 20))

    def get(self, tenant: str, response_id: str) -> StoredResponse | None:
        key = AgentKey(response_id, tenant, "response")
        item = self._items.get(key)
        if item is None:
            return None
        self._items.move_to_end(key)
        return item[0]

    def put(self, stored: StoredResponse) -> None:
        """Kept in memory and written to its file; one whose conversation holds images is kept
        in memory only (no image is ever written to disk), its pixels counted in the budget."""
        data = stored.to_bytes()
        images = stored.image_bytes
        self._add(stored, len(data) + images)
        if not images:
            self._write(stored.key, data)
        if self._bytes <= self.budget_bytes:
            return
        recency = {key: i for i, key in enumerate(self._items)}  # least recent first
        for victim in fair_order(list(self._items), self._size, recency.__getitem__, lambda key: key != stored.key):
            if self._bytes <= self.budget_bytes or victim.tenant != self._largest():
                break  # within budget, or the one just stored stays: the largest tenant's only one
            self._remove(victim)

    def delete(self, tenant: str, response_id: str) -> bool:
        key = AgentKey(response_id, tenant, "response")
        if key not in self._items:
            return False
        self._remove(key)
        return True

    def close(self) -> None:
        self._writer.shutdown(wait=True)

    def _add(self, stored: StoredResponse, size: int) -> None:
        self._items[stored.key] = (stored, size)
        self._bytes += size
        self._held[stored.tenant] += size

    def _size(self, key: AgentKey) -> int:
        """A response's bytes; 0 once it is gone."""
        item = self._items.get(key)
        return item[1] if item is not None else 0

    def _largest(self) -> str:
        """The tenant holding the most bytes (ties: the greater name, as fair_order breaks them)."""
        return max((t for t, held in self._held.items() if held), key=lambda t: (self._held[t], t))

    def _remove(self, key: AgentKey) -> None:
        _, size = self._items.pop(key)
        self._bytes -= size
        self._held[key.tenant] -= size
        self.end_kv(key)
        self._write(key, None)

    def _write(self, key: AgentKey, data: bytes | None) -> None:
        """Queue the file's write (or its deletion, for None), in order, off the event loop."""
        if self.folder is None:
            return
        path = response_file(self.folder, key)

        def run() -> None:
            try:
                if data is None:
                    unlink_regular(path)
                else:
                    self.folder.mkdir(mode=0o700, parents=True, exist_ok=True)
                    files.write_atomic(path, [data])
            except OSError as e:
                log.warning("stored response %s: %s", key.id, e)

        self._writer.submit(run)

"""What `rm` and `prune` change, and through whom: agents a folder's live server holds
(server.json) are ended through that server (server.py), never by deleting files it counts;
everything else is deleted by the warm tier's own admin operations (memory/warm/admin/operations.py), in
its one safe order (a manifest first). Nothing is deleted anywhere before every server involved
has answered."""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from pathlib import Path

from agent_memory.agent_key import RESPONSE, AgentKey
from agent_memory.api.responses.store import response_file
from agent_memory.cli.cache.server import LiveServer
from agent_memory.files import unlink_regular
from agent_memory.memory.warm.admin.operations import Prune, delete_agents, finish_prune, removed_by_server, still_unused
from agent_memory.memory.warm.admin.model_folder import ModelFolder
from agent_memory.memory.warm.format.records import Manifest

KeyOf = Callable[[str], str | None]  # the API key to speak for a tenant (the settings' keys)


def remove_agent(
    folder: ModelFolder, manifest: Manifest, key_of: KeyOf, responses_dir: Path
) -> tuple[list[str], int, str | None]:
    """Remove one agent and the block files only it used: through the folder's live server
    if there is one, else on disk; a stored response with its conversation (responses_dir).
    Returns the blocks removed, bytes freed and the server's URL."""
    private = folder.private_blocks(manifest)
    record = folder.layout.read_server_json()
    if record is not None:
        server = LiveServer(record, key_of, folder.name)
        if server.end_agent(manifest.key):
            return *removed_by_server(folder, [manifest], private), server.url
    removed = delete_agents(folder, [manifest], private)
    if manifest.key.kind == RESPONSE:
        with contextlib.suppress(FileNotFoundError):
            unlink_regular(response_file(responses_dir, manifest.key))
    return *removed, None


@dataclass
class Removal:
    """`rm`'s plan: the agents, by model folder, and what removing them frees. They go one at
    a time, so blocks that only they name go with the last of them that names each."""

    targets: dict[str, tuple[ModelFolder, list[Manifest]]] = field(default_factory=dict)

    @classmethod
    def of(cls, found: Iterable[tuple[ModelFolder, Manifest]]) -> Removal:
        plan = cls()
        for folder, manifest in found:
            plan.targets.setdefault(folder.folder, (folder, []))[1].append(manifest)
        return plan

    def preview(self) -> list[dict]:
        """Each agent as removing them in order would remove it (nothing is removed)."""
        agents = []
        for folder, manifests in self.targets.values():
            for i, manifest in enumerate(manifests):
                before = set(folder.blocks_only_of(manifests[:i]))
                own = [h for h in folder.blocks_only_of(manifests[: i + 1]) if h not in before]
                size = folder.layout.size_at(manifest.path)
                agents.append(_removed(folder, manifest, own, size + folder.bytes_of(own), None))
        return agents

    def kept_blocks(self) -> int:
        """Block files of these agents that other agents still use."""
        kept = 0
        for folder, manifests in self.targets.values():
            on_disk = {h for m in manifests for h in m.names if h in folder.files.blocks}
            kept += len(on_disk - set(folder.blocks_only_of(manifests)))
        return kept

    def execute(self, key_of: KeyOf, responses_dir: Path) -> list[dict]:
        """Remove the agents (`remove_agent` each, on a fresh scan of its folder)."""
        agents = []
        for folder, manifests in self.targets.values():
            for manifest in manifests:
                folder = folder.rescan()
                current = next((m for m in folder.files.manifests if m.key == manifest.key), None)
                if current is not None:  # else gone meanwhile (its server ended it)
                    removed, freed, server = remove_agent(folder, current, key_of, responses_dir)
                    agents.append(_removed(folder, current, removed, freed, server))
        return agents

    def report(self, agents: list[dict], dry_run: bool) -> dict:
        """The document `rm --format json` prints; `server`: the first server that ended one."""
        return {
            "dry_run": dry_run,
            "agents": agents,
            "removed_blocks": [h for a in agents for h in a["removed_blocks"]],
            "kept_shared_blocks": self.kept_blocks(),
            "freed_bytes": sum(a["freed_bytes"] for a in agents),
            "server": next((a["server"] for a in agents if a["server"]), None),
        }


def _removed(folder: ModelFolder, manifest: Manifest, blocks: list[str], freed: int, server: str | None) -> dict:
    return {
        "id": manifest.key.id,
        "tenant": manifest.key.tenant,
        "folder": folder.folder,
        "manifest": str(manifest.path),
        "removed_blocks": blocks,
        "freed_bytes": freed,
        "server": server,
    }


@dataclass
class PruneRun:
    """`prune` of one folder: the plan, and the folder's live server with the agents it holds."""

    plan: Prune
    server: LiveServer | None = None
    held: dict[AgentKey, float] = field(default_factory=dict)  # agents the server holds -> last use

    def connect(self, key_of: KeyOf) -> None:
        """Ask the folder's live server, if any, which agents it holds: before anything is
        deleted anywhere, so that a server that does not answer stops the whole prune."""
        record = self.plan.folder.layout.read_server_json() if self.plan.agents else None
        if record is not None:
            self.server = LiveServer(record, key_of, self.plan.folder.name)
            for tenant in sorted({m.key.tenant for m in self.plan.agents}):
                self.held.update({AgentKey(a, tenant): t for a, t in self.server.agents(tenant).items()})

    def execute(self, max_age: float | None, now: float) -> int:
        """Carry the plan out (after `connect`); the bytes freed."""
        old = [m for m in self.plan.agents if self._still_unused(m, max_age, now)] if max_age is not None else []
        ended = [m for m in old if self.server and m.key in self.held and self.server.end_agent(m.key)]
        return finish_prune(self.plan, old, ended)

    def _still_unused(self, manifest: Manifest, max_age: float, now: float) -> bool:
        """Asked again before deleting: the running server may have just used the agent."""
        if manifest.key in self.held:
            return now - self.held[manifest.key] > max_age
        return still_unused(self.plan.folder, manifest, max_age, now)

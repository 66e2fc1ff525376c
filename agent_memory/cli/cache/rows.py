"""The rows the `cache` commands list: one agent as `ls` shows it (and `--filter`/`--sort`
read it), one model folder as `stats` shows it."""

from __future__ import annotations

from dataclasses import dataclass

from agent_memory.agent_key import AGENT, RESPONSE, UNNAMED, AgentKey, key_label
from agent_memory.memory.warm.admin.model_folder import ModelFolder
from agent_memory.memory.warm.format.records import Manifest


@dataclass
class AgentRow:
    """One agent as `ls` shows it."""

    id: str
    model: str
    folder: str
    tokens: int
    blocks: int
    on_disk: int
    cold: int
    bytes: int
    last_used: float
    manifest: str  # "" for an agent only in its server's memory so far
    tenant: str = ""
    where: str = "disk"  # "disk"; "disk+server": its folder's running server holds it too; "server": only there
    kind: str = AGENT  # or UNNAMED: a conversation no request named (memory/index/conversations.py)

    @property
    def label(self) -> str:
        """Its id as listed: an unnamed conversation's marked `~`."""
        return key_label(AgentKey(self.id, self.tenant, self.kind))

    @classmethod
    def in_server(cls, folder: ModelFolder, agent: dict) -> AgentRow:
        """An agent the folder's running server holds that has no manifest on disk yet (the
        server's /v1/agents entry)."""
        blocks = agent["blocks"]
        return cls(
            id=agent["id"],
            model=folder.name,
            folder=folder.folder,
            tokens=agent["tokens"],
            blocks=sum(blocks.values()),
            on_disk=0,
            cold=blocks.get("cold", 0),
            bytes=0,
            last_used=agent["last_used"],
            manifest="",
            where="server",
            kind=agent.get("kind", AGENT),
        )

    @classmethod
    def of(cls, folder: ModelFolder, manifest: Manifest) -> AgentRow:
        on_disk = [h for h in manifest.blocks if h in folder.files.blocks]
        snapshots = [h for _, h in manifest.snapshots if h in folder.files.blocks]
        return cls(
            id=manifest.key.id,
            model=folder.name,
            folder=folder.folder,
            tokens=len(manifest.tokens),
            blocks=len(manifest.blocks),
            on_disk=len(on_disk),
            cold=len(manifest.blocks) - len(on_disk),
            bytes=folder.bytes_of(on_disk + snapshots),
            last_used=manifest.last_used,
            manifest=str(manifest.path),
            tenant=manifest.key.tenant,
            kind=manifest.key.kind,
        )


@dataclass
class FolderStats:
    """One model folder as `stats` shows it."""

    model: str
    folder: str
    agents: int
    stored_responses: int
    block_files: int
    bytes: int
    cold_blocks: int
    orphan_blocks: int
    quarantined_files: int
    quarantined_bytes: int
    temp_files: int

    @classmethod
    def of(cls, f: ModelFolder) -> FolderStats:
        files = f.files
        return cls(
            model=f.name,
            folder=f.folder,
            agents=sum(1 for m in files.manifests if m.key.kind in (AGENT, UNNAMED)),
            stored_responses=sum(1 for m in files.manifests if m.key.kind == RESPONSE),
            block_files=len(files.blocks),
            bytes=sum(i.size for i in files.blocks.values()),
            cold_blocks=sum(1 for h in f.users if h not in files.blocks),
            orphan_blocks=sum(1 for h in files.blocks if h not in f.users),
            quarantined_files=len(files.quarantined),
            quarantined_bytes=sum(i.size for i in files.quarantined),
            temp_files=len(files.temp_files),
        )

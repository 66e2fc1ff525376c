"""The server serving a model folder, asked to end agents instead of having its files deleted
under it.

A running server counts every block file it wrote and writes an agent it holds back to disk on
the agent's next turn, so deleting an agent's files behind its back frees nothing for long. A
server records itself in its folder (server.json: memory/warm/format/records.py); while that record names a
live process, `rm` and `prune --older-than` end agents with `DELETE /v1/agents/ID`, which
frees what only that agent held in every tier. A server that does not answer stops the command
before anything is deleted. httpx is imported only when a server is found.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING
from urllib.parse import quote

from agent_memory.agent_key import RESPONSE, AgentKey
from agent_memory.cli.common import fail
from agent_memory.config import ENV_PREFIX, config_file_path
from agent_memory.memory.warm.format.records import ServerRecord

if TYPE_CHECKING:
    import httpx

TIMEOUT_S = 30.0


class LiveServer:
    def __init__(self, record: ServerRecord, key_of: Callable[[str], str | None], model: str) -> None:
        """key_of(tenant): the API key to speak for a tenant (the settings' keys); model: the
        served model the folder is of (a server may serve several)."""
        self.record = record
        self.key_of = key_of
        self.model = model

    @property
    def url(self) -> str:
        return self.record.url

    def agents(self, tenant: str = "") -> dict[str, float]:
        """Every agent the server holds for a tenant -> its last use (wall clock). Also proves,
        before anything is deleted, that the server answers and takes the key."""
        return {a["id"]: float(a["last_used"]) for a in self.agent_list(tenant)}

    def agent_list(self, tenant: str = "") -> list[dict]:
        """The server's /v1/agents entries for a tenant (id, tokens, blocks by tier, last_used),
        of this folder's model."""
        response = self._request("GET", "/v1/agents", tenant)
        try:
            agents = [a for a in response.json()["data"] if a.get("model", self.model) == self.model]
            for a in agents:
                a["last_used"], a["tokens"] = float(a["last_used"]), int(a["tokens"])
            return agents
        except (ValueError, KeyError, TypeError) as e:
            fail(f"the server at {self.url} sent an agent list this command cannot read ({e})")

    def end_agent(self, agent: AgentKey) -> bool:
        """End the agent; False when the server does not hold it (then its files are not the
        server's: the caller deletes them itself)."""
        route = "/v1/responses/" if agent.kind == RESPONSE else "/v1/agents/"  # a response goes whole
        try:
            # Dots too: a client would resolve an id of ".." as a path segment.
            path = route + quote(agent.id, safe="").replace(".", "%2E")
            if agent.kind != RESPONSE:  # an agent of the folder's model; another model's is another agent
                path += "?model=" + quote(self.model, safe="")
        except UnicodeEncodeError:
            return False  # not valid Unicode: no request could have made this agent
        return self._request("DELETE", path, agent.tenant, missing_ok=True).status_code != 404

    def _request(self, method: str, path: str, tenant: str, missing_ok: bool = False) -> httpx.Response:
        import httpx

        key = self.key_of(tenant)
        headers = {"Authorization": f"Bearer {key}"} if key else {}
        try:
            response = httpx.request(method, self.url + path, headers=headers, timeout=TIMEOUT_S)
        except httpx.HTTPError as e:
            fail(
                f"the server serving this folder (pid {self.record.pid}, {self.url}) does not answer "
                f"({type(e).__name__}: {e}); nothing was deleted. If no agent-memory server runs there "
                f"any more, remove {self.record.path} and try again"
            )
        if response.status_code == 401:
            given = "the API key" if key else "a missing API key"
            fail(
                f"the server at {self.url} refused {given}: set {ENV_PREFIX}API_KEY or api_key in "
                f"{config_file_path()} to the server's key"
            )
        if response.is_success or (missing_ok and response.status_code == 404):
            return response
        fail(f"the server at {self.url} answered {method} {path} with {response.status_code}: {_message(response)}")


def _message(response: httpx.Response) -> str:
    try:
        return str(response.json()["error"]["message"])
    except (ValueError, KeyError, TypeError):
        return response.text[:200]

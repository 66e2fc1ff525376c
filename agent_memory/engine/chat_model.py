"""A chat model as loading makes it (weights.Loadable for BatchEngine): described at start
(tokenizer, layers: what the API needs, no weights), everything built at its first load
(parts.build, and the EngineCore that steps over it), then only the weights dropped and put
back: an unload cools the hot KV out of memory first (every block was written through to the
warm tier) and keeps the store and the warm tier, so the model's agents stay listed and
deletable and return warm. It also keeps the warm folder's server.json, which names the
server that holds the folder, once there is a folder."""

from __future__ import annotations

import itertools
import logging
from collections.abc import Callable

from agent_memory.engine.config import EngineConfig
from agent_memory.engine.core import EngineCore
from agent_memory.engine.loading.budget import weights_bytes
from agent_memory.engine.loading.loader import (
    ModelText,
    UnsupportedModelError,
    describe_model,
    draft_refusal,
)
from agent_memory.engine.loading.weights_files import weights_damage, weights_file_bytes
from agent_memory.engine.observability.metrics import Metrics
from agent_memory.engine.observability.trace import NoTrace
from agent_memory.engine.parts import Parts, build, reload_weights, unload_weights

log = logging.getLogger(__name__)


class ChatModel:
    def __init__(
        self,
        config: EngineConfig,
        metrics: Metrics,
        trace: NoTrace,
        ids: itertools.count,
        post: Callable[[Callable[[], None]], None],
    ) -> None:
        """What its EngineCore is handed: `ids` numbers requests, `post` runs a call on the engine thread."""
        self.config = config
        self.described: ModelText | None = None  # after `describe`
        self.parts: Parts | None = None  # after the first load
        self.core: EngineCore | None = None  # likewise
        self._metrics = metrics
        self._trace = trace
        self._ids = ids
        self._post = post
        self._url: str | None = None  # the server's, once announced

    def describe(self) -> ModelText:
        """The model's tokenizer and layers (its warm folder's name is its own: a NAME= moves
        no agent); a draft model that cannot propose for it is refused."""
        cfg = self.config
        self.described = describe_model(cfg.model_path, cfg.model_name, cfg.model_defaults)
        if cfg.draft_path is not None and (why := draft_refusal(cfg.draft_path, self.described)):
            raise UnsupportedModelError(f"--draft-model {cfg.draft_path}: {why}")
        return self.described

    # -- weights.Loadable ---------------------------------------------------------------

    def damage(self) -> str | None:
        return weights_damage(self.described.path) if self.described is not None else None

    def room_bytes(self) -> int:
        files = [self.described.path, self.config.draft_path]
        return sum(weights_file_bytes(f) for f in files if f is not None)

    def load(self, hot_bytes: int, working_bytes: int | None) -> int:
        """Built whole the first time, the weights alone after."""
        if self.parts is None:
            parts = self.parts = build(self.config, self.described, self._trace, hot_bytes, working_bytes)
            self.core = EngineCore(parts, self.config, self._metrics, self._trace, self._ids, self._post)
            if self.config.split is not None:
                from agent_memory.engine.distributed.channel import PlanChannel
                from agent_memory.engine.distributed.group import HEARTBEAT_S
                from agent_memory.engine.distributed.recorder import Recorder

                Recorder(PlanChannel(self.config.split.group, HEARTBEAT_S)).attach(self.core)
            features = parts.features if self.described.vision else None
            self._metrics.watch(parts.store, self.core.count, warm_on=parts.warm is not None, features=features)
            self._write_server_json()
        else:
            reload_weights(self.parts, self.config, self.described, working_bytes)
            self.parts.store.set_hot_budget(hot_bytes)
        return sum(weights_bytes(m) for m in (self.parts.loaded.model, self.parts.draft) if m is not None)

    def unload(self) -> None:
        """Its hot KV cools first (written through to the warm tier as it was made)."""
        self.parts.store.set_hot_budget(0)
        unload_weights(self.parts)

    def busy(self) -> bool:
        return self.core is not None and bool(self.core.seqs)

    def set_budgets(self, hot_bytes: int, working_bytes: int | None) -> None:
        hot_bytes, working_bytes = self.parts.shares.agreed(hot_bytes, working_bytes)
        self.parts.store.set_hot_budget(hot_bytes)
        self.parts.working_budget = working_bytes

    # -- the warm folder's server.json --------------------------------------------------

    def announce(self, url: str) -> None:
        """The server's address, written now or once the folder opens (a model loaded on demand)."""
        self._url = url
        self._write_server_json()

    def _write_server_json(self) -> None:
        warm = self.parts.warm if self.parts is not None else None
        if self._url is None or warm is None or warm.folder is None:  # a shared store records no server
            return
        try:
            warm.folder.write_server_json(self._url)
        except OSError as e:
            where = warm.folder.server_json
            log.warning("could not write %s (%s): `agent-memory cache` will not know this server", where, e)

    def remove_server_json(self) -> None:
        """Once the engine thread has stopped: the writer has flushed."""
        warm = self.parts.warm if self.parts is not None else None
        if warm is not None and warm.folder is not None:
            try:
                warm.folder.remove_server_json()
            except OSError as e:
                log.warning("could not remove %s: %s", warm.folder.server_json, e)

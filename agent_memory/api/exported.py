"""What /metrics exports: the process's own families once, then each served model's engine's.
With several models every sample of an engine carries a `model` label (its served id), so one
family holds them all; with one, the names and labels are as that engine exports them."""

from __future__ import annotations

from prometheus_client import CollectorRegistry, ProcessCollector
from prometheus_client.metrics_core import Metric

from agent_memory.engine.protocol import EngineClient


class ModelsCollector:
    """The engines' families, merged by name; each sample labelled with its model's id."""

    def __init__(self, engines: dict[str, EngineClient]) -> None:
        self.engines = engines

    def describe(self):
        return []

    def collect(self):
        if len(self.engines) == 1:
            yield from next(iter(self.engines.values())).metrics.collect()
            return
        families: dict[str, Metric] = {}
        for model_id, engine in self.engines.items():
            for family in engine.metrics.collect():
                merged = families.get(family.name)
                if merged is None:
                    merged = families[family.name] = Metric(family.name, family.documentation, family.type, family.unit)
                merged.samples += [s._replace(labels={**s.labels, "model": model_id}) for s in family.samples]
        yield from families.values()


def exported(engines: dict[str, EngineClient]) -> CollectorRegistry:
    registry = CollectorRegistry()
    ProcessCollector(registry=registry)  # process_resident_memory_bytes and friends: the server's
    registry.register(ModelsCollector(engines))
    return registry

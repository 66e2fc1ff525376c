"""The fair-share policy that keeps a budget shared by tenants: what goes first is the least
valued item of the tenant holding the most now, so the largest holders are levelled down and a
tenant holding no more than its fair share (the budget over the tenants holding any) loses
nothing while another holds more and has anything to give up. The KV store's eviction
(memory/index/eviction.py) and the stored responses (api/responses/store.py) both keep to it."""

from __future__ import annotations

import collections
from collections.abc import Callable, Iterable, Iterator
from typing import Protocol, TypeVar


class Held(Protocol):
    tenant: str


T = TypeVar("T", bound=Held)


def fair_order(
    held: Iterable[T],
    nbytes: Callable[[T], int],
    value: Callable[[T], float],
    movable: Callable[[T], bool] = lambda item: True,
) -> Iterator[T]:
    """The movable items of `held` (every item under the budget) in the order they should go:
    each next one the lowest-valued of the tenant holding the most bytes now, unmovable items
    counted (ties: the greater tenant name). The caller frees each item before asking for the
    next (its bytes are read again then: one that shrank but stayed comes again after its
    tenant's others), and stops when the budget is kept."""
    usage: collections.Counter[str] = collections.Counter()
    queues: dict[str, collections.deque[T]] = {}
    for item in sorted(held, key=value):
        usage[item.tenant] += nbytes(item)
        if movable(item):
            queues.setdefault(item.tenant, collections.deque()).append(item)
    while queues:
        tenant = max(queues, key=lambda t: (usage[t], t))
        item = queues[tenant].popleft()
        if not queues[tenant]:
            del queues[tenant]
        before = nbytes(item)
        yield item
        usage[tenant] -= before - nbytes(item)
        if 0 < nbytes(item) < before:
            queues.setdefault(tenant, collections.deque()).append(item)

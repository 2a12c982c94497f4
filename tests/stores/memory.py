"""The in-memory backend of anarchon_core.testing (in-process suites only: no URL)."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager

from anarchon_core.testing import MemoryBackend

from . import StoreHandle, StoreSpec


@contextmanager
def _open() -> Iterator[StoreHandle]:
    shared: dict[str, MemoryBackend] = {}

    def backend(ns: str) -> MemoryBackend:
        # Several backend objects of one namespace must see the same runs, as on a store.
        fresh = MemoryBackend()
        first = shared.setdefault(ns, fresh)
        if first is not fresh:
            fresh._runs = first._runs
            fresh._lock = first._lock
        return fresh

    def reader(ns: str) -> MemoryBackend:
        return shared.setdefault(ns, MemoryBackend()).reader()

    def set_lease(ns: str, job: str, slot: int, lease_until: float) -> None:
        shared[ns]._runs[(job, slot, False)][-1].lease_until = lease_until

    yield StoreHandle(backend=backend, reader=reader, set_lease=set_lease)


STORES = [StoreSpec("memory", leases=True, open=_open, multi_host=False,
                     persistent=False)]

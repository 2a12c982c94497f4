"""The registry of stores the contract suites run on.

Each module in this package describes one store with :class:`StoreSpec` objects in a
module-level ``STORES`` list. A spec opens (once per test session) a :class:`StoreHandle`
that makes backends in fresh namespaces, as objects for in-process tests and as URLs for
worker processes. Adding a backend to every contract suite is adding a module here.
"""

from __future__ import annotations

import importlib
import os
import pkgutil
from collections.abc import Callable, Iterator
from contextlib import AbstractContextManager
from dataclasses import dataclass
from typing import Any

import pytest

from anarchon_core.backend import Backend
from anarchon_core.url import backend_from_url

IN_CI = os.environ.get("CI", "").lower() in ("1", "true", "yes")


@dataclass
class StoreHandle:
    """A reachable store: makes backends (and URLs for subprocesses) per namespace."""

    backend: Callable[[str], Backend]
    url: Callable[[str], str] | None = None
    #: Writes the store-format record of a namespace (to test refusal of newer formats).
    set_format: Callable[[str, str], None] | None = None
    extra: Any = None
    #: A read-only backend of a namespace (default: the URL with ``read_only=true``).
    reader: Callable[[str], Backend] | None = None
    #: Lease stores: ``set_lease(ns, job, slot, lease_until_ms)`` overwrites the lease end of
    #: the running scheduled run ``(job, slot)`` with the store's own client (corrupt leases).
    set_lease: Callable[[str, str, int, float], None] | None = None

    def read_only(self, ns: str) -> Backend:
        """A backend of ``ns`` opened with ``read_only=True``."""
        if self.reader is not None:
            return self.reader(ns)
        assert self.url is not None, "a store needs a reader or a URL"
        url = self.url(ns)
        return backend_from_url(f"{url}{'&' if '?' in url else '?'}read_only=true")


@dataclass(frozen=True)
class StoreSpec:
    """One store the suites can run on."""

    id: str
    leases: bool
    open: Callable[[], AbstractContextManager[StoreHandle]]
    #: False for stores whose clock is not shared across machines (SQLite is per host).
    multi_host: bool = True
    #: False for a store that lives in one process (no URL, no format record).
    persistent: bool = True


def unavailable(what: str, why: str) -> None:
    """Skip loudly outside CI; fail under CI=true, where every service must be there."""
    message = f"{what} is not available: {why}"
    if IN_CI:
        pytest.fail(f"{message} (CI=true: a missing service is a failure)")
    pytest.skip(f"SKIPPED BECAUSE {message.upper()}")


def all_specs() -> list[StoreSpec]:
    """Every spec of every module in this package, in module order."""
    specs: list[StoreSpec] = []
    for info in sorted(pkgutil.iter_modules(__path__), key=lambda i: i.name):
        module = importlib.import_module(f"{__name__}.{info.name}")
        specs.extend(getattr(module, "STORES", []))
    return specs


def iter_ids(leases: bool | None = None) -> Iterator[str]:
    """The ids of the specs, filtered by lease capability."""
    for spec in all_specs():
        if leases is None or spec.leases == leases:
            yield spec.id

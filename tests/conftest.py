from __future__ import annotations

import contextlib
import uuid
from collections.abc import AsyncIterator, Callable, Iterator

import pytest

from anarchon_core.backend import Backend

from .stores import StoreHandle, StoreSpec, all_specs

_SPECS = {spec.id: spec for spec in all_specs()}
LEASE_IDS = [s.id for s in _SPECS.values() if s.leases]
PERSISTENT_LEASE_IDS = [s.id for s in _SPECS.values() if s.leases and s.persistent]
CLAIM_ONLY_IDS = [s.id for s in _SPECS.values() if not s.leases]


@pytest.fixture(scope="session")
def store_handles() -> Iterator[Callable[[str], StoreHandle]]:
    """Opens each store once per session, on first use, and closes them all at the end."""
    with contextlib.ExitStack() as stack:
        opened: dict[str, StoreHandle] = {}

        def get(store_id: str) -> StoreHandle:
            if store_id not in opened:
                opened[store_id] = stack.enter_context(_SPECS[store_id].open())
            return opened[store_id]

        yield get


def new_namespace() -> str:
    """A namespace no other test uses (valid as a table name and as a key prefix)."""
    return f"t{uuid.uuid4().hex[:12]}"


@pytest.fixture
def namespace() -> str:
    return new_namespace()


@pytest.fixture(params=LEASE_IDS)
def lease_store(request: pytest.FixtureRequest,
                store_handles: Callable[[str], StoreHandle]) -> tuple[StoreSpec, StoreHandle]:
    return _SPECS[request.param], store_handles(request.param)


@pytest.fixture(params=PERSISTENT_LEASE_IDS)
def persistent_lease_store(request: pytest.FixtureRequest,
                           store_handles: Callable[[str], StoreHandle]
                           ) -> tuple[StoreSpec, StoreHandle]:
    """A lease store reachable by URL from other processes, with a format record."""
    return _SPECS[request.param], store_handles(request.param)


@pytest.fixture(params=CLAIM_ONLY_IDS or [pytest.param(None, marks=pytest.mark.skip(
    reason="no claim-only store registered"))])
def claim_store(request: pytest.FixtureRequest,
                store_handles: Callable[[str], StoreHandle]) -> tuple[StoreSpec, StoreHandle]:
    return _SPECS[request.param], store_handles(request.param)


@pytest.fixture
async def lease_backend(lease_store: tuple[StoreSpec, StoreHandle],
                        namespace: str) -> AsyncIterator[Backend]:
    backend = lease_store[1].backend(namespace)
    await backend.start()
    try:
        yield backend
    finally:
        await backend.stop()


@pytest.fixture
async def claim_backend(claim_store: tuple[StoreSpec, StoreHandle],
                        namespace: str) -> AsyncIterator[Backend]:
    backend = claim_store[1].backend(namespace)
    await backend.start()
    try:
        yield backend
    finally:
        await backend.stop()

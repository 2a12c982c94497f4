"""Control records (``write_control``/``read_controls``): pausing and the fleet registry.

Every store that keeps them must give each namespace its own records, find them by name
prefix, let the last write win, delete on ``None``, keep any job name intact, and let a
read-only reader read them. Stores that cannot keep them say so with
``UnsupportedStrategyError`` naming the stores that can.
"""

from __future__ import annotations

import pytest

from anarchon_core import ReadOnlyError, UnsupportedStrategyError
from anarchon_core.backend import Backend

from ..conftest import new_namespace
from ..stores import StoreHandle, StoreSpec

pytestmark = pytest.mark.timeout(60)

ODD_NAMES = ["eu:sync", "{tag}%3A", "отчёт 08:00", "a" * 200]


async def test_records_are_set_overwritten_deleted_and_read_by_prefix(
        lease_backend: Backend) -> None:
    backend = lease_backend
    assert await backend.read_controls("paused:") == {}
    for name in ODD_NAMES:
        await backend.write_control(f"paused:{name}", f'{{"by": "{len(name)}"}}')
    await backend.write_control("instance:host:1", "v1")
    await backend.write_control("instance:host:1", "v2")
    paused = await backend.read_controls("paused:")
    assert paused == {f"paused:{n}": f'{{"by": "{len(n)}"}}' for n in ODD_NAMES}
    assert await backend.read_controls("instance:") == {"instance:host:1": "v2"}
    assert await backend.read_controls("paused:eu") == {"paused:eu:sync": '{"by": "7"}'}
    await backend.write_control("paused:eu:sync", None)
    await backend.write_control("paused:never-written", None)  # deleting nothing is fine
    assert "paused:eu:sync" not in await backend.read_controls("paused:")
    assert len(await backend.read_controls("")) == len(ODD_NAMES) - 1 + 1


async def test_namespaces_do_not_see_each_others_records(
        lease_store: tuple[StoreSpec, StoreHandle], namespace: str) -> None:
    ours, theirs = lease_store[1].backend(namespace), lease_store[1].backend(new_namespace())
    await ours.start()
    await theirs.start()
    try:
        await ours.write_control("paused:job", "ours")
        assert await theirs.read_controls("paused:") == {}
        await theirs.write_control("paused:job", "theirs")
        assert await ours.read_controls("paused:") == {"paused:job": "ours"}
    finally:
        await ours.stop()
        await theirs.stop()


async def test_a_read_only_reader_reads_records_and_refuses_to_write(
        persistent_lease_store: tuple[StoreSpec, StoreHandle], namespace: str) -> None:
    writer = persistent_lease_store[1].backend(namespace)
    await writer.start()
    reader = persistent_lease_store[1].read_only(namespace)
    await reader.start()
    try:
        await writer.write_control("paused:job", "x")
        assert await reader.read_controls("paused:") == {"paused:job": "x"}
        with pytest.raises(ReadOnlyError):
            await reader.write_control("paused:job", None)
    finally:
        await reader.stop()
        await writer.stop()


async def test_claim_only_stores_keep_records_or_say_which_stores_do(
        claim_store: tuple[StoreSpec, StoreHandle], namespace: str) -> None:
    backend = claim_store[1].backend(namespace)
    await backend.start()
    try:
        if claim_store[0].id.startswith("redis"):  # Redis keeps them whatever the strategy
            await backend.write_control("paused:job", "x")
            assert await backend.read_controls("paused:") == {"paused:job": "x"}
            return
        with pytest.raises(UnsupportedStrategyError,
                           match=r"need Redis/Valkey, PostgreSQL or SQLite$"):
            await backend.write_control("paused:job", "x")
        with pytest.raises(UnsupportedStrategyError, match="pausing jobs and the fleet view"):
            await backend.read_controls("paused:")
    finally:
        await backend.stop()

"""Expired fleet records: readers leave them alone, a running member deletes them."""

from __future__ import annotations

import asyncio

import pytest

from anarchon_core import Scheduler
from anarchon_core.fleet import INSTANCE, JOBS, InstanceInfo, encode_jobs

from ..stores import StoreHandle, StoreSpec

pytestmark = pytest.mark.timeout(60)


async def _ghost(scheduler: Scheduler) -> dict[str, str]:
    """Write the records of an instance that died 10 minutes ago without leaving."""
    backend = scheduler.backend
    now = await backend.clock_ms()
    info = InstanceInfo("ghost:1", "0.1.0", now - 700_000, now - 600_000, now - 570_000, 0)
    await backend.write_control(INSTANCE + "ghost:1", info.encode())
    await backend.write_control(JOBS + "ghost:1", encode_jobs([]))
    return await _records(scheduler)


async def _records(scheduler: Scheduler) -> dict[str, str]:
    backend = scheduler.backend
    found = {**await backend.read_controls(INSTANCE), **await backend.read_controls(JOBS)}
    return {k: v for k, v in found.items() if "ghost" in k}


async def test_reading_the_fleet_view_deletes_nothing(
        lease_store: tuple[StoreSpec, StoreHandle], namespace: str) -> None:
    reader = Scheduler(lease_store[1].backend(namespace))
    try:
        await reader.probe_store()
        written = await _ghost(reader)
        view = await reader.status()
        assert not view.instances
        assert await _records(reader) == written
    finally:
        await reader.stop()


async def test_a_running_member_sweeps_the_records_of_instances_gone_without_leaving(
        lease_store: tuple[StoreSpec, StoreHandle], namespace: str) -> None:
    scheduler = Scheduler(lease_store[1].backend(namespace), instance_id="sweeper:1")
    await scheduler.probe_store()
    assert len(await _ghost(scheduler)) == 2
    async with scheduler:
        for _ in range(100):  # the first registry refresh sweeps, at start
            if not await _records(scheduler):
                break
            await asyncio.sleep(0.1)
        assert not await _records(scheduler), "the expired records are still there"
        assert INSTANCE + "sweeper:1" in await scheduler.backend.read_controls(INSTANCE)

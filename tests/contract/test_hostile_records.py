"""Hostile or corrupt control records never switch a feature off, on every lease store.

Pause, instance and job-definition records are texts any client of the store can write (an
older or broken anarchon, a script, a person). One with a number out of range, a wrong
type or bad text is reported once at WARNING naming it and skipped; the fleet loop, the
paused jobs and the fleet view go on with the rest.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import time
from collections.abc import AsyncIterator

import pytest

from anarchon_core import Scheduler
from anarchon_core.backend import Backend
from anarchon_core.cli.main import main
from anarchon_core.fleet import PAUSE_REFRESH_S

from ..conftest import new_namespace
from ..stores import StoreHandle, StoreSpec

pytestmark = pytest.mark.timeout(90)

#: Pause records whose ``at`` (or whole text) cannot be read.
HOSTILE_PAUSES = {
    "inf": '{"by": "x", "at": 1e400}',
    "big": '{"by": "x", "at": 1000000000000000000000000000000}',
    "nan": '{"by": "x", "at": NaN}',
    "negative": '{"by": "x", "at": -5}',
    "text-at": '{"by": "x", "at": "abc"}',
    "list-by": '{"by": ["x"], "at": 1}',
    "not-an-object": "[1, 2]",
    "not-json": "\xff{",
}


def hostile_instances(now_ms: int, tag: str) -> dict[str, str]:
    """Instance records that cannot be read, and one live instance with hostile jobs."""
    future = now_ms + 600_000
    return {
        "instance:inf": json.dumps({"version": "1", "started": 1e400, "seen": now_ms,
                                    "expires": future}),
        "instance:big": json.dumps({"version": "1", "started": 10**30, "seen": now_ms,
                                    "expires": future}),
        "instance:jobs-text": json.dumps({"version": "1", "started": now_ms, "seen": now_ms,
                                          "expires": future, "jobs": "many"}),
        "instance:live": json.dumps({"version": "1", "started": now_ms, "seen": now_ms,
                                     "expires": future, "jobs": 3}),
        "jobs:live": json.dumps({
            "every-inf": {"schedule": "every ?", "digest": "a", "spec": {"every": 1e400}},
            "every-big": {"schedule": "every ?", "digest": "b", "spec": {"every": 10**30}},
            "offset-nan": {"schedule": "every ?", "digest": "c",
                           "spec": {"every": 1000, "offset": float("nan")}},
            "not-an-entry": [tag],
            "good": {"schedule": "every 1h", "digest": "d", "spec": {"every": 3_600_000}},
        }),
    }


@pytest.fixture
async def scheduler(lease_store: tuple[StoreSpec, StoreHandle],
                    namespace: str) -> AsyncIterator[Scheduler]:
    s = Scheduler(lease_store[1].backend(namespace), instance_id="tester")
    s.every("job", "1h", lambda ctx: None)
    await s.start()
    try:
        yield s
    finally:
        await s.stop()


async def write_hostile(backend: Backend, now_ms: int) -> None:
    # Each test's records differ (a record is reported once per process, whatever the store).
    tag = new_namespace()
    for name, text in {**HOSTILE_PAUSES, **hostile_instances(now_ms, tag)}.items():
        tagged = text
        if name.startswith("jobs:"):
            pass
        elif text.endswith("}"):
            tagged = f'{text[:-1]}, "tag": "{tag}"}}'
        elif text.endswith("]"):
            tagged = f'{text[:-1]}, "{tag}"]'
        else:
            tagged = text + tag
        await backend.write_control(name if ":" in name else f"paused:{name}", tagged)


def corrupt_warnings(caplog: pytest.LogCaptureFixture, key: str) -> int:
    return sum(1 for r in caplog.records if r.levelno == logging.WARNING
               and "corrupt record" in r.getMessage() and key in r.getMessage())


async def test_hostile_records_never_stop_the_fleet_loop(
        scheduler: Scheduler, caplog: pytest.LogCaptureFixture) -> None:
    with caplog.at_level(logging.WARNING, logger="anarchon"):
        await write_hostile(scheduler.backend, round(time.time() * 1000))
        await asyncio.sleep(PAUSE_REFRESH_S * 2.5)  # the loop meets them at least twice
        # The loop still honours pauses written after the hostile records.
        await scheduler.backend.write_control("paused:job", '{"by": "ops", "at": 1}')
        for _ in range(round(10 * PAUSE_REFRESH_S / 0.1)):
            if "job" in scheduler._fleet.paused:
                break
            await asyncio.sleep(0.1)
        assert scheduler._fleet.paused.get("job") is not None, "the fleet loop died"
        assert scheduler._fleet.paused["job"].by == "ops"
    for name in HOSTILE_PAUSES:
        # A corrupt pause record still pauses its job (the safe side).
        assert scheduler._fleet.paused[name].by == "?"
        assert corrupt_warnings(caplog, f"paused:{name}") == 1, name
    assert not [r for r in caplog.records if r.levelno >= logging.ERROR]


async def test_paused_and_status_skip_hostile_records(
        scheduler: Scheduler, caplog: pytest.LogCaptureFixture) -> None:
    await scheduler.backend.write_control("paused:fine", '{"by": "ops", "at": 5, "reason": "x"}')
    with caplog.at_level(logging.WARNING, logger="anarchon"):
        await write_hostile(scheduler.backend, round(scheduler._now_ms()))
        paused = await scheduler.paused()
        view = await scheduler.status()
        await scheduler.status()
        text = view.format()
    assert (paused["fine"].by, paused["fine"].reason) == ("ops", "x")
    assert set(paused) == {"fine", *HOSTILE_PAUSES}
    ids = {i.instance_id for i in view.instances}
    assert "live" in ids
    assert not ids & {"inf", "big", "jobs-text"}
    jobs = {j.name: j for j in view.jobs}
    assert jobs["good"].next_slot is not None
    assert jobs["good"].next_slot % 3_600_000 == 0
    for name in ("every-inf", "every-big", "offset-nan"):
        assert jobs[name].next_slot is None, name  # shown, its next slot unknown
    assert "not-an-entry" not in jobs
    assert "job" in jobs
    assert "live" in text
    for key in ("instance:inf", "instance:big", "instance:jobs-text"):
        assert corrupt_warnings(caplog, key) == 1, key
    assert corrupt_warnings(caplog, "jobs:live") == 1  # the entry that is not one
    # Unreadable records are not deleted: they may be a newer anarchon's.
    assert "instance:inf" in await scheduler.backend.read_controls("instance:")


async def test_anarchon_status_reads_a_store_with_hostile_records(
        persistent_lease_store: tuple[StoreSpec, StoreHandle], namespace: str,
        capsys: pytest.CaptureFixture[str]) -> None:
    handle = persistent_lease_store[1]
    assert handle.url is not None
    backend = handle.backend(namespace)
    await backend.start()
    try:
        await write_hostile(backend, round(time.time() * 1000))
        await backend.write_control("paused:fine", '{"by": "ops", "at": 5}')
    finally:
        await backend.stop()
    with contextlib.suppress(SystemExit):
        code = await asyncio.to_thread(main, ["status", "--backend", handle.url(namespace)])
    out, err = capsys.readouterr()
    assert code == 0, err
    for name in ("live", "fine", "good"):
        assert name in out
    assert "Overflow" not in out + err

"""Events for listeners, and the Prometheus and OpenTelemetry metrics built on them."""

from __future__ import annotations

import asyncio
import functools
import logging
from pathlib import Path
from typing import Any

import pytest
from opentelemetry.sdk.metrics import MeterProvider
from opentelemetry.sdk.metrics.export import InMemoryMetricReader
from prometheus_client import CollectorRegistry

from anarchon_core import (
    ClaimHandle,
    ConfigError,
    Event,
    EventKind,
    JobContext,
    LeaseLost,
)
from anarchon_core.metrics.otel import OpenTelemetryMetrics
from anarchon_core.metrics.prometheus import PrometheusMetrics
from anarchon_core.testing import MemoryBackend

from .support.clock import LoopClock
from .support.helpers import QUICK_LEASE, await_until, make_scheduler

pytestmark = pytest.mark.timeout(60)


make = functools.partial(make_scheduler, **QUICK_LEASE)



def kinds(events: list[Event]) -> list[str]:
    return [e.kind.value for e in events]


@pytest.mark.looptime
async def test_won_taken_takeover_and_fenced_arrive_in_order() -> None:
    clock = LoopClock()  # virtual time: the lease's expiry and the takeover take none
    store = MemoryBackend(clock.store_ms)
    runner, backup = make(store, "runner", clock=clock), make(store, "backup", clock=clock)
    seen: list[Event] = []
    runner.add_listener(seen.append)
    backup.add_listener(seen.append)
    taken_over: list[ClaimHandle] = []

    async def take_over(handle: ClaimHandle) -> None:
        taken_over.append(handle)
        await handle.finish("success")

    for scheduler in (runner, backup):
        scheduler.define("report", on_takeover=take_over if scheduler is backup else None)
        await scheduler.start()
    try:
        # 100 ms ago by the scheduler's clock (the store's: a local reading can be behind
        # it by a fraction of a millisecond).
        slot = int(runner._now_ms()) - 100
        handle = await runner.claim("report", slot)
        assert handle is not None
        assert not await backup.try_claim("report", slot)  # running: backup watches it
        handle.abandon()  # the runner hangs: no more heartbeats
        await await_until(lambda: taken_over, 10, "the backup to take over")
        with pytest.raises(LeaseLost):
            await handle.check_lease()
    finally:
        await backup.stop()
        await runner.stop()
    story = [(e.instance, e.kind.value, e.attempt) for e in seen
             if e.kind not in (EventKind.STORE_CALL, EventKind.CLOCK_OFFSET)]
    assert story == [("runner", "claim_won", 1), ("backup", "claim_taken", 1),
                     ("backup", "takeover", 2), ("runner", "fenced", 1)], story
    taken = next(e for e in seen if e.kind is EventKind.CLAIM_TAKEN)
    assert (taken.job, taken.slot, taken.outcome) == ("report", slot, "running")
    fenced = next(e for e in seen if e.kind is EventKind.FENCED)
    # abandon() stopped the heartbeats: the runner fences itself before any backup starts.
    assert fenced.reason == "lease not confirmed in time"
    won = next(e for e in seen if e.kind is EventKind.CLAIM_WON)
    assert won.lateness_ms is not None
    assert 100 <= won.lateness_ms < 101  # claimed at once: no time passes on the loop


async def test_attempts_and_hand_over_are_reported_with_their_outcome(tmp_path: Path) -> None:
    scheduler = make(tmp_path, "one", stop_grace_ms=0)
    seen: list[Event] = []
    scheduler.add_listener(seen.append, kinds=["attempt_started", EventKind.ATTEMPT_ENDED,
                                               "handed_over"])
    started = asyncio.Event()

    @scheduler.every("fails", "1h")
    def fails(ctx: JobContext) -> None:
        raise RuntimeError("boom")

    @scheduler.every("slow", "1h")
    async def slow(ctx: JobContext) -> None:
        started.set()
        await asyncio.sleep(30)

    failed = await scheduler.run_now("fails")
    assert failed.status == "failed"
    await scheduler.start()
    task = asyncio.ensure_future(scheduler.run_now("slow"))
    await asyncio.wait_for(started.wait(), 10)
    await scheduler.stop()
    await asyncio.wait_for(task, 10)
    assert kinds(seen) == ["attempt_started", "attempt_ended", "attempt_started",
                           "handed_over", "attempt_ended"]
    ended = seen[1]
    assert (ended.job, ended.status, ended.manual) == ("fails", "failed", True)
    assert ended.error == "RuntimeError: boom"
    assert ended.duration_ms is not None
    assert ended.duration_ms >= 0
    assert seen[-1].status == "interrupted"


async def test_a_failing_listener_is_logged_and_the_others_still_run(
        tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    scheduler = make(tmp_path, "one")
    got: list[str] = []
    async_got: list[str] = []

    def broken(event: Event) -> None:
        raise ValueError("listener bug")

    async def later(event: Event) -> None:
        await asyncio.sleep(0)
        async_got.append(event.kind.value)

    scheduler.add_listener(broken)
    scheduler.add_listener(lambda e: got.append(e.kind.value))
    scheduler.add_listener(later, kinds=["attempt_ended"])

    @scheduler.every("ok", "1h")
    def ok(ctx: JobContext) -> None:
        pass

    with caplog.at_level(logging.ERROR, logger="anarchon.events"):
        run = await scheduler.run_now("ok")
        await await_until(lambda: async_got, 5, "the coroutine listener")
    assert run.status == "success"
    assert "attempt_started" in got
    assert "attempt_ended" in got
    assert async_got == ["attempt_ended"]
    assert any("listener bug" in (r.exc_text or "") or "failed on" in r.getMessage()
               for r in caplog.records)
    assert scheduler.remove_listener(broken) is True
    assert scheduler.remove_listener(broken) is False
    await scheduler.stop()


def test_bad_listeners_and_kinds_are_refused(tmp_path: Path) -> None:
    scheduler = make(tmp_path, "one")
    with pytest.raises(ConfigError, match="not callable"):
        scheduler.add_listener("print")  # type: ignore[arg-type]
    with pytest.raises(ConfigError, match="invalid event kind 'claim_wonn'"):
        scheduler.add_listener(print, kinds=["claim_wonn"])


def sample(registry: CollectorRegistry, name: str, **labels: str) -> float:
    value = registry.get_sample_value(name, labels)
    return 0.0 if value is None else value


async def test_prometheus_and_opentelemetry_count_runs_claims_and_store_calls(
        tmp_path: Path) -> None:
    registry = CollectorRegistry()
    prometheus = PrometheusMetrics(registry)
    reader = InMemoryMetricReader()
    otel = OpenTelemetryMetrics(MeterProvider(metric_readers=[reader]))
    scheduler = make(tmp_path, "one")
    scheduler.add_listener(prometheus)
    scheduler.add_listener(otel)
    runs: list[int] = []

    @scheduler.every("tick", "200ms", jitter_ms=0)
    def tick(ctx: JobContext) -> None:
        runs.append(ctx.slot)
        if len(runs) == 2:
            raise RuntimeError("second run fails")

    await scheduler.start()
    await await_until(lambda: len(runs) >= 3, 10, "three runs")
    await scheduler.stop()
    assert sample(registry, "anarchon_runs_total", job="tick", status="success") >= 2
    assert sample(registry, "anarchon_runs_total", job="tick", status="failed") == 1
    assert sample(registry, "anarchon_claims_total", job="tick", outcome="won") >= 3
    assert sample(registry, "anarchon_start_lateness_seconds_count", job="tick") >= 3
    assert sample(registry, "anarchon_run_duration_seconds_count", job="tick",
                  status="failed") == 1
    assert sample(registry, "anarchon_running_attempts", job="tick") == 0
    assert sample(registry, "anarchon_store_call_duration_seconds_count", call="claim") >= 3
    assert sample(registry, "anarchon_store_up") == 1
    assert registry.get_sample_value("anarchon_clock_offset_seconds") is not None

    data = reader.get_metrics_data()
    points: dict[str, list[Any]] = {}
    for resource in data.resource_metrics:
        for scope in resource.scope_metrics:
            for metric in scope.metrics:
                points[metric.name] = list(metric.data.data_points)
    failed = [p for p in points["anarchon_runs"] if p.attributes["status"] == "failed"]
    assert [p.value for p in failed] == [1]
    assert sum(p.count for p in points["anarchon_start_lateness"]) >= 3
    assert [p.value for p in points["anarchon_store_up"]] == [1.0]


def test_one_registry_takes_one_prometheus_exporter() -> None:
    registry = CollectorRegistry()
    PrometheusMetrics(registry)
    with pytest.raises(ConfigError, match="one PrometheusMetrics per registry"):
        PrometheusMetrics(registry)

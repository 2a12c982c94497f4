"""One log line when the store becomes unreachable, one when it is back (StoreHealth)."""

from __future__ import annotations

import logging

import pytest

from anarchon_core import EventKind
from anarchon_core.events import Event, EventBus
from anarchon_core.health import SETTLE_S, StoreHealth
from tests.support.clock import FakeClock


@pytest.fixture
def clock() -> FakeClock:
    return FakeClock()


def lines(caplog: pytest.LogCaptureFixture) -> list[str]:
    return [r.getMessage() for r in caplog.records if r.levelno >= logging.WARNING]


def test_an_outage_is_two_lines_whatever_the_number_of_calls(
        clock: FakeClock, caplog: pytest.LogCaptureFixture) -> None:
    bus = EventBus("h:1")
    events: list[Event] = []
    bus.add(events.append, kinds=["store_error", "store_recovered"])
    recovered: list[list[tuple[str, int]]] = []
    health = StoreHealth(bus, "Store(x)", on_recovered=recovered.append, clock=clock)
    error = ConnectionError("refused")
    with caplog.at_level(logging.DEBUG, logger="anarchon.store"):
        assert health.failed("claim", error) is True
        for n in range(500):
            clock.advance(0.05)
            assert health.failed("heartbeat", error) is False
            if n % 10 == 0:
                assert health.slot_missed("tick", n * 1000)
        clock.advance(5)
        health.succeeded("claim")
        health.succeeded("claim")
    assert lines(caplog) == [
        "store Store(x) unreachable (claim: refused); calls are retried, the next line "
        "comes when it answers again",
        "store Store(x) reachable again after 30.0 s (501 call(s) failed; 50 slot(s) not "
        "run meanwhile: tick ×50)"]
    assert [e.kind for e in events] == [EventKind.STORE_ERROR, EventKind.STORE_RECOVERED]
    assert recovered == [[("tick", n * 1000) for n in range(0, 500, 10)]]
    assert not health.down
    assert health.slot_missed("tick", 1) is False  # up again: the caller logs it


def test_stale_connections_failing_right_after_recovery_stay_quiet_unless_it_lasts(
        clock: FakeClock, caplog: pytest.LogCaptureFixture) -> None:
    health = StoreHealth(EventBus("h:1"), "Store(x)", clock=clock)
    error = ConnectionError("closed")
    with caplog.at_level(logging.DEBUG, logger="anarchon.store"):
        health.failed("claim", error)
        clock.advance(20)
        health.succeeded("claim")
        clock.advance(1)
        health.failed("expired_runs", error)  # a pooled connection of the outage
        clock.advance(0.1)
        health.succeeded("claim")
        assert len(lines(caplog)) == 2
        clock.advance(2)
        health.failed("claim", error)  # still settling: quiet for now...
        clock.advance(SETTLE_S + 0.5)
        health.failed("claim", error)  # ...but it lasts: a real outage, said once
        health.failed("claim", error)
    assert len(lines(caplog)) == 3
    assert lines(caplog)[-1].startswith("store Store(x) unreachable (claim: closed)")

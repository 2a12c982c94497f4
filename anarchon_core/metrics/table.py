"""Which metric each event feeds: one table for every exporter."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Literal

from ..events import Event, EventKind

__all__ = ["METRICS", "MetricSpec", "MetricsListener"]

Kind = Literal["counter", "histogram", "gauge", "updown"]


@dataclass(frozen=True)
class MetricSpec:
    """One metric: its name (without unit suffixes), kind, labels and meaning."""

    name: str
    kind: Kind
    labels: tuple[str, ...]
    description: str
    unit: str = ""


#: Every metric the exporters publish. Times are in seconds.
METRICS: Mapping[str, MetricSpec] = {m.name: m for m in (
    MetricSpec("anarchon_runs", "counter", ("job", "status"),
               "Attempts that ended on this instance, by job and status"),
    MetricSpec("anarchon_claims", "counter", ("job", "outcome"),
               "Claim answers by job and outcome (won, takeover, taken, running, done, "
               "overlap, late, early)"),
    MetricSpec("anarchon_start_lateness", "histogram", ("job",),
               "Handler start minus slot, by the store's clock", "seconds"),
    MetricSpec("anarchon_run_duration", "histogram", ("job", "status"),
               "Handler run time of ended attempts", "seconds"),
    MetricSpec("anarchon_running_attempts", "updown", ("job",),
               "Attempts whose handler runs on this instance now"),
    MetricSpec("anarchon_takeovers", "counter", ("job",),
               "Runs this instance took over from a runner that was gone"),
    MetricSpec("anarchon_fenced", "counter", ("job",),
               "Attempts on this instance that lost their lease"),
    MetricSpec("anarchon_handovers", "counter", ("job",),
               "Runs this instance handed over (lease ended early on stop)"),
    MetricSpec("anarchon_store_call_duration", "histogram", ("call",),
               "Store calls by kind (claim, heartbeat, finish, release, clock...)", "seconds"),
    MetricSpec("anarchon_store_errors", "counter", ("call",),
               "Store calls that failed (unreachable, timed out)"),
    MetricSpec("anarchon_store_up", "gauge", (),
               "1 while the store answers, 0 from a failed call until the next success"),
    MetricSpec("anarchon_clock_offset", "gauge", (),
               "Store clock minus this instance's clock", "seconds"),
)}

_CLAIM_KINDS = {EventKind.CLAIM_WON, EventKind.TAKEOVER, EventKind.CLAIM_TAKEN,
                EventKind.CLAIM_SKIPPED, EventKind.LATE, EventKind.EARLY}


class MetricsListener:
    """Turns events into metric updates; exporters implement the three updates.

    ``inc``, ``observe`` and ``set`` receive a name from :data:`METRICS` and the label
    values in the order the spec lists them.
    """

    def __call__(self, event: Event) -> None:
        """Update the metrics an event feeds."""
        kind, job = event.kind, event.job or ""
        if kind in _CLAIM_KINDS:
            outcome = "takeover" if kind is EventKind.TAKEOVER else (event.outcome or kind.value)
            self.inc("anarchon_claims", (job, outcome))
            if kind is EventKind.TAKEOVER:
                self.inc("anarchon_takeovers", (job,))
        elif kind is EventKind.ATTEMPT_STARTED:
            self.inc("anarchon_running_attempts", (job,))
            if event.lateness_ms is not None and not event.manual:
                self.observe("anarchon_start_lateness", (job,), event.lateness_ms / 1000)
        elif kind is EventKind.ATTEMPT_ENDED:
            status = event.status or "unknown"
            self.inc("anarchon_running_attempts", (job,), -1)
            self.inc("anarchon_runs", (job, status))
            if event.duration_ms is not None:
                self.observe("anarchon_run_duration", (job, status), event.duration_ms / 1000)
        elif kind is EventKind.FENCED:
            self.inc("anarchon_fenced", (job,))
        elif kind is EventKind.HANDED_OVER:
            self.inc("anarchon_handovers", (job,))
        elif kind is EventKind.STORE_CALL:
            call = event.call or ""
            if event.duration_ms is not None:
                self.observe("anarchon_store_call_duration", (call,), event.duration_ms / 1000)
            if event.error is not None:
                self.inc("anarchon_store_errors", (call,))
        elif kind is EventKind.STORE_ERROR:
            self.set("anarchon_store_up", (), 0.0)
        elif kind is EventKind.STORE_RECOVERED:
            self.set("anarchon_store_up", (), 1.0)
        elif kind is EventKind.CLOCK_OFFSET and event.offset_ms is not None:
            self.set("anarchon_clock_offset", (), event.offset_ms / 1000)

    def inc(self, name: str, labels: tuple[str, ...], amount: float = 1.0) -> None:
        """Add ``amount`` to a counter or up-down counter."""
        raise NotImplementedError

    def observe(self, name: str, labels: tuple[str, ...], value: float) -> None:
        """Record one value in a histogram."""
        raise NotImplementedError

    def set(self, name: str, labels: tuple[str, ...], value: float) -> None:
        """Set a gauge."""
        raise NotImplementedError

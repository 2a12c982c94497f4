"""OpenTelemetry metrics (``opentelemetry-api``) for one or several schedulers.

    metrics = OpenTelemetryMetrics()           # the global MeterProvider
    scheduler.add_listener(metrics)

The application sets up the SDK and its exporter (OTLP, Prometheus...); without an SDK the
API's no-op provider makes every update free.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

from .table import METRICS, MetricsListener

try:
    from opentelemetry import metrics as otel_metrics
    from opentelemetry.metrics import CallbackOptions, MeterProvider, Observation
except ImportError as exc:  # pragma: no cover - depends on the extras installed
    raise ImportError("OpenTelemetryMetrics needs opentelemetry-api: pip install "
                      "'anarchon[otel]'") from exc

__all__ = ["OpenTelemetryMetrics"]


class OpenTelemetryMetrics(MetricsListener):
    """The :data:`~anarchon_core.metrics.METRICS` as OpenTelemetry instruments.

    Counters and up-down counters keep their names (``anarchon_runs``), histograms have
    the unit ``s``, gauges are observable (read when the SDK collects).
    """

    def __init__(self, meter_provider: MeterProvider | None = None) -> None:
        from .. import __version__  # noqa: PLC0415 - the package imports this module lazily

        meter = otel_metrics.get_meter("anarchon", __version__, meter_provider=meter_provider)
        self._instruments: dict[str, Any] = {}
        self._gauges: dict[str, float] = {"anarchon_store_up": 1.0}
        for spec in METRICS.values():
            unit = "s" if spec.unit == "seconds" else ""
            if spec.kind == "counter":
                self._instruments[spec.name] = meter.create_counter(
                    spec.name, unit=unit, description=spec.description)
            elif spec.kind == "updown":
                self._instruments[spec.name] = meter.create_up_down_counter(
                    spec.name, unit=unit, description=spec.description)
            elif spec.kind == "histogram":
                self._instruments[spec.name] = meter.create_histogram(
                    spec.name, unit=unit, description=spec.description)
            else:
                meter.create_observable_gauge(spec.name, callbacks=[self._reader(spec.name)],
                                              unit=unit, description=spec.description)

    def _reader(self, name: str) -> Any:
        def read(options: CallbackOptions) -> Iterable[Observation]:
            value = self._gauges.get(name)
            return [] if value is None else [Observation(value)]
        return read

    @staticmethod
    def _attributes(name: str, labels: tuple[str, ...]) -> dict[str, str]:
        return dict(zip(METRICS[name].labels, labels, strict=True))

    def inc(self, name: str, labels: tuple[str, ...], amount: float = 1.0) -> None:
        """Add to a counter or up-down counter."""
        self._instruments[name].add(amount, self._attributes(name, labels))

    def observe(self, name: str, labels: tuple[str, ...], value: float) -> None:
        """Record a value in a histogram."""
        self._instruments[name].record(value, self._attributes(name, labels))

    def set(self, name: str, labels: tuple[str, ...], value: float) -> None:
        """Set a gauge (read at the next collection)."""
        self._gauges[name] = value

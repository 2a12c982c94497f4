"""Metrics from a scheduler's events: Prometheus and OpenTelemetry.

Both exporters are listeners (``scheduler.add_listener(metrics)``) that feed the same
metrics, named and labelled as :data:`METRICS` says; they differ only in the library that
holds them. One exporter object may listen to several schedulers.

* :class:`~anarchon_core.metrics.prometheus.PrometheusMetrics` (``pip install
  'anarchon[prometheus]'``), served by ``anarchon run ... --metrics-port N``.
* :class:`~anarchon_core.metrics.otel.OpenTelemetryMetrics` (``pip install
  'anarchon[otel]'``), exported by whatever ``MeterProvider`` the application sets up.
"""

from __future__ import annotations

from .table import METRICS, MetricsListener, MetricSpec

__all__ = ["METRICS", "MetricSpec", "MetricsListener"]

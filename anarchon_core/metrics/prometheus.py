"""Prometheus metrics (``prometheus_client``) for one or several schedulers.

    metrics = PrometheusMetrics()              # the default registry
    scheduler.add_listener(metrics)
    metrics.serve(9808)                        # or mount prometheus_client's WSGI/ASGI app

Names follow Prometheus conventions: counters end in ``_total``, times in ``_seconds``.
"""

from __future__ import annotations

import logging
import threading
from typing import TYPE_CHECKING, Any

from ..errors import ConfigError
from .table import METRICS, MetricsListener

try:
    import prometheus_client
    from prometheus_client import CollectorRegistry
except ImportError as exc:  # pragma: no cover - depends on the extras installed
    raise ImportError("PrometheusMetrics needs prometheus_client: pip install "
                      "'anarchon[prometheus]'") from exc

if TYPE_CHECKING:
    from ..scheduler import Scheduler

__all__ = ["PrometheusMetrics", "serve_metrics"]

log = logging.getLogger("anarchon.metrics")

#: Histogram buckets (seconds) per metric: lateness and store calls are short, runs long.
_BUCKETS = {
    "anarchon_start_lateness": (0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0,
                                60.0),
    "anarchon_run_duration": (0.01, 0.05, 0.1, 0.5, 1.0, 5.0, 10.0, 30.0, 60.0, 300.0, 900.0,
                              3600.0),
    "anarchon_store_call_duration": (0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5,
                                     1.0, 2.5, 5.0),
}


class PrometheusMetrics(MetricsListener):
    """The :data:`~anarchon_core.metrics.METRICS` as ``prometheus_client`` metrics.

    :param registry: where to register them (default: ``prometheus_client.REGISTRY``).
        Make one object per registry and add it as a listener to every scheduler.
    """

    def __init__(self, registry: CollectorRegistry | None = None) -> None:
        self.registry = registry if registry is not None else prometheus_client.REGISTRY
        self._metrics: dict[str, Any] = {}
        for spec in METRICS.values():
            name = f"{spec.name}_{spec.unit}" if spec.unit else spec.name
            common: dict[str, Any] = {"labelnames": spec.labels, "registry": self.registry}
            try:
                if spec.kind == "counter":
                    metric: Any = prometheus_client.Counter(name, spec.description, **common)
                elif spec.kind == "histogram":
                    metric = prometheus_client.Histogram(name, spec.description,
                                                         buckets=_BUCKETS[spec.name], **common)
                else:
                    metric = prometheus_client.Gauge(name, spec.description, **common)
            except ValueError as exc:  # "Duplicated timeseries in CollectorRegistry"
                raise ConfigError(
                    f"anarchon's metrics are already registered in {self.registry!r}: make "
                    "one PrometheusMetrics per registry and add it to every scheduler "
                    f"({exc})") from None
            self._metrics[spec.name] = metric
        self._metrics["anarchon_store_up"].set(1)

    def _child(self, name: str, labels: tuple[str, ...]) -> Any:
        metric = self._metrics[name]
        return metric.labels(*labels) if labels else metric

    def inc(self, name: str, labels: tuple[str, ...], amount: float = 1.0) -> None:
        """Add to a counter or gauge."""
        self._child(name, labels).inc(amount)

    def observe(self, name: str, labels: tuple[str, ...], value: float) -> None:
        """Record a value in a histogram."""
        self._child(name, labels).observe(value)

    def set(self, name: str, labels: tuple[str, ...], value: float) -> None:
        """Set a gauge."""
        self._child(name, labels).set(value)

    def serve(self, port: int, addr: str = "0.0.0.0") -> None:
        """Serve ``/metrics`` over HTTP on ``addr:port`` from a daemon thread.

        Raises :class:`ConfigError` naming the address when it cannot be bound.
        """
        try:
            prometheus_client.start_http_server(port, addr=addr, registry=self.registry)
        except OSError as exc:
            raise ConfigError(f"cannot serve metrics on {addr}:{port}: "
                              f"{exc.strerror or exc}") from exc
        log.info("serving Prometheus metrics on http://%s:%d/metrics", addr, port)


_SHARED: dict[int, PrometheusMetrics] = {}
_SERVED: set[tuple[str, int]] = set()
_LOCK = threading.Lock()


def serve_metrics(scheduler: Scheduler, port: int, addr: str = "0.0.0.0") -> PrometheusMetrics:
    """Feed ``scheduler``'s events to the default registry and serve it on ``addr:port``.

    For ``anarchon run --metrics-port``, ``manage.py anarchon --metrics-port`` and the
    Celery beat's ``anarchon_metrics_port``. Several schedulers of one process share the
    exporter and the server (one per address).
    """
    with _LOCK:
        registry = prometheus_client.REGISTRY
        metrics = _SHARED.get(id(registry))
        if metrics is None:
            metrics = _SHARED[id(registry)] = PrometheusMetrics(registry)
        if (addr, port) not in _SERVED:
            metrics.serve(port, addr)
            _SERVED.add((addr, port))
    scheduler.add_listener(metrics)
    return metrics

"""The ``anarchon_*`` settings on ``app.conf``, checked once, and the store they name.

===============================  ==================================================================
setting                          meaning (default)
===============================  ==================================================================
``anarchon_backend``             store URL (the broker URL when it is ``redis://``/``valkey://``;
                                 otherwise required)
``anarchon_prefix``              key prefix for Redis/Valkey (``anarchon:celery:``), RabbitMQ/NATS
                                 (``anarchon.celery.``); for SQL stores use ``?table=`` in the URL
``anarchon_lease_ms``            lease of a claimed slot until its task is published (10 000)
``anarchon_heartbeat_ms``        heartbeat period (a third of the lease)
``anarchon_history_size``        runs kept per entry (1 000)
``anarchon_history_ttl_ms``      also drop runs older than this (None)
``anarchon_jitter_ms``           delay before claiming, per beat (core default: ≤ 1 s, ≤ 10 % of
                                 the period)
``anarchon_max_late_ms``         a slot not claimed within this is skipped (core default)
``anarchon_catch_up_ms``         after every beat was down, send the missed slots within this (0)
``anarchon_catch_up``            which of them: ``"newest"`` once (default), ``"all"``, ``"none"``
``anarchon_overlap``             with ``anarchon_track_tasks``, a slot due while the entry's task
                                 runs: ``"skip"`` (default), ``"buffer_one"`` (sent when it ends),
                                 ``"allow"``
``anarchon_max_attempts``        takeovers of a slot whose beat died before publishing (3)
``anarchon_instance_id``         name of this beat in history (``beat@<host>:<pid>``)
``anarchon_track_tasks``         keep the slot's lease until its task finished on a worker (False)
``anarchon_track_timeout_ms``    longest a tracked task holds its slot (3 600 000)
``anarchon_publish_threads``     threads publishing tasks (1)
``anarchon_metrics_port``        serve the beat's Prometheus metrics on this port (None: off)
``anarchon_metrics_addr``        address for the metrics port (``0.0.0.0``)
``anarchon_log_format``          ``"json"``: the beat's ``anarchon.*`` log lines as one JSON object
                                 per line with the run's fields (``"text"``)
``anarchon_database_schedules``  also send the ``anarchon_django.Schedule`` rows whose target
                                 is a Celery task, polled every ``ANARCHON["SCHEDULES_POLL_MS"]``
                                 (False; needs Django, see :mod:`anarchon_celery.dbschedules`)
===============================  ==================================================================

Any other ``anarchon_*`` key in the app's configuration is refused (a misspelled setting
would otherwise be ignored silently), in every form Celery reads: ``anarchon_backend``,
and with a namespace (``config_from_object(..., namespace="CELERY")``)
``CELERY_ANARCHON_BACKEND``.
"""

from __future__ import annotations

import difflib
import os
import re
import socket
import time
from dataclasses import dataclass, field
from typing import Any
from urllib.parse import parse_qsl, urlsplit

from anarchon_core import Backend, ConfigError, Scheduler, backend_from_url, mask_url
from anarchon_core.logjson import validate_log_format
from anarchon_core.options import LEASE_ONLY_OPTIONS, JobOptions

from .entries import JOB_OPTIONS

__all__ = ["DEFAULT_LEASE_MS", "SETTINGS", "Settings", "check_names"]

#: Every ``anarchon_*`` setting (see the module docstring).
SETTINGS = (
    "anarchon_backend", "anarchon_prefix", "anarchon_lease_ms", "anarchon_heartbeat_ms",
    "anarchon_history_size", "anarchon_history_ttl_ms",
    *(f"anarchon_{name}" for name in JOB_OPTIONS),
    "anarchon_instance_id", "anarchon_track_tasks", "anarchon_track_timeout_ms",
    "anarchon_publish_threads", "anarchon_metrics_port", "anarchon_metrics_addr",
    "anarchon_log_format", "anarchon_database_schedules",
)
_OURS = "anarchon_"
#: The core Scheduler's parameters that are settings here (its messages name them bare).
_SCHEDULER_OPTION = re.compile(r"\b(lease_ms|heartbeat_ms|instance_id|history_size|"
                               r"history_ttl_ms)\b")

DEFAULT_LEASE_MS = 10_000
DEFAULT_TRACK_TIMEOUT_MS = 3_600_000
_REDIS = ("redis", "rediss", "valkey", "valkeys")
_BROKERS = ("amqp", "amqps", "nats", "tls")
_SQL = ("postgresql", "postgres", "sqlite")


def _conf(app: Any, name: str, default: Any = None) -> Any:
    value = app.conf.get(name)
    return default if value is None else value


def _int(name: str, value: Any, *, minimum: int = 0) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or value < minimum:
        raise ConfigError(f"invalid {name} {value!r}: expected an int ≥ {minimum}")
    return value


def _metrics_port(value: Any) -> int | None:
    if value is None:
        return None
    port = _int("anarchon_metrics_port", value, minimum=1)
    if port > 65_535:
        raise ConfigError(f"invalid anarchon_metrics_port {value!r}: expected 1 to 65535")
    return port


def _text(name: str, value: Any) -> str:
    if not isinstance(value, str) or not value:
        raise ConfigError(f"invalid {name} {value!r}: expected a non-empty string")
    return value


def _spelled(name: str, prefix: str) -> str:
    """``name`` as Celery looks it up under ``prefix``: ``CELERY_ANARCHON_BACKEND``."""
    key = prefix + name
    return key.upper() if prefix.isupper() else key.lower()


def check_names(app: Any) -> None:
    """Refuse an ``anarchon_*`` key of ``app.conf`` that no setting has, or that Celery skips.

    The error names the key and the closest valid setting (in the key's own form).
    Celery reads ``anarchon_backend`` as is and, when the app is configured with a
    namespace, also as ``<NAMESPACE>_ANARCHON_BACKEND`` (in the namespace's case).
    """
    namespace = getattr(app, "namespace", None)
    prefix = f"{namespace.rstrip('_')}_" if namespace else ""
    for key in app.conf:
        if not isinstance(key, str):
            continue
        rest = key[len(prefix):] if prefix and key.upper().startswith(prefix.upper()) \
            else key
        name = rest.lower()
        if not name.startswith(_OURS):
            continue
        read_as = {name, _spelled(name, prefix)} if prefix else {name}
        if name in SETTINGS and key in read_as:
            continue
        # Under a namespace an upper-case key (a Django setting) is read only prefixed.
        prefixed = bool(prefix) and (rest != key or key.isupper())
        if name in SETTINGS:
            spelled = _spelled(name, prefix) if prefixed else name
            raise ConfigError(f"setting {key!r} is never read by Celery in this form: "
                              f"spell it {spelled!r}")
        # Compared without the prefix every setting shares, or every name would be close.
        close = difflib.get_close_matches(name[len(_OURS):],
                                          [s[len(_OURS):] for s in SETTINGS], n=1)
        if close:
            best = _OURS + close[0]
            hint = f"did you mean {_spelled(best, prefix) if prefixed else best!r}?"
        else:
            hint = f"valid: {', '.join(SETTINGS)}"
        raise ConfigError(f"unknown anarchon setting {key!r}: {hint}")


def _job_defaults(app: Any) -> dict[str, Any]:
    """The app-level job options; ConfigError names the ``anarchon_*`` setting at fault."""
    defaults = {name: app.conf.get(f"{_OURS}{name}") for name in JOB_OPTIONS}
    now_ms = int(time.time() * 1000)
    for name, value in defaults.items():
        if value is not None:
            # Each setting alone first, so the error names it (catch_up is checked with a
            # window: whether it has one is the combined check's part).
            alone = {name: value, **({"catch_up_ms": 1} if name == "catch_up" else {})}
            try:
                JobOptions.build(None, alone, leases=True, now_ms=now_ms)
            except ConfigError as exc:
                raise ConfigError(f"{_OURS}{name}: {exc}") from None
    given = {k: v for k, v in defaults.items() if v is not None}
    try:
        JobOptions.build(None, given, leases=True, now_ms=now_ms)
    except ConfigError as exc:
        shown = ", ".join(f"{_OURS}{k}" for k in given)
        raise ConfigError(f"{shown}: {exc}") from None
    return defaults


def _scheme(url: str) -> str:
    return urlsplit(url).scheme.lower()


def _broker_url(app: Any) -> str | None:
    url = app.conf.get("broker_write_url") or app.conf.get("broker_url")
    return url if isinstance(url, str) else None


@dataclass(frozen=True)
class Settings:
    """The ``anarchon_*`` settings of one Celery app, validated (see the module docstring)."""

    backend_url: str
    prefix: str | None
    lease_ms: int
    heartbeat_ms: int | None
    history_size: int
    history_ttl_ms: int | None
    instance_id: str | None
    job_defaults: dict[str, Any] = field(default_factory=dict)
    track_tasks: bool = False
    track_timeout_ms: int = DEFAULT_TRACK_TIMEOUT_MS
    publish_threads: int = 1
    metrics_port: int | None = None
    metrics_addr: str = "0.0.0.0"
    log_format: str = "text"
    database_schedules: bool = False

    @classmethod
    def from_app(cls, app: Any) -> Settings:
        """Read and check the settings; ConfigError names the setting at fault."""
        check_names(app)
        url = app.conf.get("anarchon_backend")
        if url is None:
            broker = _broker_url(app)
            if broker is None or _scheme(broker) not in _REDIS or ";" in broker:
                shown = mask_url(broker) if broker else "Celery's default amqp://"
                raise ConfigError(
                    f"set app.conf.anarchon_backend to the store's URL: the broker ({shown}) "
                    "is not Redis/Valkey, so anarchon cannot default to it (e.g. "
                    "'redis://host:6379/0' or 'postgresql://host/db')")
            url = broker
        if not isinstance(url, str) or not url:
            raise ConfigError(f"invalid anarchon_backend {url!r}: expected a store URL")
        scheme = _scheme(url)
        prefix = app.conf.get("anarchon_prefix")
        in_url = any(k == "prefix" for k, _ in parse_qsl(urlsplit(url).query))
        if prefix is not None and scheme in _SQL:
            raise ConfigError(
                f"anarchon_prefix does not apply to {scheme} stores: name the table in the URL "
                "instead (e.g. 'postgresql://host/db?table=celery_beat_runs')")
        if prefix is None and not in_url:
            prefix = ("anarchon:celery:" if scheme in _REDIS
                      else "anarchon.celery." if scheme in _BROKERS else None)
        if prefix is not None and not isinstance(prefix, str):
            raise ConfigError(f"invalid anarchon_prefix {prefix!r}: expected a string")
        lease = _int("anarchon_lease_ms", _conf(app, "anarchon_lease_ms", DEFAULT_LEASE_MS),
                     minimum=100)
        beat = app.conf.get("anarchon_heartbeat_ms")
        ttl = app.conf.get("anarchon_history_ttl_ms")
        instance = app.conf.get("anarchon_instance_id")
        if instance is not None and (not isinstance(instance, str) or not instance.strip()):
            raise ConfigError(f"invalid anarchon_instance_id {instance!r}: expected a "
                              "non-empty string")
        defaults = _job_defaults(app)
        track = app.conf.get("anarchon_track_tasks", False)
        if not isinstance(track, bool):
            raise ConfigError(f"invalid anarchon_track_tasks {track!r}: expected True or False")
        rows = app.conf.get("anarchon_database_schedules", False)
        if not isinstance(rows, bool):
            raise ConfigError(f"invalid anarchon_database_schedules {rows!r}: expected True "
                              "or False")
        return cls(
            backend_url=url, prefix=prefix, lease_ms=lease,
            heartbeat_ms=None if beat is None else _int("anarchon_heartbeat_ms", beat,
                                                        minimum=10),
            history_size=_int("anarchon_history_size",
                              _conf(app, "anarchon_history_size", 1000), minimum=1),
            history_ttl_ms=None if ttl is None else _int("anarchon_history_ttl_ms", ttl,
                                                         minimum=1),
            instance_id=instance, job_defaults=defaults, track_tasks=track,
            track_timeout_ms=_int("anarchon_track_timeout_ms",
                                  _conf(app, "anarchon_track_timeout_ms",
                                        DEFAULT_TRACK_TIMEOUT_MS), minimum=1),
            publish_threads=_int("anarchon_publish_threads",
                                 _conf(app, "anarchon_publish_threads", 1), minimum=1),
            metrics_port=_metrics_port(app.conf.get("anarchon_metrics_port")),
            metrics_addr=_text("anarchon_metrics_addr",
                               _conf(app, "anarchon_metrics_addr", "0.0.0.0")),
            log_format=validate_log_format(_conf(app, "anarchon_log_format", "text"),
                                           setting="anarchon_log_format"),
            database_schedules=rows,
        )

    def make_backend(self, *, read_only: bool = False) -> Backend:
        """A new backend object for :attr:`backend_url` (no connection is opened yet).

        ``read_only``: it creates and writes nothing (readers such as the history command).
        """
        options: dict[str, Any] = {"read_only": True} if read_only else {}
        if self.prefix is not None:
            options["prefix"] = self.prefix
        try:
            return backend_from_url(self.backend_url, **options)
        except ConfigError as exc:
            raise ConfigError(f"anarchon_backend ({mask_url(self.backend_url)}): {exc}") \
                from None

    def make_scheduler(self, role: str = "beat") -> Scheduler:
        """A core scheduler on a new backend, named ``<role>@<host>:<pid>`` by default.

        The ``"reader"`` role's backend is read-only.
        """
        backend = self.make_backend(read_only=role == "reader")
        if self.track_tasks and not backend.supports_leases:
            raise ConfigError(
                f"anarchon_track_tasks needs a lease store (Redis/Valkey, PostgreSQL, "
                f"SQLite); {backend.describe()} only claims")
        leases = backend.supports_leases
        lease_only = [f"{_OURS}{name}" for name in LEASE_ONLY_OPTIONS
                      if self.job_defaults.get(name) is not None]
        if lease_only and not leases and role == "beat":  # a reader sends nothing
            raise ConfigError(
                f"{', '.join(lease_only)} need(s) a lease store (Redis/Valkey, PostgreSQL, "
                f"SQLite); {backend.describe()} only claims")
        instance = self.instance_id if role == "beat" and self.instance_id else \
            f"{role}@{socket.gethostname()}:{os.getpid()}"
        try:
            return Scheduler(
                backend, instance_id=instance,
                lease_ms=self.lease_ms if leases else None,
                heartbeat_ms=self.heartbeat_ms if leases else None,
                history_size=self.history_size, history_ttl_ms=self.history_ttl_ms,
                handler_threads=2, contenders=False)
        except ConfigError as exc:  # the core names its parameters; say our settings
            raise ConfigError(_SCHEDULER_OPTION.sub(r"anarchon_\1", str(exc))) from None

    def describe(self) -> str:
        """The store and namespace, with any secret masked (for the beat's banner and logs)."""
        where = mask_url(self.backend_url)
        return f"{where} prefix={self.prefix}" if self.prefix else where

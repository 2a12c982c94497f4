"""anarchon: distributed cron for Python. Every instance runs the scheduler; each slot runs once.

The backends are imported lazily, so ``import anarchon_core`` needs only the extras of the
backends you use.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

from .backend import FORMAT_VERSION, Backend, ClaimOnlyBackend, new_token
from .claim import ClaimHandle, SyncClaimHandle
from .context import JobContext
from .errors import (
    AnarchonError,
    Cancelled,
    ConfigError,
    CorruptRecordError,
    LeaseLost,
    ReadOnlyError,
    StoreError,
    StoreFormatError,
    StoreNotSetUp,
    StoreUnavailable,
    UnsupportedStrategyError,
)
from .events import Event, EventKind, Listener
from .fleet import FleetStatus, InstanceInfo, JobStatus, PauseInfo
from .models import (
    ClaimOutcome,
    ClaimRequest,
    ClaimResult,
    ExpiredRun,
    HistoryQuery,
    JobInfo,
    Run,
    RunPage,
    RunRef,
)
from .options import JobOptions
from .scheduler import NotClaimed, Scheduler, run_forever
from .schedules import CronSchedule, EverySchedule, Schedule
from .schema import sql_schema
from .slots import slot_from_datetime, slot_to_datetime
from .sources import JobSource, SourcedJob, SourceSync
from .sync import SyncScheduler
from .url import backend_from_url, mask_url

if TYPE_CHECKING:
    from .backends.nats import NatsBackend
    from .backends.postgres import PostgresBackend
    from .backends.rabbitmq import RabbitMQBackend
    from .backends.redis import Idmp, Lease, RedisBackend, Script, StreamId, ValkeyBackend
    from .backends.sqlite import SqliteBackend

__version__ = "0.1.0"

_LAZY = {
    "SqliteBackend": "sqlite",
    "RedisBackend": "redis",
    "ValkeyBackend": "redis",
    "Lease": "redis",
    "StreamId": "redis",
    "Idmp": "redis",
    "Script": "redis",
    "PostgresBackend": "postgres",
    "RabbitMQBackend": "rabbitmq",
    "NatsBackend": "nats",
}

__all__ = [
    "FORMAT_VERSION",
    "AnarchonError",
    "Backend",
    "Cancelled",
    "ClaimHandle",
    "ClaimOnlyBackend",
    "ClaimOutcome",
    "ClaimRequest",
    "ClaimResult",
    "ConfigError",
    "CorruptRecordError",
    "CronSchedule",
    "Event",
    "EventKind",
    "EverySchedule",
    "ExpiredRun",
    "FleetStatus",
    "HistoryQuery",
    "Idmp",
    "InstanceInfo",
    "JobContext",
    "JobInfo",
    "JobOptions",
    "JobSource",
    "JobStatus",
    "Lease",
    "LeaseLost",
    "Listener",
    "NatsBackend",
    "NotClaimed",
    "PauseInfo",
    "PostgresBackend",
    "RabbitMQBackend",
    "ReadOnlyError",
    "RedisBackend",
    "Run",
    "RunPage",
    "RunRef",
    "Schedule",
    "Scheduler",
    "Script",
    "SourceSync",
    "SourcedJob",
    "SqliteBackend",
    "StoreError",
    "StoreFormatError",
    "StoreNotSetUp",
    "StoreUnavailable",
    "StreamId",
    "SyncClaimHandle",
    "SyncScheduler",
    "UnsupportedStrategyError",
    "ValkeyBackend",
    "backend_from_url",
    "mask_url",
    "new_token",
    "run_forever",
    "slot_from_datetime",
    "slot_to_datetime",
    "sql_schema",
]


def __getattr__(name: str) -> Any:
    module = _LAZY.get(name)
    if module is None:
        raise AttributeError(f"module 'anarchon_core' has no attribute {name!r}")
    try:
        mod = importlib.import_module(f".backends.{module}", __name__)
    except ImportError as exc:
        raise ImportError(
            f"{name} needs an optional dependency ({exc.name}): pip install 'anarchon[{module}]'"
        ) from exc
    return getattr(mod, name)

"""Job and scheduler options: validation, limits, and the defaults that scale with a schedule.

Every value is checked where it is given (registration or construction) against what each
store and :class:`~datetime.datetime` can hold and against sane bounds, so nothing accepted
here fails later on a claim. The limits are documented in ``docs/concepts.md``.
"""

from __future__ import annotations

import functools
import itertools
from dataclasses import asdict, dataclass
from datetime import timedelta
from typing import Any
from zoneinfo import ZoneInfo

from .durations import MAX_DURATION_MS, format_ms, shown
from .errors import ConfigError
from .models import OVERLAP_POLICIES
from .schedules import CronSchedule, EverySchedule, Schedule, ms_to_datetime

__all__ = [
    "CATCH_UP_POLICIES",
    "LEASE_ONLY_OPTIONS",
    "MAX_ATTEMPTS",
    "MAX_HISTORY_SIZE",
    "MAX_LEASE_MS",
    "MIN_HEARTBEAT_MS",
    "MIN_LEASE_MS",
    "JobOptions",
    "default_jitter_ms",
    "default_max_late_ms",
    "overlap_policy",
    "smallest_gap_ms",
    "validate_history",
    "validate_lease_timings",
]

LEASE_ONLY_OPTIONS = ("overlap", "max_attempts", "catch_up_ms", "catch_up")
#: ``catch_up`` policies: what a start runs of the slots missed within ``catch_up_ms``.
CATCH_UP_POLICIES = ("newest", "all", "none")
_ALL_OPTIONS = ("timeout_ms", "jitter_ms", "max_late_ms", *LEASE_ONLY_OPTIONS)
MAX_JITTER_MS = 1_000
MAX_LATE_CAP_MS = 60_000
#: ``max_attempts`` at most this: a run whose runners died a thousand times is not alive.
MAX_ATTEMPTS = 1_000
#: ``lease_ms`` bounds: below 100 ms a heartbeat cannot reach a store in time; above a day
#: a crashed runner would hold its run for longer than any takeover is worth waiting for.
MIN_LEASE_MS = 100
MAX_LEASE_MS = 86_400_000
MIN_HEARTBEAT_MS = 10
#: ``history_size`` at most this many runs per job.
MAX_HISTORY_SIZE = 1_000_000
# How many upcoming slots are searched for the smallest gap between two slots of a cron
# schedule (besides the slots around every daylight-saving change of the coming year).
_GAP_SAMPLE = 64


def default_jitter_ms(gap_ms: int) -> int:
    """At most 1 s and at most 10 % of the gap between slots."""
    return min(MAX_JITTER_MS, gap_ms // 10)


def default_max_late_ms(gap_ms: int, jitter_ms: int) -> int:
    """The gap between slots capped at 60 s, but always at least jitter + 1 s."""
    return max(jitter_ms + 1_000, min(gap_ms, MAX_LATE_CAP_MS))


def _ms(name: str, value: object, *, allow_zero: bool = True, minimum: int = 0,
        maximum: int = MAX_DURATION_MS) -> int:
    """Whole milliseconds (an int, or a timedelta of whole ms) within the bounds."""
    if isinstance(value, timedelta):
        micros = value // timedelta(microseconds=1)
        if micros % 1000:
            raise ConfigError(f"invalid {name} {value!r}: must be whole milliseconds")
        value = micros // 1000
    if isinstance(value, bool) or not isinstance(value, int):
        raise ConfigError(f"invalid {name} {shown(value)}: expected whole milliseconds (an int)")
    if value < 0 or (value == 0 and not allow_zero):
        raise ConfigError(f"invalid {name} {value!r}: must be {'≥' if allow_zero else '>'} 0")
    if value < minimum:
        raise ConfigError(f"invalid {name} {value!r}: must be at least {minimum}")
    if value > maximum:
        raise ConfigError(
            f"invalid {name} {shown(value)}: at most {maximum} ({format_ms(maximum)})")
    return value


def _zone_changes(zone: ZoneInfo, start_ms: int, days: int) -> list[int]:
    """The instants (ms) where ``zone``'s UTC offset changes within ``days`` of ``start_ms``."""
    day = 86_400_000

    def offset(ms: int) -> timedelta | None:
        return ms_to_datetime(ms).astimezone(zone).utcoffset()

    changes = []
    for index in range(days):
        lo, hi = start_ms + index * day, start_ms + (index + 1) * day
        if offset(lo) == offset(hi):
            continue  # zones change at most once a day
        while hi - lo > 1:
            mid = (lo + hi) // 2
            lo, hi = (mid, hi) if offset(mid) == offset(lo) else (lo, mid)
        changes.append(hi)
    return changes


def smallest_gap_ms(schedule: Schedule, around_ms: int) -> int:
    """The smallest gap between two consecutive slots of ``schedule`` from ``around_ms`` on.

    Exact for ``every``. For cron, the minimum over the next 64 slots and over the slots
    around every daylight-saving change of the coming year, where a coalesced firing can
    bring two slots closer than usual (``"59 1,2 * * *"`` in New York: 01:59 and 03:00).
    """
    if isinstance(schedule, EverySchedule):
        return schedule.interval_ms
    slots = schedule.upcoming(around_ms, _GAP_SAMPLE)
    gap = min(b - a for a, b in itertools.pairwise(slots))
    if isinstance(schedule, CronSchedule):
        for change in _zone_changes(schedule.zone, around_ms, 366):
            near = [schedule.latest_at_or_before(change - 1), *schedule.upcoming(change - 1, 3)]
            gap = min(gap, *(b - a for a, b in itertools.pairwise(near)))
    return gap


def _resolution_ms(schedule: Schedule) -> int:
    """No two slots of ``schedule`` are ever closer than this."""
    if isinstance(schedule, EverySchedule):
        return schedule.interval_ms
    if isinstance(schedule, CronSchedule) and not schedule.with_seconds:
        return 60_000
    return 1_000 if isinstance(schedule, CronSchedule) else 1


def _check_jitter(schedule: Schedule, jitter: int, *, given: bool, now_ms: int) -> int:
    """Refuse (or, for the default, shrink) a jitter that reaches the next slot.

    An instance waits up to ``jitter_ms`` after a slot before claiming it and computes
    its next slot after that wait; a jitter as long as the gap would make it step over
    the next slot. Refusing is clearer than clamping a value the user chose.
    """
    if jitter < _resolution_ms(schedule):
        return jitter
    gap = smallest_gap_ms(schedule, now_ms)
    if jitter < gap:
        return jitter
    if not given:
        return gap // 10
    raise ConfigError(
        f"invalid jitter_ms {jitter!r}: must be smaller than the smallest gap between slots "
        f"of {schedule.describe()!r} ({gap} ms), or an instance would wait past the next "
        "slot and skip it"
    )


@dataclass(frozen=True)
class JobOptions:
    """The options of one job, validated, with defaults filled in.

    See Job options in ``docs/concepts.md``; ``max_late_ms`` defaults to the gap between slots
    capped at 60 s (at least ``jitter_ms`` + 1 s). Durations are whole milliseconds
    (an int or a :class:`~datetime.timedelta`) up to :data:`MAX_DURATION_MS` (3650 days);
    ``jitter_ms`` must be smaller than the smallest gap between the job's slots;
    ``max_attempts`` is 1 to :data:`MAX_ATTEMPTS`; ``overlap`` is a name of
    :data:`~anarchon_core.models.OVERLAP_POLICIES` (``True``/``False`` given stand for
    ``"allow"``/``"skip"``); ``catch_up`` is one of
    :data:`CATCH_UP_POLICIES` (``"all"`` needs a ``catch_up_ms`` window).
    """

    timeout_ms: int | None = None
    jitter_ms: int = 0
    max_late_ms: int = 60_000
    overlap: str = "skip"
    max_attempts: int = 3
    catch_up_ms: int = 0
    catch_up: str = "newest"

    @classmethod
    def build(cls, schedule: Schedule | None, given: dict[str, Any], *, leases: bool,
              now_ms: int) -> JobOptions:
        """Validate the options a user ``given`` for a job and fill in the defaults.

        ``schedule`` is None for a job whose caller decides its timing
        (``Scheduler.define``): ``jitter_ms`` then defaults to 0 and ``max_late_ms`` to 60 s.

        ``leases`` says whether the backend holds leases; lease-only options on a
        claim-only backend are a :class:`ConfigError`.
        """
        unknown = sorted(set(given) - set(_ALL_OPTIONS))
        if unknown:
            raise ConfigError(
                f"unknown job option(s) {', '.join(map(str, unknown))}; valid: "
                f"{', '.join(_ALL_OPTIONS)}"
            )
        if not leases:
            lease_only = [name for name in LEASE_ONLY_OPTIONS if name in given]
            if lease_only:
                named = ", ".join(f"{n}={given[n]!r}" if n in ("overlap", "catch_up") else n
                                  for n in lease_only)
                raise ConfigError(
                    f"option(s) {named} need a lease backend (Redis/Valkey strategy "
                    "'lease', PostgreSQL, SQLite); this backend only claims"
                )
        gap = schedule.typical_gap_ms(now_ms) if schedule is not None else MAX_LATE_CAP_MS
        timeout = given.get("timeout_ms")
        if timeout is not None:
            timeout = _ms("timeout_ms", timeout, allow_zero=False)
        jitter_given = given.get("jitter_ms") is not None
        jitter = _ms("jitter_ms", given["jitter_ms"] if jitter_given
                     else default_jitter_ms(gap) if schedule is not None else 0)
        if schedule is not None:
            jitter = _check_jitter(schedule, jitter, given=jitter_given, now_ms=now_ms)
        late_given = given.get("max_late_ms")
        max_late = (
            _ms("max_late_ms", late_given) if late_given is not None
            else default_max_late_ms(gap, jitter)
        )
        if max_late < jitter:
            raise ConfigError(
                f"invalid max_late_ms {max_late!r}: must be at least jitter_ms ({jitter}), "
                "or jittered claims would all be late"
            )
        overlap = overlap_policy(given.get("overlap", "skip"))
        attempts = given.get("max_attempts", 3)
        if isinstance(attempts, bool) or not isinstance(attempts, int) or \
                not 1 <= attempts <= MAX_ATTEMPTS:
            raise ConfigError(
                f"invalid max_attempts {shown(attempts)}: expected an int ≥ 1 and ≤ "
                f"{MAX_ATTEMPTS}")
        catch_up_ms = _ms("catch_up_ms", given.get("catch_up_ms", 0))
        catch_up = given.get("catch_up", "newest")
        if not isinstance(catch_up, str) or catch_up not in CATCH_UP_POLICIES:
            raise ConfigError(f"invalid catch_up {shown(catch_up)}: expected one of "
                              f"{', '.join(map(repr, CATCH_UP_POLICIES))}")
        if catch_up == "all" and not catch_up_ms:
            raise ConfigError("catch_up='all' needs catch_up_ms, the window whose missed "
                              "slots are run (e.g. catch_up_ms=3_600_000 for an hour)")
        values = (timeout, jitter, max_late, overlap, attempts, catch_up_ms, catch_up)
        if cls is not JobOptions:
            return cls(*values)
        return _shared_options(*values)

    def as_dict(self) -> dict[str, Any]:
        """The options as a plain dict (for :class:`JobInfo`)."""
        return asdict(self)


def overlap_policy(value: object) -> str:
    """The overlap policy named by ``value`` (``True``: ``"allow"``, ``False``: ``"skip"``)."""
    if value is True:
        return "allow"
    if value is False:
        return "skip"
    if isinstance(value, str) and value in OVERLAP_POLICIES:
        return value
    if value == "buffer_all":
        raise ConfigError(
            "overlap='buffer_all' is not offered: a queue of buffered slots would need its "
            "order kept in the store; use 'buffer_one' (the slots due meanwhile run once, "
            "late) or catch_up='all' to run every missed slot")
    raise ConfigError(f"invalid overlap {shown(value)}: expected one of "
                      f"{', '.join(map(repr, OVERLAP_POLICIES))} (or True/False for "
                      "'allow'/'skip')")


@functools.lru_cache(maxsize=1024, typed=True)
def _shared_options(*values: Any) -> JobOptions:
    """One (immutable) JobOptions per set of values: thousands of jobs share a few."""
    return JobOptions(*values)


class _Default(int):
    """A default value: equal to it, but told apart from the same value given explicitly."""

    __slots__ = ()


#: ``Scheduler(lease_ms=...)``'s default, 30 s. A claim-only backend refuses any lease
#: given to it, 30 s included, so the default is this object and not the number.
DEFAULT_LEASE_MS: int = _Default(30_000)


def validate_lease_timings(lease_ms: object, heartbeat_ms: object) -> tuple[int, int]:
    """Check ``Scheduler(lease_ms=..., heartbeat_ms=...)``; return both, defaults filled in.

    ``lease_ms`` (``None``: 30 s) is 100 ms to 1 day; ``heartbeat_ms`` (``None``: a third
    of the lease) is at least 10 ms and smaller than the lease. A timedelta works too.
    """
    lease = _ms("lease_ms", int(DEFAULT_LEASE_MS) if lease_ms is None else lease_ms,
                allow_zero=False, minimum=MIN_LEASE_MS, maximum=MAX_LEASE_MS)
    heartbeat = _ms("heartbeat_ms", lease // 3 if heartbeat_ms is None else heartbeat_ms,
                    allow_zero=False, minimum=MIN_HEARTBEAT_MS, maximum=MAX_LEASE_MS)
    if heartbeat >= lease:
        raise ConfigError(
            f"invalid heartbeat_ms {heartbeat}: must be smaller than lease_ms ({lease}), "
            "or every lease expires between two heartbeats"
        )
    return lease, heartbeat


def validate_history(history_size: object, history_ttl_ms: object) -> tuple[int, int | None]:
    """Check ``Scheduler(history_size=..., history_ttl_ms=...)``; return both.

    ``history_size`` is 1 to 1,000,000 runs per job; ``history_ttl_ms`` is ``None`` or
    1 ms to 3650 days.
    """
    if isinstance(history_size, bool) or not isinstance(history_size, int) or \
            not 1 <= history_size <= MAX_HISTORY_SIZE:
        raise ConfigError(
            f"invalid history_size {shown(history_size)}: expected an int ≥ 1 and ≤ "
            f"{MAX_HISTORY_SIZE}")
    ttl = None if history_ttl_ms is None else _ms("history_ttl_ms", history_ttl_ms,
                                                   allow_zero=False)
    return history_size, ttl

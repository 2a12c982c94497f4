"""Job options: validation and the defaults that scale with a job's schedule."""

from __future__ import annotations

from dataclasses import asdict, dataclass
from datetime import timedelta
from typing import Any

from .errors import ConfigError
from .schedules import Schedule

__all__ = ["LEASE_ONLY_OPTIONS", "JobOptions", "default_jitter_ms", "default_max_late_ms"]

LEASE_ONLY_OPTIONS = ("overlap", "max_attempts", "catch_up_ms")
_ALL_OPTIONS = ("timeout_ms", "jitter_ms", "max_late_ms", *LEASE_ONLY_OPTIONS)
MAX_JITTER_MS = 1_000
MAX_LATE_CAP_MS = 60_000


def default_jitter_ms(gap_ms: int) -> int:
    """At most 1 s and at most 10 % of the gap between slots."""
    return min(MAX_JITTER_MS, gap_ms // 10)


def default_max_late_ms(gap_ms: int, jitter_ms: int) -> int:
    """The gap between slots capped at 60 s, but always at least jitter + 1 s."""
    return max(jitter_ms + 1_000, min(gap_ms, MAX_LATE_CAP_MS))


def _ms(name: str, value: object, *, allow_zero: bool = True) -> int:
    if isinstance(value, timedelta):
        value = round(value.total_seconds() * 1000)
    if isinstance(value, bool) or not isinstance(value, int):
        raise ConfigError(f"invalid {name} {value!r}: expected whole milliseconds (an int)")
    if value < 0 or (value == 0 and not allow_zero):
        raise ConfigError(f"invalid {name} {value!r}: must be {'≥' if allow_zero else '>'} 0")
    return value


@dataclass(frozen=True)
class JobOptions:
    """The options of one job, validated, with defaults filled in.

    See the table in ``SPEC.md`` §3; ``max_late_ms`` defaults to the gap between slots
    capped at 60 s (at least ``jitter_ms`` + 1 s).
    """

    timeout_ms: int | None = None
    jitter_ms: int = 0
    max_late_ms: int = 60_000
    overlap: bool = False
    max_attempts: int = 3
    catch_up_ms: int = 0

    @classmethod
    def build(cls, schedule: Schedule, given: dict[str, Any], *, leases: bool,
              now_ms: int) -> JobOptions:
        """Validate the options a user ``given`` for a job and fill in the defaults.

        ``leases`` says whether the backend holds leases; lease-only options on a
        claim-only backend are a :class:`ConfigError`.
        """
        unknown = sorted(set(given) - set(_ALL_OPTIONS))
        if unknown:
            raise ConfigError(
                f"unknown job option(s) {', '.join(unknown)}; valid: {', '.join(_ALL_OPTIONS)}"
            )
        if not leases:
            lease_only = [name for name in LEASE_ONLY_OPTIONS if name in given]
            if lease_only:
                raise ConfigError(
                    f"option(s) {', '.join(lease_only)} need a lease backend (Redis/Valkey "
                    "strategy 'lease', PostgreSQL, SQLite); this backend only claims"
                )
        gap = schedule.typical_gap_ms(now_ms)
        timeout = given.get("timeout_ms")
        if timeout is not None:
            timeout = _ms("timeout_ms", timeout, allow_zero=False)
        jitter = _ms("jitter_ms", given.get("jitter_ms", default_jitter_ms(gap)))
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
        overlap = given.get("overlap", False)
        if not isinstance(overlap, bool):
            raise ConfigError(f"invalid overlap {overlap!r}: expected True or False")
        attempts = given.get("max_attempts", 3)
        if isinstance(attempts, bool) or not isinstance(attempts, int) or attempts < 1:
            raise ConfigError(f"invalid max_attempts {attempts!r}: expected an int ≥ 1")
        catch_up = _ms("catch_up_ms", given.get("catch_up_ms", 0))
        return cls(timeout, jitter, max_late, overlap, attempts, catch_up)

    def as_dict(self) -> dict[str, Any]:
        """The options as a plain dict (for :class:`JobInfo`)."""
        return asdict(self)

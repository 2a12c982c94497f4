"""Parsing of human durations (``"1h30m"``, ``"500ms"``, timedeltas, seconds) into ms."""

from __future__ import annotations

import math
import re
from datetime import timedelta

from .errors import ConfigError

Duration = str | int | float | timedelta

_UNIT_MS = {"ms": 1, "s": 1_000, "m": 60_000, "h": 3_600_000, "d": 86_400_000, "w": 604_800_000}
_PART = re.compile(r"(\d+(?:\.\d+)?)(ms|s|m|h|d|w)")
_WHOLE = re.compile(r"^(?:\d+(?:\.\d+)?(?:ms|s|m|h|d|w))+$")


def parse_duration_ms(value: object, *, what: str = "duration", allow_zero: bool = False) -> int:
    """Return ``value`` as whole milliseconds.

    Accepts ``"10s"``, ``"5m"``, ``"1h30m"``, ``"500ms"``, ``"1d"``, ``"2w"``, a
    :class:`~datetime.timedelta`, or a number of seconds. Raises :class:`ConfigError`
    naming the offending value for anything else, for negative values and, unless
    ``allow_zero``, for zero.
    """
    ms: float
    if isinstance(value, bool):
        raise ConfigError(f"invalid {what} {value!r}: expected e.g. '10s', '1h30m' or seconds")
    if isinstance(value, timedelta):
        ms = value.total_seconds() * 1000
    elif isinstance(value, int | float):
        if not math.isfinite(value):
            raise ConfigError(f"invalid {what} {value!r}: must be a finite number of seconds")
        ms = value * 1000
    elif isinstance(value, str):
        text = value.strip().lower().replace(" ", "")
        if not _WHOLE.match(text):
            raise ConfigError(
                f"invalid {what} {value!r}: expected a number with a unit "
                "(ms, s, m, h, d, w), e.g. '10s', '1h30m', '500ms'"
            )
        ms = sum(float(n) * _UNIT_MS[u] for n, u in _PART.findall(text))
    else:
        raise ConfigError(
            f"invalid {what} {value!r}: expected a string like '10s', a timedelta or seconds"
        )
    if ms < 0 or (ms == 0 and not allow_zero):
        raise ConfigError(f"invalid {what} {value!r}: must be {'≥' if allow_zero else '>'} 0")
    whole = round(ms)
    if abs(ms - whole) > 1e-6 or (whole == 0 and not allow_zero):
        raise ConfigError(f"invalid {what} {value!r}: must be a whole number of milliseconds")
    return whole


def format_ms(ms: int) -> str:
    """Render milliseconds compactly: ``5400000`` → ``"1h30m"``."""
    if ms == 0:
        return "0ms"
    out = []
    for unit in ("d", "h", "m", "s", "ms"):
        size = _UNIT_MS[unit]
        if ms >= size:
            count, ms = divmod(ms, size)
            out.append(f"{count}{unit}")
    return "".join(out)

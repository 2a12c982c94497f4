"""Parsing of human durations (``"1h30m"``, ``"500ms"``, timedeltas, seconds) into ms."""

from __future__ import annotations

import functools
import math
import re
from datetime import timedelta
from fractions import Fraction

from .errors import ConfigError

__all__ = ["MAX_DURATION_MS", "Duration", "format_ms", "parse_duration_ms", "shown"]

Duration = str | int | float | timedelta

#: The longest duration anarchon accepts anywhere (intervals, offsets, timeouts, jitter,
#: lateness, catch-up, history TTL): 3650 days, about ten years. Every store's integer
#: columns and Lua's doubles hold far more; the bound keeps every slot and every time
#: computed from it (slot + lateness, now + TTL) a valid ``datetime`` for thousands of
#: years, and catches unit mistakes such as ``"99999999999999999999d"`` at once.
MAX_DURATION_MS = 3_650 * 86_400_000

_UNIT_MS = {"ms": 1, "s": 1_000, "m": 60_000, "h": 3_600_000, "d": 86_400_000, "w": 604_800_000}
_PART = re.compile(r"(\d+(?:\.\d+)?)(ms|s|m|h|d|w)")
_WHOLE = re.compile(r"^(?:\d+(?:\.\d+)?(?:ms|s|m|h|d|w))+$")
_MAX_TEXT = 64
_SHOWN = 80


def shown(value: object) -> str:
    """``repr(value)``, cut to a readable length for error messages."""
    text = repr(value)
    return text if len(text) <= _SHOWN else f"{text[:_SHOWN - 10]}...{text[-7:]}"


def parse_duration_ms(value: object, *, what: str = "duration", allow_zero: bool = False,
                      maximum: int = MAX_DURATION_MS) -> int:
    """Return ``value`` as whole milliseconds.

    Accepts ``"10s"``, ``"5m"``, ``"1h30m"``, ``"500ms"``, ``"1d"``, ``"2w"``, a
    :class:`~datetime.timedelta`, or a number of seconds. Raises :class:`ConfigError`
    naming the offending value for anything else, for negative values, for more than
    ``maximum`` ms (default :data:`MAX_DURATION_MS`) and, unless ``allow_zero``, for zero.
    """
    ms: Fraction | float
    if isinstance(value, bool):
        raise ConfigError(
            f"invalid {what} {shown(value)}: expected e.g. '10s', '1h30m' or seconds")
    if isinstance(value, timedelta):
        ms = Fraction(value // timedelta(microseconds=1), 1000)
    elif isinstance(value, int):
        ms = Fraction(value) * 1000
    elif isinstance(value, float):
        if not math.isfinite(value):
            raise ConfigError(f"invalid {what} {shown(value)}: must be a finite number of seconds")
        ms = value * 1000
    elif isinstance(value, str):
        text = value.strip().lower().replace(" ", "")
        if len(text) > _MAX_TEXT or not _WHOLE.match(text):
            raise ConfigError(
                f"invalid {what} {shown(value)}: expected a number with a unit "
                "(ms, s, m, h, d, w), e.g. '10s', '1h30m', '500ms'"
            )
        ms = _text_ms(text)
    else:
        raise ConfigError(
            f"invalid {what} {shown(value)}: expected a string like '10s', a timedelta or "
            "seconds"
        )
    if ms < 0 or (ms == 0 and not allow_zero):
        raise ConfigError(
            f"invalid {what} {shown(value)}: must be {'≥' if allow_zero else '>'} 0")
    if ms > maximum:
        raise ConfigError(
            f"invalid {what} {shown(value)}: at most {format_ms(maximum)} ({maximum} ms)")
    whole = round(ms)
    # Floats (seconds) get a little slack for binary rounding: 1.001 s is 1001 ms.
    inexact = abs(ms - whole) > 1e-6 if isinstance(ms, float) else ms != whole
    if inexact or (whole == 0 and not allow_zero):
        raise ConfigError(
            f"invalid {what} {shown(value)}: must be a whole number of milliseconds")
    return whole


@functools.lru_cache(maxsize=1024)
def _text_ms(text: str) -> Fraction:
    # Exact arithmetic: "0.1s" is 100 ms, and no digit string can overflow a float. Cached:
    # a service registering thousands of jobs repeats a handful of interval texts.
    return sum((Fraction(n) * _UNIT_MS[u] for n, u in _PART.findall(text)), Fraction(0))


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

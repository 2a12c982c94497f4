"""Small helpers several backends share: clocks, masking, flags, format and read-only checks."""

from __future__ import annotations

import random
import time
from typing import Any

from ..errors import ConfigError, ReadOnlyError, StoreFormatError
from .storeerrors import scrub

__all__ = [
    "TRIM_EVERY", "check_format_value", "local_now_ms", "parse_flag", "refuse_write", "scrub",
    "time_ms", "trim_drawn",
]

#: A won claim trims its job's old history about once in this many (drawn at random): the
#: bound stays ``history_size`` give or take a few runs, and most claims skip the work.
TRIM_EVERY = 20


def trim_drawn() -> bool:
    """Whether this won claim is one of the 1 in :data:`TRIM_EVERY` that trims history."""
    return random.random() < 1 / TRIM_EVERY


def local_now_ms() -> int:
    """The local machine's clock in ms since the epoch (for stores that give no time)."""
    return int(time.time() * 1000)


def time_ms(reply: object) -> int:
    """Milliseconds from a Redis ``TIME`` reply (``[seconds, microseconds]``)."""
    if isinstance(reply, dict):  # a cluster client may answer per node
        reply = next(iter(reply.values()))
    pair: Any = reply
    return int(pair[0]) * 1000 + int(pair[1]) // 1000


def parse_flag(name: str, value: object) -> bool:
    """A boolean option from a bool or URL text (``true``/``false``, ``1``/``0``...)."""
    if isinstance(value, bool):
        return value
    text = str(value).lower()
    if text in ("1", "true", "yes", "on"):
        return True
    if text in ("0", "false", "no", "off"):
        return False
    raise ConfigError(f"invalid {name} {value!r}: expected true or false")


def check_format_value(found: object) -> int:
    """The stored format number; StoreFormatError if unreadable or newer than ours."""
    from ..backend import FORMAT_VERSION  # noqa: PLC0415 - backend.py imports this module
    try:
        number = int(str(found))
    except (TypeError, ValueError):
        raise StoreFormatError(str(found), FORMAT_VERSION) from None
    if number > FORMAT_VERSION:
        raise StoreFormatError(number, FORMAT_VERSION)
    return number


def refuse_write(backend: object, operation: str) -> None:
    """Raise ReadOnlyError when ``backend`` was opened with ``read_only=True``."""
    if getattr(backend, "read_only", False):
        describe = getattr(backend, "describe", None)
        what = describe() if callable(describe) else type(backend).__name__
        raise ReadOnlyError(
            f"{operation}() refused: {what} is read-only (read_only=True); it reads "
            "history and writes nothing. Use a backend without read_only to run jobs."
        )

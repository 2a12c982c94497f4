"""Reading values out of store records, which are untrusted: strict types, bounded numbers.

A store holds what any client with write access put there: an older or broken anarchon, a
script, a person. Every decoder of store data reads its fields through these helpers, so a
number out of range (``1e400``, ``10**30``, ``NaN``, a negative time), a wrong type or bad
text is one :class:`ValueError` naming the field, which the decoder turns into a
:class:`~anarchon_core.errors.CorruptRecordError` for that record. Nothing read from a
store reaches ``int()``, ``timedelta`` or ``datetime`` unchecked.
"""

from __future__ import annotations

import math
import re
from collections.abc import Mapping
from typing import Any

from .errors import CorruptRecordError
from .slots import MAX_SLOT, MIN_SLOT

__all__ = ["MAX_COUNT", "corrupt", "record_int", "record_map", "record_ms", "record_text"]

#: The largest count (attempts, jobs of an instance) a record may hold.
MAX_COUNT = 2**31 - 1
_INTEGER = re.compile(r"-?[0-9]{1,19}")


def record_int(value: object, what: str, lo: int, hi: int) -> int:
    """``value`` as an int in ``lo..hi``: an int, an integral finite float or a decimal text.

    Raises :class:`ValueError` naming ``what`` for anything else (a bool, ``NaN``, ``1e400``,
    ``"abc"``, a number out of range).
    """
    number: int | None = None
    if isinstance(value, bool):
        number = None
    elif isinstance(value, int):
        number = value
    elif isinstance(value, float):
        number = int(value) if math.isfinite(value) and value.is_integer() else None
    elif isinstance(value, str | bytes):
        text = value.decode("ascii", "replace") if isinstance(value, bytes) else value
        number = int(text) if _INTEGER.fullmatch(text) else None
    if number is None or not lo <= number <= hi:
        raise ValueError(f"{what} {_shown(value)}: expected an integer in {lo}..{hi}")
    return number


def record_ms(value: object, what: str, *, lo: int = MIN_SLOT) -> int:
    """An instant (ms since the epoch) a datetime can hold; see :func:`record_int`."""
    return record_int(value, what, lo, MAX_SLOT)


def record_text(value: object, what: str, *, limit: int = 10_000_000) -> str:
    """A text of at most ``limit`` characters; :class:`ValueError` naming ``what`` otherwise.

    A text that is not valid Unicode (lone surrogates: bytes that were not UTF-8, as a
    Redis client decodes them) is refused too: it could not be printed or encoded again.
    """
    if not isinstance(value, str) or len(value) > limit or not _unicode(value):
        raise ValueError(f"{what} {_shown(value)}: expected a valid text of at most {limit} "
                         "characters")
    return value


def _unicode(text: str) -> bool:
    if text.isascii():
        return True
    try:
        text.encode()
    except UnicodeEncodeError:
        return False
    return True


def record_map(value: object, what: str) -> Mapping[str, Any]:
    """A JSON object (a mapping with text keys); :class:`ValueError` naming ``what`` otherwise."""
    if not isinstance(value, Mapping) or not all(isinstance(k, str) for k in value):
        raise ValueError(f"{what} {_shown(value)}: expected an object")
    return value


def corrupt(key: str, exc: BaseException) -> CorruptRecordError:
    """The error for record ``key`` that failed to decode with ``exc``."""
    return CorruptRecordError(key, str(exc) or type(exc).__name__)


def _shown(value: object) -> str:
    text = repr(value)
    return text if len(text) <= 60 else text[:57] + "..."

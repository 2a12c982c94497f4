"""Slots as integers (ms since the Unix epoch, UTC) and back to aware datetimes."""

from __future__ import annotations

from datetime import datetime

from .errors import ConfigError
from .schedules import ms_to_datetime

__all__ = ["MAX_SLOT", "MIN_SLOT", "slot_from_datetime", "slot_to_datetime"]

#: The first and last instants a datetime can hold (0001-01-01 and 9999-12-31, UTC), in ms.
MIN_SLOT = -62_135_596_800_000
MAX_SLOT = 253_402_300_799_999


def slot_from_datetime(moment: datetime) -> int:
    """The slot of an aware datetime: whole milliseconds since the epoch (UTC).

    A naive datetime is refused (its time zone would be a guess that differs between
    instances); sub-millisecond digits are dropped, so every instance gets the same slot.
    """
    if not isinstance(moment, datetime):
        raise ConfigError(f"invalid datetime {moment!r}: expected an aware datetime")
    if moment.tzinfo is None or moment.utcoffset() is None:
        raise ConfigError(f"invalid datetime {moment.isoformat()}: naive; give it a tzinfo "
                          "(e.g. timezone.utc) so every instance computes the same slot")
    # timestamp() goes through a float: take whole seconds and microseconds apart.
    seconds = round(moment.replace(microsecond=0).timestamp())
    slot = seconds * 1000 + moment.microsecond // 1000
    if not MIN_SLOT <= slot <= MAX_SLOT:  # e.g. 9999-12-31T23:59-14:00, after 9999 in UTC
        raise ConfigError(f"invalid datetime {moment.isoformat()}: outside 0001-01-01 to "
                          "9999-12-31 UTC")
    return slot


def slot_to_datetime(slot: int) -> datetime:
    """The aware UTC datetime of a slot (exact to the millisecond)."""
    if isinstance(slot, bool) or not isinstance(slot, int) or not MIN_SLOT <= slot <= MAX_SLOT:
        raise ConfigError(f"invalid slot {slot!r}: expected int milliseconds since the epoch "
                          f"in {MIN_SLOT}..{MAX_SLOT}")
    return ms_to_datetime(slot)

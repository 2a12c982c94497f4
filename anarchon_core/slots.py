"""Slots as integers (ms since the Unix epoch, UTC) and back to aware datetimes."""

from __future__ import annotations

from datetime import datetime

from .errors import ConfigError
from .schedules import ms_to_datetime

__all__ = ["slot_from_datetime", "slot_to_datetime"]


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
    return seconds * 1000 + moment.microsecond // 1000


def slot_to_datetime(slot: int) -> datetime:
    """The aware UTC datetime of a slot (exact to the millisecond)."""
    if isinstance(slot, bool) or not isinstance(slot, int):
        raise ConfigError(f"invalid slot {slot!r}: expected int milliseconds since the epoch")
    return ms_to_datetime(slot)

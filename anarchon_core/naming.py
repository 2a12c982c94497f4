"""Validation of the names users give: jobs, instance ids, key prefixes, table names."""

from __future__ import annotations

import re

from .durations import shown
from .errors import ConfigError

__all__ = [
    "MAX_INSTANCE_ID", "MAX_JOB_NAME", "validate_instance_id", "validate_job_name",
    "validate_prefix", "validate_table",
]

#: Longest job name, in characters. Backends with tighter limits (queue names, subjects)
#: map longer names to a digest or refuse them in ``check_job``.
MAX_JOB_NAME = 200
#: Longest ``instance_id``, in characters (it is stored with every attempt).
MAX_INSTANCE_ID = 200
_PREFIX = re.compile(r"^[A-Za-z0-9_:.\-]{1,100}$")
_IDENT = re.compile(r"^[A-Za-z_][A-Za-z0-9_]{0,62}$")


def _unprintable(text: str) -> str | None:
    """Describe the first character no store can hold or show sensibly, if any."""
    for index, char in enumerate(text):
        if char == "\x00":
            return f"a NUL character at position {index} (PostgreSQL cannot store it)"
        if 0xD800 <= ord(char) <= 0xDFFF:
            return f"a lone surrogate {char!r} at position {index} (not valid UTF-8)"
        if not char.isprintable() and char != " ":
            return f"the control or invisible character {char!r} at position {index}"
    return None


def validate_job_name(name: object) -> str:
    r"""Return ``name`` if it can name a job in every store; else raise ConfigError.

    A job name is 1-200 printable characters (any script; spaces inside are fine) with no
    leading or trailing spaces: no NUL, no control, format or separator characters
    (``\n``, ``\t``, U+200B, U+2028...), no lone surrogates.
    """
    if not isinstance(name, str) or not name.strip():
        raise ConfigError(f"invalid job name {shown(name)}: expected a non-empty string")
    if len(name) > MAX_JOB_NAME:
        raise ConfigError(
            f"invalid job name {shown(name)}: {len(name)} characters, longer than "
            f"{MAX_JOB_NAME}")
    bad = _unprintable(name)
    if bad is not None:
        raise ConfigError(
            f"invalid job name {shown(name)}: {bad}; no control characters or surrounding "
            "spaces")
    if name != name.strip():
        raise ConfigError(
            f"invalid job name {shown(name)}: no control characters or surrounding spaces")
    return name


def validate_instance_id(instance_id: object) -> str:
    """Return ``instance_id`` if every store can record it; else raise ConfigError.

    1-200 printable characters with no leading or trailing spaces (the default,
    ``"<hostname>:<pid>"``, always is).
    """
    if not isinstance(instance_id, str) or not instance_id.strip():
        raise ConfigError(
            f"invalid instance_id {shown(instance_id)}: expected a non-empty string")
    if len(instance_id) > MAX_INSTANCE_ID:
        raise ConfigError(
            f"invalid instance_id {shown(instance_id)}: {len(instance_id)} characters, longer "
            f"than {MAX_INSTANCE_ID}")
    bad = _unprintable(instance_id)
    if bad is not None:
        raise ConfigError(f"invalid instance_id {shown(instance_id)}: {bad}")
    if instance_id != instance_id.strip():
        raise ConfigError(f"invalid instance_id {shown(instance_id)}: no surrounding spaces")
    return instance_id


def validate_prefix(prefix: object, *, option: str = "prefix") -> str:
    """Return a key/queue/subject prefix made only of letters, digits and ``_:.-``."""
    if not isinstance(prefix, str) or not _PREFIX.match(prefix):
        raise ConfigError(
            f"invalid {option} {shown(prefix)}: use 1-100 letters, digits, '_', ':', '.' or '-'"
        )
    return prefix


def validate_table(table: object, *, allow_schema: bool) -> tuple[str, ...]:
    """Split a table name (``"runs"`` or, if allowed, ``"schema.runs"``) into identifiers.

    Each part must be a plain SQL identifier (letters, digits, underscores; not starting
    with a digit; at most 63 characters), which rules out injection through the name.
    """
    if not isinstance(table, str) or not table:
        raise ConfigError(f"invalid table {shown(table)}: expected a name like 'anarchon_runs'")
    parts = tuple(table.split("."))
    if len(parts) > (2 if allow_schema else 1):
        form = "'table' or 'schema.table'" if allow_schema else "a plain name like 'cron_runs'"
        raise ConfigError(f"invalid table {shown(table)}: expected {form}")
    for part in parts:
        if not _IDENT.match(part):
            raise ConfigError(
                f"invalid table {shown(table)}: {shown(part)} is not a plain identifier "
                "(letters, digits and '_', not starting with a digit, at most 63 characters)"
            )
    return parts

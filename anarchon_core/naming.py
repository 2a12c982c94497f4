"""Validation of the names users give: jobs, key prefixes, table names."""

from __future__ import annotations

import re

from .errors import ConfigError

MAX_JOB_NAME = 200
_PREFIX = re.compile(r"^[A-Za-z0-9_:.\-]{1,100}$")
_IDENT = re.compile(r"^[A-Za-z_][A-Za-z0-9_]{0,62}$")


def validate_job_name(name: object) -> str:
    """Return ``name`` if it can name a job in every store; else raise ConfigError."""
    if not isinstance(name, str) or not name.strip():
        raise ConfigError(f"invalid job name {name!r}: expected a non-empty string")
    if len(name) > MAX_JOB_NAME:
        raise ConfigError(f"invalid job name {name!r}: longer than {MAX_JOB_NAME} characters")
    if any(ord(c) < 32 or ord(c) == 127 for c in name) or name != name.strip():
        raise ConfigError(
            f"invalid job name {name!r}: no control characters or surrounding spaces"
        )
    return name


def validate_prefix(prefix: object, *, option: str = "prefix") -> str:
    """Return a key/queue/subject prefix made only of letters, digits and ``_:.-``."""
    if not isinstance(prefix, str) or not _PREFIX.match(prefix):
        raise ConfigError(
            f"invalid {option} {prefix!r}: use 1-100 letters, digits, '_', ':', '.' or '-'"
        )
    return prefix


def validate_table(table: object, *, allow_schema: bool) -> tuple[str, ...]:
    """Split a table name (``"runs"`` or, if allowed, ``"schema.runs"``) into identifiers.

    Each part must be a plain SQL identifier (letters, digits, underscores; not starting
    with a digit; at most 63 characters), which rules out injection through the name.
    """
    if not isinstance(table, str) or not table:
        raise ConfigError(f"invalid table {table!r}: expected a name like 'anarchon_runs'")
    parts = tuple(table.split("."))
    if len(parts) > (2 if allow_schema else 1):
        form = "'table' or 'schema.table'" if allow_schema else "a plain name like 'cron_runs'"
        raise ConfigError(f"invalid table {table!r}: expected {form}")
    for part in parts:
        if not _IDENT.match(part):
            raise ConfigError(
                f"invalid table {table!r}: {part!r} is not a plain identifier "
                "(letters, digits and '_', not starting with a digit, at most 63 characters)"
            )
    return parts

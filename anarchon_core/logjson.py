"""Log lines for machines: one JSON object per line, with the run's fields.

``anarchon run --log-format json``, ``manage.py anarchon --log-format json`` and Celery's
``anarchon_log_format = "json"`` send the ``anarchon.*`` loggers' lines through
:class:`JsonFormatter`::

    {"time": "2026-12-01T08:00:00.412Z", "level": "INFO", "logger": "anarchon.lease",
     "message": "report slot 1796112000000 attempt 1: success", "job": "report",
     "slot": 1796112000000, "attempt": 1, "runner": "web-1:4242", "status": "success",
     "duration_ms": 412}

A field is present when the line is about a run and knows it: ``job``, ``slot``,
``attempt``, ``runner`` on every line about a run; ``status``, ``duration_ms`` and
``error`` on the line recording a run's end.
"""

from __future__ import annotations

import json
import logging
import sys
from datetime import UTC, datetime
from typing import Any, TextIO

from .errors import ConfigError

__all__ = ["LOG_FORMATS", "RUN_LOG_FIELDS", "JsonFormatter", "install_log_handler",
           "validate_log_format"]

#: The values of ``--log-format`` (and of Celery's ``anarchon_log_format``).
LOG_FORMATS = ("text", "json")
#: A run's fields, in the order they appear in a JSON line.
RUN_LOG_FIELDS = ("job", "slot", "attempt", "runner", "status", "duration_ms", "error")
#: The text format of the command line's and the Django worker's log lines.
TEXT_FORMAT = "%(asctime)s %(levelname)s %(name)s: %(message)s"


class JsonFormatter(logging.Formatter):
    """A log record as one JSON object: time (UTC), level, logger, message, run fields."""

    def format(self, record: logging.LogRecord) -> str:
        """The record as one line of JSON (a traceback goes in ``exception``)."""
        when = datetime.fromtimestamp(record.created, UTC)
        out: dict[str, Any] = {
            "time": when.isoformat(timespec="milliseconds").replace("+00:00", "Z"),
            "level": record.levelname, "logger": record.name, "message": record.getMessage(),
        }
        for name in RUN_LOG_FIELDS:
            # Records about a run name their instance ``instance`` (see events.run_fields).
            value = getattr(record, name, None)
            if value is None and name == "runner":
                value = getattr(record, "instance", None)
            if value is not None:
                out[name] = value
        if record.exc_info:
            out["exception"] = self.formatException(record.exc_info)
        return json.dumps(out, default=str, ensure_ascii=False)


def validate_log_format(value: object, *, setting: str = "log format") -> str:
    """``"text"`` or ``"json"``; anything else is a :class:`ConfigError` naming ``setting``."""
    if value not in LOG_FORMATS:
        raise ConfigError(f"invalid {setting} {value!r}: expected 'text' or 'json'")
    return str(value)


def install_log_handler(log_format: str, *, level: int = logging.INFO,
                        logger: str = "anarchon", stream: TextIO | None = None,
                        replace: bool = False) -> logging.Handler:
    """Send ``logger``'s lines (``anarchon.*``) to ``stream`` (stderr) in ``log_format``.

    With ``replace`` the logger's own handlers are dropped and its lines no longer
    propagate to the root logger, so each line is written once, in this format, whatever
    else the process configured (``--log-format json`` asks for exactly that).
    """
    validate_log_format(log_format)
    handler = logging.StreamHandler(stream if stream is not None else sys.stderr)
    handler.setFormatter(JsonFormatter() if log_format == "json"
                         else logging.Formatter(TEXT_FORMAT))
    target = logging.getLogger(logger)
    if replace:
        for old in list(target.handlers):
            target.removeHandler(old)
        target.propagate = False
    target.addHandler(handler)
    target.setLevel(level)
    return handler

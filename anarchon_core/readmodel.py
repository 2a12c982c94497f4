"""How history is read, the same on every backend: status rule, meta, cursors and paging.

* :func:`read_status`: an attempt still ``running`` whose lease has expired (by the store's
  clock) reads ``interrupted``: its runner is gone even if no backup has taken over yet.
  :data:`STATUS_SQL` is the same rule as a SQL expression, for filters inside a query.
  Every read path of every backend goes through one of the two.
* ``meta`` is stored as compact JSON (:func:`dump_meta` / :func:`load_meta`).
* :class:`RunPage` cursors are opaque strings holding the key ``(slot, job, manual,
  attempt)`` of the last run of a page; the next page holds the runs whose key is smaller
  (keyset pagination), so runs written meanwhile never shift a page not read yet.
* :func:`page_jobs` builds a page for the stores that read history one job at a time
  (Redis, RabbitMQ, NATS, memory): it merges the jobs' runs newest first and applies the
  filters before the limit.
"""

from __future__ import annotations

import base64
import binascii
import json
import logging
from collections import deque
from collections.abc import Awaitable, Callable, Iterable, Mapping

from .backends.storeerrors import CorruptRecords
from .errors import ConfigError
from .models import RUN_STATUSES, HistoryQuery, Run, RunPage, validate_meta

__all__ = [
    "EXPIRED_READ", "MAX_PAGE", "STATUS_SQL", "JobReader", "RunKey", "decode_cursor",
    "dump_meta", "encode_cursor", "finish_page", "history_reader", "load_meta", "matches",
    "page_jobs", "read_status", "run_key", "validate_query",
]

log = logging.getLogger("anarchon.history")
#: Unreadable stored meta is reported once per record (history is read over and over).
corrupt_records = CorruptRecords(log)

#: The error an expired running attempt reads with.
EXPIRED_READ = "lease expired: the runner is gone"
#: ``{now}`` is the store clock (ms); the expression is the status as history reads it.
STATUS_SQL = ("(CASE WHEN status = 'running' AND lease_until IS NOT NULL "
              "AND lease_until <= {now} THEN 'interrupted' ELSE status END)")
#: The largest page :meth:`Backend.runs` returns.
MAX_PAGE = 1_000
_STATUSES = frozenset(RUN_STATUSES)
_CURSOR_PREFIX = "r1."

#: ``(slot, job, manual, attempt)``: the order of history, newest first when descending.
RunKey = tuple[int, str, int, int]


def read_status(status: str, error: str | None, lease_until_ms: int | None,
                now_ms: int) -> tuple[str, str | None]:
    """The status and error of an attempt as history reports them (see the module)."""
    if status == "running" and lease_until_ms is not None and lease_until_ms <= now_ms:
        return "interrupted", error or EXPIRED_READ
    return status, error


def dump_meta(meta: Mapping[str, str] | None) -> str | None:
    """Validate ``meta`` and encode it as compact JSON; None when it is empty."""
    checked = validate_meta(meta)
    if not checked:
        return None
    return json.dumps(checked, separators=(",", ":"), ensure_ascii=False, sort_keys=True)


def load_meta(text: object) -> dict[str, str]:
    """Decode stored meta (JSON text, or None/"" for none); unreadable meta reads empty.

    Unreadable meta is logged at WARNING once per record (not on every read of it).
    """
    if text is None or text == "":
        return {}
    try:
        value = json.loads(text) if isinstance(text, str | bytes) else text
    except (ValueError, TypeError, RecursionError):
        value = None
    if isinstance(value, dict) and all(isinstance(k, str) and isinstance(v, str)
                                       for k, v in value.items()):
        return value
    corrupt_records.report("run meta", None, str(text), "unreadable meta; it reads empty")
    return {}


def run_key(run: Run) -> RunKey:
    """The key history is ordered by (descending)."""
    return (run.slot, run.job, int(run.manual), run.attempt)


def encode_cursor(run: Run) -> str:
    """The cursor of the page after ``run``."""
    raw = json.dumps(list(run_key(run)), separators=(",", ":"), ensure_ascii=False)
    return _CURSOR_PREFIX + base64.urlsafe_b64encode(raw.encode()).decode().rstrip("=")


def decode_cursor(cursor: str | None) -> RunKey | None:
    """The key a cursor holds; ConfigError if it is not a cursor of :meth:`Backend.runs`."""
    if cursor is None:
        return None
    try:
        if not isinstance(cursor, str) or not cursor.startswith(_CURSOR_PREFIX):
            raise ValueError("no cursor prefix")
        body = cursor[len(_CURSOR_PREFIX):]
        value = json.loads(base64.urlsafe_b64decode(body + "=" * (-len(body) % 4)))
        slot, job, manual, attempt = value
        if not (isinstance(slot, int) and isinstance(job, str) and manual in (0, 1)
                and isinstance(attempt, int)):
            raise ValueError("bad fields")
    except (ValueError, TypeError, binascii.Error, UnicodeDecodeError):
        raise ConfigError(
            f"invalid history cursor {str(cursor)[:80]!r}: pass the cursor of a page "
            "(RunPage.cursor) unchanged"
        ) from None
    return slot, job, manual, attempt


def validate_query(query: HistoryQuery) -> RunKey | None:
    """Check a history query; return its cursor's key. ConfigError on a bad field."""
    limit = query.limit
    if isinstance(limit, bool) or not isinstance(limit, int) or not 1 <= limit <= MAX_PAGE:
        raise ConfigError(f"invalid limit {limit!r}: expected an int from 1 to {MAX_PAGE}")
    if query.status is not None and query.status not in _STATUSES:
        raise ConfigError(f"invalid status {query.status!r}: expected one of "
                          f"{', '.join(sorted(_STATUSES))}")
    for name in ("job", "runner"):
        value = getattr(query, name)
        if value is not None and not isinstance(value, str):
            raise ConfigError(f"invalid {name} {value!r}: expected a str")
    return decode_cursor(query.before)


def matches(run: Run, query: HistoryQuery) -> bool:
    """Whether ``run`` passes the query's job, status and runner filters."""
    return ((query.job is None or run.job == query.job)
            and (query.status is None or run.status == query.status)
            and (query.runner is None or run.runner == query.runner))


def finish_page(runs: list[Run], limit: int) -> RunPage:
    """A page of the first ``limit`` runs; a cursor when there were more."""
    if len(runs) > limit:
        return RunPage(runs[:limit], encode_cursor(runs[limit - 1]))
    return RunPage(runs, None)


#: ``read(job, n)``: about the newest ``n`` attempts of ``job``, newest first, and whether
#: that is all the store holds of the job.
JobReader = Callable[[str, int], Awaitable[tuple[list[Run], bool]]]
_MAX_READ = 10_000_000


class _JobRuns:
    """The runs of one job below a key, newest first, read in growing batches."""

    def __init__(self, job: str, read: JobReader, below: RunKey | None, n: int) -> None:
        self.job, self.read, self.below, self.n = job, read, below, n
        self.buffer: deque[Run] = deque()
        self.complete = False

    async def fill(self) -> None:
        while not self.buffer and not self.complete:
            runs, self.complete = await self.read(self.job, self.n)
            if not self.complete and len(runs) < self.n:
                self.complete = True
            if not self.complete and runs:
                # The oldest run of a partial read may miss attempts: read it next time.
                oldest = min(r.slot for r in runs)
                runs = [r for r in runs if r.slot > oldest]
            fresh = sorted((r for r in runs if self.below is None or run_key(r) < self.below),
                           key=run_key, reverse=True)
            self.buffer.extend(fresh)
            self.n *= 4
            if self.n > _MAX_READ:
                self.complete = True

    def pop(self) -> Run:
        run = self.buffer.popleft()
        self.below = run_key(run)
        return run


async def page_jobs(jobs: Iterable[str], read: JobReader, query: HistoryQuery) -> RunPage:
    """One page of history across ``jobs`` (see :meth:`Backend.runs`), from per-job reads."""
    below = validate_query(query)
    wanted = query.limit + 1
    names = [query.job] if query.job is not None else sorted(set(jobs))
    streams = [_JobRuns(job, read, below, max(2 * wanted, 20)) for job in names]
    for stream in streams:
        await stream.fill()
    out: list[Run] = []
    while len(out) < wanted:
        live = [s for s in streams if s.buffer]
        if not live:
            break
        best = max(live, key=lambda s: run_key(s.buffer[0]))
        run = best.pop()
        if not best.buffer:
            await best.fill()
        if matches(run, query):
            out.append(run)
    return finish_page(out, query.limit)


def history_reader(history: Callable[[str, int], Awaitable[list[Run]]]) -> JobReader:
    """A :data:`JobReader` from a backend's ``history(job, limit)``."""

    async def read(job: str, n: int) -> tuple[list[Run], bool]:
        runs = await history(job, n)
        return runs, len(runs) < n

    return read


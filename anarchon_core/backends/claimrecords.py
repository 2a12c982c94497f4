"""Claim and result records of the claim-only backends, as flat string dicts.

A claim-only backend (RabbitMQ, NATS, the Redis ``stream-id``/``idmp``/``script``
strategies) keeps history as two kinds of append-only records:

* a **claim** record, written by the winner of a run: who runs it and since when;
* a **result** record, written by :meth:`~anarchon_core.backend.Backend.finish` (or for
  a slot skipped as late): how it ended.

Both are flat ``dict[str, str]`` so that every store can hold them as they are: Redis
stream fields, a JSON object in a RabbitMQ or NATS message body. This module is the one
place that knows their fields; it does no I/O. :func:`runs_from_records` merges what a
store returns into :class:`~anarchon_core.models.Run` objects, one per run.

Fields (all strings):

==========  ======  ======  ==============================================================
field       claim   result  meaning
==========  ======  ======  ==============================================================
``v``       yes     yes     record version (``"1"``)
``kind``    yes     yes     ``"claim"`` or ``"result"``
``job``     yes     yes     job name
``slot``    yes     yes     slot, integer ms since the epoch
``manual``  yes     yes     ``"1"`` for a :meth:`run_now` run, else ``"0"``
``token``   yes     yes     the winning claim's token (ties a result to its claim)
``runner``  yes     yes     instance id of the winner (``""`` if the finisher lost it)
``at``      yes     yes     claim: when it was claimed; result: when it ended (ms)
``started`` no      yes     when the run was claimed (ms; ``""`` if unknown)
``status``  no      yes     ``success``, ``failed``, ``interrupted`` or ``skipped``
``error``   no      opt.    error text (absent when there is none)
``meta``    no      opt.    the run's meta as JSON text (absent when empty)
==========  ======  ======  ==============================================================
"""

from __future__ import annotations

import json
import logging
from collections.abc import Iterable, Mapping
from dataclasses import dataclass

from ..errors import StoreError
from ..models import FINISHED_STATUSES, ClaimRequest, Run, RunRef
from ..readmodel import load_meta
from ..records import record_ms, record_text
from ..schedules import ms_to_datetime
from .storeerrors import CorruptRecords

__all__ = [
    "RECORD_VERSION",
    "ClaimRecord",
    "ResultRecord",
    "claim_record",
    "decode_json",
    "encode_json",
    "parse_many",
    "parse_record",
    "result_record",
    "runs_from_records",
]

log = logging.getLogger("anarchon.claimrecords")
#: Records a store holds that anarchon cannot read: reported once each, then skipped.
corrupt_records = CorruptRecords(log)

#: Version of the record layout. Readers skip records of a version they do not know.
RECORD_VERSION = "1"
_RESULT_STATUSES = FINISHED_STATUSES


@dataclass(frozen=True)
class ClaimRecord:
    """A decoded claim record: ``runner`` won ``(job, slot, manual)`` at ``at_ms``."""

    job: str
    slot: int
    manual: bool
    token: str
    runner: str
    at_ms: int


@dataclass(frozen=True)
class ResultRecord:
    """A decoded result record: how the run claimed with ``token`` ended."""

    job: str
    slot: int
    manual: bool
    token: str
    runner: str
    started_ms: int | None
    at_ms: int
    status: str
    error: str | None
    meta: str | None = None


Record = ClaimRecord | ResultRecord


def claim_record(request: ClaimRequest, at_ms: int) -> dict[str, str]:
    """Return the claim record of ``request``, won at ``at_ms``."""
    return {
        "v": RECORD_VERSION, "kind": "claim", "job": request.job, "slot": str(request.slot),
        "manual": "1" if request.manual else "0", "token": request.token,
        "runner": request.runner, "at": str(at_ms),
    }


def result_record(
    ref: RunRef, *, status: str, error: str | None, runner: str, started_ms: int | None,
    at_ms: int, meta: str | None = None,
) -> dict[str, str]:
    """Return the result record of the run ``ref``: ``status`` (and ``error``) at ``at_ms``."""
    if status not in _RESULT_STATUSES:
        raise ValueError(f"invalid result status {status!r}")
    record = {
        "v": RECORD_VERSION, "kind": "result", "job": ref.job, "slot": str(ref.slot),
        "manual": "1" if ref.manual else "0", "token": ref.token, "runner": runner,
        "started": "" if started_ms is None else str(started_ms), "at": str(at_ms),
        "status": status,
    }
    if error is not None:
        record["error"] = error
    if meta:
        record["meta"] = meta
    return record


def encode_json(record: Mapping[str, str]) -> bytes:
    """Encode a record as a compact JSON object (message bodies)."""
    return json.dumps(dict(record), separators=(",", ":"), ensure_ascii=False).encode()


def decode_json(body: bytes) -> dict[str, str]:
    """Decode a JSON message body into a flat dict; StoreError if it is not one."""
    try:
        value = json.loads(body)
    except (ValueError, RecursionError) as exc:  # bad UTF-8 or JSON, nesting too deep
        raise StoreError(f"not an anarchon record (invalid JSON: {type(exc).__name__})") \
            from None
    if not isinstance(value, dict) or not all(
        isinstance(k, str) and isinstance(v, str) for k, v in value.items()
    ):
        raise StoreError("not an anarchon record (expected a JSON object of strings)")
    return value


def _text(value: object) -> object:
    return value.decode() if isinstance(value, bytes) else value


#: The longest job name, token, runner or error text a record may hold.
_MAX_TEXT = 1_000_000


def parse_record(fields: Mapping[str, str] | Mapping[bytes, bytes]) -> Record:
    """Decode a record (``str`` or ``bytes`` keys and values, as Redis returns them).

    Raises :class:`StoreError` for anything that is not a record this version reads: an
    unknown version, kind or status, a missing field, a value of the wrong type, bad text,
    or a number out of range (a slot or time a datetime cannot hold, a negative time).
    """
    try:
        data = {_text(k): _text(v) for k, v in fields.items()}
    except (UnicodeDecodeError, AttributeError, TypeError) as exc:
        raise StoreError(f"malformed anarchon record: {exc!r}") from None
    if data.get("v") != RECORD_VERSION:
        raise StoreError(f"unknown record version {str(data.get('v'))[:40]!r}")
    try:
        job, token, runner = (record_text(data[name], name, limit=_MAX_TEXT)
                              for name in ("job", "token", "runner"))
        slot = record_ms(data["slot"], "slot")
        at_ms = record_ms(data["at"], "at", lo=0)
        manual = record_text(data["manual"], "manual", limit=1) == "1"
        kind = data["kind"]
        if kind == "claim":
            return ClaimRecord(job, slot, manual, token, runner, at_ms)
        if kind == "result":
            status = record_text(data["status"], "status", limit=100)
            if status not in _RESULT_STATUSES:
                raise StoreError(f"unknown result status {status[:40]!r}")
            started = record_ms(data["started"], "started", lo=0) \
                if data.get("started") else None
            error, meta = (None if data.get(name) is None
                           else record_text(data[name], name, limit=_MAX_TEXT)
                           for name in ("error", "meta"))
            return ResultRecord(job, slot, manual, token, runner, started, at_ms, status,
                                error, meta)
    except (KeyError, ValueError) as exc:
        raise StoreError(f"malformed anarchon record: {exc!r}") from None
    raise StoreError(f"unknown record kind {str(kind)[:40]!r}")


def runs_from_records(records: Iterable[Record], limit: int | None = None) -> list[Run]:
    """Merge claim and result records into one :class:`Run` per run, newest first.

    A claim without a result is ``running`` (a claim-only store cannot tell a live run
    from one whose runner died). A result without its claim (the claim record was lost)
    still makes a run from what the result carries. Several records of one run are
    merged; the first claim record and the first result record seen win. Ordered like
    every backend's history: slot, then manual, descending.
    """
    claims: dict[tuple[int, bool, str], ClaimRecord] = {}
    results: dict[tuple[int, bool, str], ResultRecord] = {}
    for record in records:
        key = (record.slot, record.manual, record.token)
        if isinstance(record, ClaimRecord):
            claims.setdefault(key, record)
        else:
            results.setdefault(key, record)
    runs: list[Run] = []
    for key in claims.keys() | results.keys():
        claim, result = claims.get(key), results.get(key)
        started = claim.at_ms if claim is not None else (
            result.started_ms if result is not None else None)
        base = claim or result
        assert base is not None
        runner = (claim.runner if claim is not None else "") or (
            result.runner if result is not None else "")
        runs.append(Run(
            job=base.job, slot=base.slot, attempt=1,
            status=result.status if result is not None else "running",
            runner=runner,
            started_at=ms_to_datetime(started) if started is not None else None,
            finished_at=ms_to_datetime(result.at_ms) if result is not None else None,
            error=result.error if result is not None else None, manual=base.manual,
            meta=load_meta(result.meta) if result is not None else {},
        ))
    runs.sort(key=lambda r: (r.slot, r.manual, r.started_at or ms_to_datetime(0)),
              reverse=True)
    return runs if limit is None else runs[:limit]


def parse_many(items: Iterable[Mapping[str, str] | Mapping[bytes, bytes]], *,
               key: str = "history", job: str = "") -> list[Record]:
    """Decode records, skipping anything that is not a record.

    Each skipped record is reported once (a warning naming ``key`` and ``job``).
    """
    records: list[Record] = []
    for fields in items:
        try:
            records.append(parse_record(fields))
        except StoreError as exc:
            corrupt_records.report(key, job, repr(dict(fields)), str(exc))
    return records

"""Property-based: every decoder of store data returns a value or raises its corrupt-record error.

Random bytes, texts, JSON (huge and non-finite numbers, wrong types, deep nesting) and
numbers go into each decoder of records read from a store: the control records (pauses,
instances, job definitions), SQL history rows and scans, Redis run records and stored
meta. A decoder of one record may raise only :class:`CorruptRecordError` (or the error its
caller turns into one); a reader of many records never raises and returns only values
that the rest of anarchon can use (instants a datetime can hold).
"""

from __future__ import annotations

import json
from collections.abc import Generator
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from anarchon_core.backends import claimrecords
from anarchon_core.backends.redis import claims, lease
from anarchon_core.backends.sqlstore import (
    expired_steps,
    newest_slots_steps,
    rows_to_runs,
)
from anarchon_core.errors import CorruptRecordError, StoreError
from anarchon_core.fleet import (
    InstanceInfo,
    JobDefinition,
    PauseInfo,
    assemble,
    decode_jobs,
)
from anarchon_core.models import RUN_STATUSES
from anarchon_core.readmodel import load_meta
from anarchon_core.records import record_int, record_map, record_ms, record_text
from anarchon_core.schedules import ms_to_datetime
from anarchon_core.slots import MAX_SLOT, MIN_SLOT

pytestmark = pytest.mark.filterwarnings("ignore::pytest.PytestUnraisableExceptionWarning")

PROFILE = settings(max_examples=300, deadline=None,
                   suppress_health_check=[HealthCheck.too_slow])

numbers = st.one_of(
    st.integers(min_value=-(10**40), max_value=10**40),
    st.integers(min_value=-5, max_value=2 * 10**12),
    st.floats(allow_nan=True, allow_infinity=True),
    st.sampled_from([1e400, -1e400, float("nan"), 10**30, -1, 0, MAX_SLOT + 1, 2**63]),
)
scalars = st.one_of(st.none(), st.booleans(), numbers, st.text(max_size=30),
                    st.sampled_from(["abc", "1e400", "NaN", "12", "-3", "²", " 7"]))
json_values = st.recursive(
    scalars,
    lambda inner: st.one_of(st.lists(inner, max_size=4),
                            st.dictionaries(st.text(max_size=10), inner, max_size=5)),
    max_leaves=20)
#: Objects with the field names anarchon's records use, holding anything.
FIELDS = ["by", "at", "reason", "version", "started", "seen", "expires", "jobs", "schedule",
          "digest", "spec", "every", "offset", "cron", "tz", "a", "s", "t", "r", "b", "f",
          "l", "e", "m"]
records = st.dictionaries(st.sampled_from(FIELDS), json_values, max_size=8)
jobs_records = st.dictionaries(
    st.text(max_size=10),
    st.one_of(json_values, st.fixed_dictionaries(
        {"schedule": json_values, "digest": json_values},
        optional={"spec": st.one_of(json_values, st.dictionaries(
            st.sampled_from(["every", "offset", "cron", "tz"]), json_values))})),
    max_size=4)


def dumped(value: object) -> str:
    return json.dumps(value, allow_nan=True)


texts = st.one_of(
    st.text(max_size=60),
    st.binary(max_size=60).map(lambda b: b.decode("utf-8", "replace")),
    json_values.map(dumped), records.map(dumped), jobs_records.map(dumped),
    st.just("[" * 3_000 + "]" * 3_000),  # deeper than json.loads recurses
)


def in_range(ms: int | None) -> bool:
    return ms is None or MIN_SLOT <= ms <= MAX_SLOT


@PROFILE
@given(value=st.one_of(json_values, st.binary(max_size=20)))
def test_field_readers_raise_only_value_error(value: Any) -> None:
    for read in (lambda v: record_int(v, "x", -10, 10**13), lambda v: record_ms(v, "x"),
                 lambda v: record_text(v, "x", limit=10), lambda v: record_map(v, "x")):
        try:
            got = read(value)
        except ValueError:
            continue
        if isinstance(got, int):
            assert not isinstance(got, bool)
            assert got >= min(-10, MIN_SLOT)
            assert got <= max(10**13, MAX_SLOT)


@PROFILE
@given(text=texts)
def test_control_record_decoders_return_a_value_or_raise_corrupt_record(text: str) -> None:
    keys = []
    try:
        pause = PauseInfo.decode("job", text)
        assert 0 <= pause.at_ms <= MAX_SLOT
        assert isinstance(pause.by, str)
    except CorruptRecordError as exc:
        keys.append(exc.key)
    try:
        info = InstanceInfo.decode("i", text)
        for ms in (info.started_at_ms, info.seen_at_ms, info.expires_at_ms):
            ms_to_datetime(ms)
    except CorruptRecordError as exc:
        keys.append(exc.key)
    try:
        for definition in decode_jobs("i", text):
            assert in_range(definition.next_slot(1_796_000_000_000))
    except CorruptRecordError as exc:
        keys.append(exc.key)
    assert set(keys) <= {"paused:job", "instance:i", "jobs:i"}


@PROFILE
@given(spec=st.dictionaries(st.sampled_from(["every", "offset", "cron", "tz", "dst"]),
                            json_values),
       after=st.integers(MIN_SLOT, MAX_SLOT))
def test_a_job_definition_next_slot_is_a_slot_or_none(spec: dict[str, Any], after: int) -> None:
    assert in_range(JobDefinition("j", "?", "d", spec).next_slot(after))


@PROFILE
@given(instances=st.dictionaries(st.text(max_size=5), texts, max_size=3),
       jobs=st.dictionaries(st.text(max_size=5), texts, max_size=3),
       paused=st.dictionaries(st.text(max_size=5), texts, max_size=3))
def test_the_fleet_view_is_built_and_shown_from_any_records(
        instances: dict[str, str], jobs: dict[str, str], paused: dict[str, str]) -> None:
    view, stale = assemble(1_796_000_000_000, instances, jobs, paused, {})
    view.format()
    assert all(isinstance(name, str) for name in stale)


row_values = st.one_of(scalars, st.binary(max_size=8))


@PROFILE
@given(rows=st.lists(st.tuples(*[row_values] * 11), max_size=5),
       good=st.booleans())
def test_sql_history_rows_never_raise(rows: list[tuple[Any, ...]], good: bool) -> None:
    if good:
        rows.append(("job", 1_796_000_000_000, 1, "success", "r", 1, 2, None, 0, None, None))
    runs = rows_to_runs(rows, 1_796_000_000_000)
    for run in runs:
        assert in_range(run.slot)
        assert isinstance(run.job, str)
    if good:
        assert any(r.slot == 1_796_000_000_000 for r in runs)


def drive(steps: Generator[Any, Any, Any], *answers: Any) -> Any:
    """Run a SQL steps generator, answering each yield with the next of ``answers``."""
    next(steps)
    try:
        for answer in answers:
            steps.send(answer)
    except StopIteration as done:
        return done.value
    raise AssertionError("the steps wanted more answers")


@PROFILE
@given(newest=st.lists(row_values, min_size=2, max_size=2),
       expired=st.lists(st.tuples(*[row_values] * 4), max_size=4))
def test_sql_scans_never_raise(newest: list[Any], expired: list[tuple[Any, ...]]) -> None:
    slots = drive(newest_slots_steps(["a", "b"]), [[(v,)] for v in newest])
    assert set(slots) == {"a", "b"}
    assert all(in_range(s) for s in slots.values())
    runs = drive(expired_steps("a", 10), [(1_796_000_000_000,)], expired)
    assert all(in_range(r.slot) and in_range(r.lease_until_ms) for r in runs)


@PROFILE
@given(text=texts, slot=st.integers(MIN_SLOT, MAX_SLOT))
def test_redis_run_records_are_read_or_unreadable(text: str, slot: int) -> None:
    try:
        rec = lease._record(text)
        run = lease._run("job", slot, False, rec, status=str(rec["s"]), error=None)
    except lease._UNREADABLE:
        return
    assert run.attempt >= 1


@PROFILE
@given(value=st.one_of(st.none(), texts, json_values))
def test_stored_meta_is_read_or_a_store_error(value: Any) -> None:
    try:
        meta = load_meta(value)
    except StoreError:
        return
    assert all(isinstance(k, str) and isinstance(v, str) for k, v in meta.items())


#: Field values as a store could hold them: numbers as text (huge, non-finite, negative),
#: any JSON value, bytes that may not be UTF-8.
field_values = st.one_of(
    numbers.map(str), scalars, json_values, st.binary(max_size=8),
    st.sampled_from(["1e400", "NaN", "inf", "-5", "1_000", " 7", "\u00b2", "", "0", "1"]),
)
_CLAIM = {"v": "1", "kind": "claim", "job": "j", "slot": "1796000000000", "manual": "0",
          "token": "t", "runner": "r", "at": "1796000000100"}
_RESULT = {**_CLAIM, "kind": "result", "started": "1796000000100", "at": "1796000000900",
           "status": "success", "error": "boom", "meta": '{"k": "v"}'}
#: Claim and result records of the claim-only stores with some fields replaced.
claim_records = st.builds(
    lambda base, changed: {**base, **changed}, st.sampled_from([_CLAIM, _RESULT]),
    st.dictionaries(st.sampled_from([*_RESULT, "other"]), field_values, max_size=3))
bodies = st.one_of(
    st.binary(max_size=60), texts.map(str.encode),
    claim_records.map(lambda r: json.dumps(r, default=repr, allow_nan=True).encode()),
    st.just(b"[" * 100_000 + b"]" * 100_000))


def check_runs(runs: list[Any]) -> None:
    """Runs the rest of anarchon can use: known statuses, times a datetime holds."""
    for run in runs:
        assert run.status in RUN_STATUSES
        assert in_range(run.slot)
        assert isinstance(run.job, str)
        assert isinstance(run.runner, str)
        assert run.error is None or isinstance(run.error, str)
        assert run.started_at is None or run.started_at.year >= 1970
        assert run.finished_at is None or run.finished_at.year >= 1970
        assert all(isinstance(k, str) and isinstance(v, str) for k, v in run.meta.items())


@PROFILE
@given(body=bodies)
def test_claim_only_message_bodies_decode_or_raise_store_error(body: bytes) -> None:
    try:
        fields = claimrecords.decode_json(body)
    except StoreError:
        return
    assert all(isinstance(k, str) and isinstance(v, str) for k, v in fields.items())


@PROFILE
@given(items=st.lists(st.one_of(claim_records, st.dictionaries(
    st.one_of(st.text(max_size=5), st.binary(max_size=5)), field_values, max_size=4)),
    max_size=6))
def test_claim_only_records_parse_or_are_skipped(items: list[dict[Any, Any]]) -> None:
    for fields in items:
        try:
            record = claimrecords.parse_record(fields)
        except StoreError:
            continue
        assert in_range(record.slot)
        assert 0 <= record.at_ms <= MAX_SLOT
        assert isinstance(record.job, str)
        assert isinstance(record.runner, str)
    records = claimrecords.parse_many(items, key="history", job="j")
    check_runs(claimrecords.runs_from_records(records))


flat_entries = st.lists(st.one_of(field_values, st.sampled_from(["slot", "token", "runner",
                                                                  "at"])), max_size=8)
stream_entries = st.lists(st.one_of(
    st.tuples(st.sampled_from(["1796000000000-0", "5-1", "x", "-1-0"]), flat_entries),
    st.tuples(st.just("1796000000000-0"), st.builds(
        lambda v: ["slot", v, "token", "t", "runner", "r"], field_values)),
    json_values), max_size=5)
result_texts = st.one_of(texts, records.map(dumped), st.builds(
    lambda s, f, e, m: dumped({"t": "t", "s": s, "f": f, "e": e, "m": m}),
    st.one_of(st.sampled_from(["success", "failed", "skipped", "running", "zombie"]),
              json_values), field_values.filter(lambda v: not isinstance(v, bytes)),
    json_values, json_values))


@PROFILE
@given(entries=stream_entries, manual=st.booleans(), results=st.lists(result_texts,
                                                                     max_size=5))
def test_redis_claim_only_entries_and_results_are_read_or_skipped(
        entries: list[Any], manual: bool, results: list[str]) -> None:
    for claim in claims._entries("j", "runs", entries, manual):
        assert in_range(claim["slot"])
        assert 0 <= claim["at"] <= MAX_SLOT
        assert isinstance(claim["runner"], str)
    for text in results:
        result = claims._result("j", "results", text)
        if result:
            assert result["s"] in RUN_STATUSES
            assert result["f"] is None or 0 <= result["f"] <= MAX_SLOT
            assert result["e"] is None or isinstance(result["e"], str)

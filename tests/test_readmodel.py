"""The public SQL schema, history cursors and the SQLite upgrade and read-only paths."""

from __future__ import annotations

import sqlite3
from contextlib import closing
from pathlib import Path

import pytest

from anarchon_core import ConfigError, HistoryQuery, Run, sql_schema
from anarchon_core.backend import new_token
from anarchon_core.backends.sqlite import SqliteBackend
from anarchon_core.errors import ReadOnlyError, StoreNotSetUp
from anarchon_core.models import ClaimRequest, RunRef
from anarchon_core.readmodel import decode_cursor, encode_cursor, read_status
from anarchon_core.url import backend_from_url

pytestmark = pytest.mark.timeout(30)


def test_sql_schema_creates_what_the_backends_use() -> None:
    statements = sql_schema("sqlite", "cron_runs")
    with closing(sqlite3.connect(":memory:")) as conn:
        for statement in statements * 2:  # idempotent
            conn.execute(statement)
        columns = [row[1] for row in conn.execute('PRAGMA table_info("cron_runs")')]
        assert columns == ["job", "slot", "manual", "attempt", "token", "status", "runner",
                           "lease_until", "started_at", "finished_at", "error", "meta"]
        assert conn.execute('SELECT value FROM "cron_runs_meta"').fetchall() == [("1",)]
    pg = sql_schema("postgresql", "shipping.cron_runs")
    assert pg[0] == 'CREATE SCHEMA IF NOT EXISTS "shipping"'
    assert '"shipping"."cron_runs_meta"' in pg[-1]
    assert not any("SCHEMA" in s for s in sql_schema("postgresql", "shipping.cron_runs",
                                                     create_schema=False))


@pytest.mark.parametrize(("dialect", "table"), [
    ("sqlite", "shipping.cron_runs"), ("postgresql", 'runs"; DROP TABLE x; --'),
    ("postgresql", "a.b.c"), ("mysql", "runs"), ("sqlite", ""),
])
def test_sql_schema_refuses_bad_names(dialect: str, table: str) -> None:
    with pytest.raises(ConfigError):
        sql_schema(dialect, table)  # type: ignore[arg-type]


def test_cursors_round_trip_and_bad_ones_are_config_errors() -> None:
    run = Run(job="report:daily ü", slot=1_700_000_000_000, attempt=2, status="success",
              runner="h:1", started_at=None, manual=True)
    cursor = encode_cursor(run)
    assert decode_cursor(cursor) == (run.slot, run.job, 1, 2)
    for bad in ("", "r1.", "r1.!!!", "x" + cursor, cursor[:-3]):
        with pytest.raises(ConfigError, match="cursor"):
            decode_cursor(bad)


def test_the_expired_lease_rule() -> None:
    assert read_status("running", None, 1000, 999) == ("running", None)
    assert read_status("running", None, 1000, 1000)[0] == "interrupted"
    assert read_status("running", "handed over", 1000, 2000) == ("interrupted", "handed over")
    assert read_status("success", None, None, 2000) == ("success", None)


async def test_sqlite_table_of_format_1_gets_the_meta_column(tmp_path: Path) -> None:
    path = tmp_path / "old.db"
    old = sql_schema("sqlite", "runs")
    with closing(sqlite3.connect(path)) as conn, conn:
        conn.execute(old[0].replace("meta TEXT, ", ""))
        for statement in old[1:]:
            conn.execute(statement)
        conn.execute("INSERT INTO runs (job, slot, manual, attempt, token, status, runner, "
                     "started_at, finished_at) VALUES ('sync', 1, 0, 1, 't', 'success', "
                     "'old', 1, 2)")
    reader = backend_from_url(f"sqlite:///{path}?table=runs&read_only=true")
    assert isinstance(reader, SqliteBackend)
    assert reader.read_only
    await reader.start()
    try:
        [run] = await reader.history("sync")
        assert (run.runner, run.meta) == ("old", {})
    finally:
        await reader.stop()
    backend = SqliteBackend(path, table="runs")
    await backend.start()
    try:
        slot = await backend.clock_ms()
        request = ClaimRequest(job="sync", slot=slot, token=new_token(), runner="new")
        assert (await backend.claim(request)).won
        assert await backend.finish(RunRef("sync", slot, request.token), "success",
                                    meta={"k": "v"})
        page = await backend.runs(HistoryQuery(job="sync"))
        assert [(r.runner, r.meta) for r in page] == [("new", {"k": "v"}), ("old", {})]
    finally:
        await backend.stop()


async def test_sqlite_read_only_creates_nothing(tmp_path: Path) -> None:
    missing = SqliteBackend(tmp_path / "none.db", read_only=True)
    with pytest.raises(StoreNotSetUp, match="never set up"):
        await missing.start()
    await missing.stop()
    assert not (tmp_path / "none.db").exists()
    SqliteBackend(tmp_path / "other.db")  # constructing creates nothing either
    with closing(sqlite3.connect(tmp_path / "empty.db")):
        pass
    empty = SqliteBackend(tmp_path / "empty.db", read_only=True)
    with pytest.raises(StoreNotSetUp, match="never set up"):
        await empty.start()
    await empty.stop()
    with closing(sqlite3.connect(tmp_path / "empty.db")) as conn:
        assert conn.execute("SELECT name FROM sqlite_master").fetchall() == []
    with pytest.raises(ReadOnlyError):
        await empty.claim(ClaimRequest(job="j", slot=1, token="t", runner="r"))

"""Read commands never write: ``anarchon history``, ``status``, ``check`` and ``jobs``, and
``python -m anarchon_celery history``, pointed at a namespace that holds no anarchon store.

Each says so in one line with exit status 1 (the store with its password masked, the
namespace looked for, the namespaces that do exist where the store lists them), and
afterwards the store holds nothing new: no SQLite file or table, no PostgreSQL table or
schema, no Redis key, no NATS stream, no RabbitMQ queue. ``Backend.namespaces()``, the
listing behind the message, is tested per store too.
"""

from __future__ import annotations

import asyncio
import sqlite3
import subprocess
import sys
import textwrap
import time
import types
import uuid
from collections.abc import Iterator
from contextlib import closing
from pathlib import Path
from typing import Any

import aio_pika
import nats
import psycopg
import pytest
import redis

from anarchon_core import Scheduler
from anarchon_core.backend import Backend
from anarchon_core.backends.postgres import PostgresBackend
from anarchon_core.backends.redis import RedisBackend
from anarchon_core.backends.sqlite import SqliteBackend
from anarchon_core.cli.main import main
from anarchon_core.errors import StoreNotSetUp

from .stores import unavailable
from .stores.postgres import POSTGRES_URL, drop_tables
from .stores.redis import SHARED_URL as REDIS_URL
from .support.helpers import RedisServer, start_redis

NATS_URL = "nats://127.0.0.1:4222"
AMQP_URL = "amqp://guest:guest@127.0.0.1:5672/"
SCRIPT = str(Path(sys.executable).with_name("anarchon"))
#: The read commands that open a store, as argument lists.
READS = {
    "history": ["history", "tick", "--timeout", "20"],
    "status": ["status", "--timeout", "20"],
    "check": ["check", "tick", "--max-silence", "3", "--timeout", "20"],
}


def ns() -> str:
    return f"r{uuid.uuid4().hex[:12]}"


def cli(capsys: pytest.CaptureFixture[str], command: str, url: str) -> str:
    """Run ``anarchon <command> --backend url`` in-process; its one error line (exit 1)."""
    code = main([*READS[command], "--backend", url])
    out = capsys.readouterr()
    assert code == 1, out
    assert out.out == ""
    lines = out.err.splitlines()
    assert len(lines) == 1, out.err
    assert lines[0].startswith(f"anarchon {command}: error: no anarchon store in "), lines[0]
    assert "never set up there" in lines[0]
    return lines[0]


def run(coro: Any) -> Any:
    return asyncio.run(coro)


async def listed(backend: Backend) -> list[str] | None:
    """``backend.namespaces()``, the backend closed again (one event loop for both)."""
    try:
        return await backend.namespaces()
    finally:
        await backend.stop()


async def set_up(backend: Backend) -> None:
    """Start and stop a writer: its namespace then holds an anarchon store."""
    try:
        await backend.start()
    finally:
        await backend.stop()


# ---------------------------------------------------------------------------- SQLite


@pytest.mark.parametrize("command", sorted(READS))
def test_a_missing_sqlite_file_is_not_created(tmp_path: Path, command: str,
                                              capsys: pytest.CaptureFixture[str]) -> None:
    line = cli(capsys, command, f"sqlite:///{tmp_path}/crn.db")
    assert f"the file '{tmp_path}/crn.db' does not exist" in line
    assert "or the path is wrong" in line
    missing_folder = cli(capsys, command, f"sqlite:///{tmp_path}/nowhere/crn.db")
    assert "does not exist" in missing_folder
    assert list(tmp_path.iterdir()) == []


def _sqlite_tables(path: Path) -> set[str]:
    with closing(sqlite3.connect(path)) as conn:
        return {row[0] for row in conn.execute("SELECT name FROM sqlite_master")}


@pytest.mark.parametrize("command", sorted(READS))
def test_a_wrong_sqlite_table_is_not_created_and_the_right_one_is_named(
        tmp_path: Path, command: str, capsys: pytest.CaptureFixture[str]) -> None:
    path = tmp_path / "cron.db"
    run(set_up(SqliteBackend(path, table="billing")))
    before = _sqlite_tables(path)
    line = cli(capsys, command, f"sqlite:///{path}?table=biling")
    assert "table 'biling' does not exist" in line
    assert line.endswith("tables with an anarchon store there: 'billing' "
                         "(--traceback for details)")
    assert _sqlite_tables(path) == before


def test_sqlite_namespaces_are_the_tables_with_a_format_record(tmp_path: Path) -> None:
    path = tmp_path / "cron.db"
    assert run(listed(SqliteBackend(path))) is None  # no file: nothing to list
    assert not path.exists()
    for table in ("b_runs", "a_runs"):
        run(set_up(SqliteBackend(path, table=table)))
    with closing(sqlite3.connect(path)) as conn, conn:
        conn.execute("CREATE TABLE notes (x)")
        conn.execute("CREATE TABLE notes_meta (name TEXT, value TEXT)")  # no format row
        conn.execute("CREATE TABLE odd (x)")
        conn.execute("CREATE TABLE odd_meta (other INTEGER)")  # not our shape at all
    # Read-only, and on a table that does not exist: the listing needs no start().
    assert run(listed(SqliteBackend(path, read_only=True))) == ["a_runs", "b_runs"]


# ---------------------------------------------------------------------------- PostgreSQL


@pytest.fixture
def pg() -> Iterator[psycopg.Connection[Any]]:
    try:
        conn = psycopg.connect(POSTGRES_URL, autocommit=True, connect_timeout=5)
    except psycopg.OperationalError as exc:
        unavailable("PostgreSQL", str(exc).strip())
        raise
    with conn:
        yield conn


def _pg_url(table: str, password: str = "S3cret-pw") -> str:
    with_password = POSTGRES_URL.replace("postgres@", f"postgres:{password}@", 1)
    return f"{with_password}{'&' if '?' in with_password else '?'}table={table}"


@pytest.mark.parametrize("command", sorted(READS))
def test_a_wrong_postgres_table_or_schema_is_not_created(
        pg: psycopg.Connection[Any], command: str, capsys: pytest.CaptureFixture[str]) -> None:
    good = ns()
    try:
        run(set_up(PostgresBackend(POSTGRES_URL, table=good)))
        for table in (f"{good}x", f"{good}_schema.cron_runs"):
            line = cli(capsys, command, _pg_url(table))
            assert f"table '{table}' does not exist" in line
            assert "S3cret-pw" not in line
            assert "postgres:***@" in line
            # The closest name comes first: the likely intended table.
            assert f"tables with an anarchon store there: '{good}'" in line
        found = pg.execute("SELECT to_regclass(%s), to_regclass(%s), "
                           "(SELECT count(*) FROM pg_namespace WHERE nspname = %s)",
                           (f"{good}x", f"{good}x_meta", f"{good}_schema")).fetchone()
        assert found == (None, None, 0)
    finally:
        drop_tables(pg, [good])


def test_postgres_namespaces_are_the_tables_with_a_format_record(
        pg: psycopg.Connection[Any]) -> None:
    # The reader's search_path is a schema of the test's own, so its tables come first
    # (the listing is bounded, and the shared database holds other tests' tables); the
    # other schema's name sorts before "public", where those tables are.
    home, away, other = f"{ns()}_home", f"a{ns()}", ns()
    try:
        pg.execute(f'CREATE SCHEMA "{home}"')
        run(set_up(PostgresBackend(POSTGRES_URL, table=f"{home}.plain")))
        run(set_up(PostgresBackend(POSTGRES_URL, table=f"{away}.runs")))
        pg.execute(f'CREATE TABLE "{home}"."{other}" (x int)')
        pg.execute(f'CREATE TABLE "{home}"."{other}_meta" (name TEXT, value TEXT)')  # no row
        url = f"{POSTGRES_URL}{'&' if '?' in POSTGRES_URL else '?'}options=-csearch_path%3D{home}"
        found = run(listed(PostgresBackend(url, table="plainx", read_only=True)))
        assert found[0] == "plain"  # on the search_path: named as the table option takes it
        assert f"{away}.runs" in found  # elsewhere: with its schema
        assert other not in found
        assert f"{home}.{other}" not in found
    finally:
        drop_tables(pg, [f"{home}.plain", f"{home}.{other}", f"{away}.runs"])
        for schema in (home, away):
            pg.execute(f'DROP SCHEMA IF EXISTS "{schema}"')


def test_a_failed_read_leaves_no_connection_open(pg: psycopg.Connection[Any]) -> None:
    """A reader that found no store is closed again, though nobody called stop()."""
    name = ns()
    url = f"{POSTGRES_URL}{'&' if '?' in POSTGRES_URL else '?'}application_name={name}"
    reader = Scheduler(PostgresBackend(url, table=name, read_only=True))

    async def read() -> None:
        with pytest.raises(StoreNotSetUp):
            await reader.history(name)

    run(read())
    # The server drops a closed session's row a moment after the client has gone.
    sessions = None
    for _ in range(50):
        sessions = pg.execute("SELECT count(*) FROM pg_stat_activity "
                              "WHERE application_name = %s", (name,)).fetchone()
        if sessions == (0,):
            break
        time.sleep(0.1)
    assert sessions == (0,)


# ---------------------------------------------------------------------------- Redis


@pytest.fixture
def rds() -> Iterator[redis.Redis]:
    client = redis.Redis.from_url(REDIS_URL, socket_timeout=5)
    try:
        client.ping()
    except redis.RedisError as exc:
        unavailable("Redis", str(exc))
    with client:
        yield client


@pytest.fixture(scope="module")
def own_redis(tmp_path_factory: pytest.TempPathFactory) -> Iterator[RedisServer]:
    """A dedicated server: what the namespace listing finds is this module's alone (the
    shared server holds every earlier run's prefixes, more than a listing shows)."""
    server = start_redis(tmp_path_factory.mktemp("own-redis"))
    try:
        yield server
    finally:
        server.stop()


@pytest.fixture
def own_rds(own_redis: RedisServer) -> Iterator[redis.Redis]:
    with redis.Redis.from_url(own_redis.url, socket_timeout=5) as client:
        yield client


def _keys(client: redis.Redis, part: str) -> list[bytes]:
    return list(client.scan_iter(match=f"*{part}*", count=1000))


@pytest.mark.parametrize("command", sorted(READS))
def test_a_wrong_redis_prefix_writes_no_key(own_rds: redis.Redis, own_redis: RedisServer,
                                             command: str,
                                             capsys: pytest.CaptureFixture[str]) -> None:
    good = ns()
    try:
        run(set_up(RedisBackend(own_redis.url, prefix=f"{good}:")))
        line = cli(capsys, command, f"{own_redis.url}?prefix={good}x:")
        assert f"there is no '{good}x:format' key in this database" in line
        assert "or the prefix is wrong" in line
        assert f"prefixes with an anarchon store there: '{good}:'" in line
        assert _keys(own_rds, f"{good}x") == []
        other_db = cli(capsys, command, f"{own_redis.url[:-1]}1?prefix={good}:")
        assert f"'{good}:'" not in other_db.partition("there:")[2]
        assert _keys(own_rds, good) == [f"{good}:format".encode()]
    finally:
        for key in _keys(own_rds, good):
            own_rds.delete(key)


def test_redis_namespaces_are_the_prefixes_with_a_format_key(own_rds: redis.Redis,
                                                            own_redis: RedisServer) -> None:
    base = ns()
    try:
        run(set_up(RedisBackend(own_redis.url, prefix=f"{base}:a:")))
        own_rds.set(f"{base}:junk:format", "html")  # some other program's key
        own_rds.hset(f"{base}:hash:format", "x", "1")
        found = run(listed(RedisBackend(own_redis.url, prefix=f"{base}:b:", read_only=True)))
        assert f"{base}:a:" in found
        assert not [p for p in found if p.startswith(f"{base}:") and p != f"{base}:a:"]
    finally:
        for key in _keys(own_rds, base):
            own_rds.delete(key)


# ---------------------------------------------------------------------------- NATS, RabbitMQ


def test_a_missing_nats_stream_is_not_created(capsys: pytest.CaptureFixture[str]) -> None:
    stream = f"R{uuid.uuid4().hex[:10].upper()}"

    async def exists() -> bool:
        try:
            nc = await nats.connect(NATS_URL, connect_timeout=5, max_reconnect_attempts=0)
        except Exception as exc:  # any failure to connect: the service is down
            unavailable("NATS", str(exc))
            raise
        try:
            await nc.jetstream().stream_info(stream)
        except nats.js.errors.NotFoundError:
            return False
        finally:
            await nc.close()
        return True

    assert not run(exists())
    for command in sorted(READS):
        line = cli(capsys, command, f"{NATS_URL}?stream={stream}")
        assert f"there is no stream '{stream}'" in line
        assert "or the stream is wrong" in line
    assert not run(exists())


def test_a_missing_rabbitmq_prefix_declares_no_queue(capsys: pytest.CaptureFixture[str]) -> None:
    prefix = f"{ns()}."

    async def format_queue_exists() -> bool:
        try:
            conn = await aio_pika.connect(AMQP_URL, timeout=5)
        except Exception as exc:  # any failure to connect: the service is down
            unavailable("RabbitMQ", str(exc))
            raise
        try:
            channel = await conn.channel()
            await channel.declare_queue(f"{prefix}format", passive=True)
        except aio_pika.exceptions.ChannelNotFoundEntity:
            return False
        finally:
            await conn.close()
        return True

    for command in sorted(READS):
        line = cli(capsys, command, f"{AMQP_URL}?prefix={prefix}")
        assert f"there is no queue '{prefix}format'" in line
        assert "guest:guest" not in line
    assert not run(format_queue_exists())


# ---------------------------------------------------------------------------- as users run it


def test_the_console_script_and_jobs_create_no_sqlite_file(tmp_path: Path) -> None:
    db = tmp_path / "cron.db"
    (tmp_path / "readjobs.py").write_text(textwrap.dedent(f"""
        from anarchon_core import Scheduler
        scheduler = Scheduler("sqlite:///{db}")
        scheduler.every("tick", "1s", print)
    """))
    jobs = subprocess.run([SCRIPT, "jobs", "readjobs:scheduler"], cwd=tmp_path,
                          capture_output=True, text=True, timeout=60, check=False)
    assert jobs.returncode == 0, jobs.stderr
    assert "tick" in jobs.stdout
    history = subprocess.run([SCRIPT, "history", "tick", "--backend", f"sqlite:///{db}"],
                             cwd=tmp_path, capture_output=True, text=True, timeout=60,
                             check=False)
    assert history.returncode == 1
    assert history.stdout == ""
    assert len(history.stderr.splitlines()) == 1
    assert "anarchon history: error: no anarchon store in SqliteBackend(" in history.stderr
    assert sorted(p.name for p in tmp_path.iterdir() if p.suffix != ".py"
                  and p.name != "__pycache__") == []


def test_celery_history_on_a_missing_prefix_exits_1_and_writes_nothing(
        rds: redis.Redis, monkeypatch: pytest.MonkeyPatch,
        capsys: pytest.CaptureFixture[str]) -> None:
    from celery import Celery  # noqa: PLC0415 - optional extra

    from anarchon_celery import __main__  # noqa: PLC0415

    prefix = f"{ns()}:"
    app = Celery("t", broker=REDIS_URL, set_as_current=False)
    app.conf.update(anarchon_prefix=prefix)
    module = types.ModuleType(f"anarchon_read_{prefix[:-1]}")
    module.app = app  # type: ignore[attr-defined]
    monkeypatch.setitem(sys.modules, module.__name__, module)
    assert __main__.main(["history", "-A", f"{module.__name__}:app", "sync"]) == 1
    err = capsys.readouterr().err
    assert f"there is no '{prefix}format' key" in err
    assert _keys(rds, prefix[:-1]) == []


def test_the_error_names_what_was_looked_for(tmp_path: Path) -> None:
    async def start() -> None:
        reader = SqliteBackend(tmp_path / "x.db", table="runs", read_only=True)
        try:
            await reader.start()
        finally:
            await reader.stop()

    with pytest.raises(StoreNotSetUp) as error:
        run(start())
    assert error.value.namespace == str(tmp_path / "x.db")
    assert error.value.existing is None

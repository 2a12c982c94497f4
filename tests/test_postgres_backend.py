"""PostgresBackend on the shared PostgreSQL: what the lease contract suite does not cover.

Namespaces (schema-qualified tables, several tables in one database), name validation,
who owns which connection, reconnection, the claim lock, creation races and index use.
"""

from __future__ import annotations

import asyncio
import json
import time
from collections.abc import Iterator
from typing import Any

import psycopg
import pytest
from psycopg import sql
from psycopg_pool import AsyncConnectionPool, ConnectionPool

from anarchon_core import backend_from_url
from anarchon_core.backend import new_token
from anarchon_core.backends.postgres import PostgresBackend
from anarchon_core.backends.postgres import backend as pg_backend
from anarchon_core.backends.postgres import connections as pg_connections
from anarchon_core.errors import ConfigError, ReadOnlyError, StoreError, StoreUnavailable
from anarchon_core.models import ClaimOutcome, ClaimRequest, HistoryQuery, RunRef
from anarchon_core.schema import sql_schema

from .stores.postgres import POSTGRES_URL, connect

pytestmark = pytest.mark.timeout(60)


def req(job: str, slot: int, runner: str = "a", **kw: Any) -> ClaimRequest:
    return ClaimRequest(job=job, slot=slot, token=new_token(), runner=runner,
                        lease_ms=kw.pop("lease_ms", 60_000), **kw)


def ref(request: ClaimRequest, attempt: int = 1) -> RunRef:
    return RunRef(request.job, request.slot, request.token, attempt, request.manual)


@pytest.fixture
def admin() -> Iterator[Any]:
    conn = connect()
    try:
        yield conn
    finally:
        conn.close()


@pytest.fixture
def cleanup(admin: Any, namespace: str) -> Iterator[None]:
    """Drops what a test made: tables named after its namespace, and its schema."""
    yield
    found = admin.execute("SELECT tablename FROM pg_tables WHERE schemaname = 'public' "
                          "AND tablename LIKE %s", (namespace + "%",)).fetchall()
    for (table,) in found:
        admin.execute(sql.SQL("DROP TABLE IF EXISTS {}").format(sql.Identifier(table)))
    admin.execute(sql.SQL("DROP SCHEMA IF EXISTS {} CASCADE").format(
        sql.Identifier(f"{namespace}_s")))


def sessions(admin: Any, application_name: str, expect: int) -> int:
    """Server sessions with this application_name, once it is ``expect`` or after 5 s
    (a server process leaves pg_stat_activity a moment after its client closed)."""
    deadline = time.monotonic() + 5
    while True:
        count = int(admin.execute(
            "SELECT count(*) FROM pg_stat_activity WHERE application_name = %s",
            (application_name,)).fetchone()[0])
        if count == expect or time.monotonic() > deadline:
            return count
        time.sleep(0.05)


# -- namespaces ---------------------------------------------------------------------------


async def test_schema_qualified_table_is_created_with_its_schema(
    admin: Any, cleanup: None, namespace: str
) -> None:
    table = f"{namespace}_s.cron_runs"
    backend = PostgresBackend(POSTGRES_URL, table=table)
    await backend.start()
    try:
        slot = await backend.clock_ms()
        r = req("sync", slot)
        assert (await backend.claim(r)).won
        assert await backend.finish(ref(r), "success")
        assert [(x.slot, x.status) for x in await backend.history("sync")] == [
            (slot, "success")]
    finally:
        await backend.stop()
    found = admin.execute(
        "SELECT tablename FROM pg_tables WHERE schemaname = %s ORDER BY 1",
        (f"{namespace}_s",)).fetchall()
    assert [t for (t,) in found] == ["cron_runs", "cron_runs_meta"]
    rows = admin.execute(sql.SQL("SELECT job, slot, status FROM {}").format(
        sql.Identifier(f"{namespace}_s", "cron_runs"))).fetchall()
    assert rows == [("sync", slot, "success")]


async def test_same_table_name_in_two_schemas_and_two_tables_never_mix(
    cleanup: None, namespace: str
) -> None:
    names = [namespace, f"{namespace}_s.{namespace}", f"{namespace}b"]
    backends = [PostgresBackend(POSTGRES_URL, table=n) for n in names]
    try:
        for b in backends:
            await b.start()
        slot = await backends[0].clock_ms()
        for i, b in enumerate(backends):
            assert (await b.claim(req("job", slot, f"r{i}"))).won, names[i]
        for i, b in enumerate(backends):
            assert [r.runner for r in await b.history("job")] == [f"r{i}"]
    finally:
        for b in backends:
            await b.stop()


@pytest.mark.parametrize("bad", ["x; drop table y", "a.b.c", "", "1abc", 'a"b', "a b",
                                 "x" * 64, ".runs", "schema."])
def test_bad_table_names_are_refused_with_the_value_in_the_message(bad: str) -> None:
    with pytest.raises(ConfigError, match="invalid table") as info:
        PostgresBackend(POSTGRES_URL, table=bad)
    assert repr(bad) in str(info.value)


def test_bad_table_in_a_url_is_refused() -> None:
    with pytest.raises(ConfigError, match="invalid table"):
        backend_from_url(f"{POSTGRES_URL}?table=x%3B%20drop%20table%20y")


@pytest.mark.parametrize("bad", [42, object(), "  ", "host=127.0.0.1 port='unterminated"])
def test_bad_connection_is_refused(bad: object) -> None:
    with pytest.raises(ConfigError, match="connection"):
        PostgresBackend(bad)  # type: ignore[arg-type]


def test_url_keeps_libpq_parameters_and_hides_the_password() -> None:
    backend = backend_from_url(
        "postgresql://app:s3cret@127.0.0.1:5432/test?application_name=my%20app"
        "&table=shipping.cron_runs&sslmode=disable")
    assert isinstance(backend, PostgresBackend)
    assert backend.table == "shipping.cron_runs"
    text = repr(backend)
    assert "s3cret" not in text
    assert "@127.0.0.1:5432/test?application_name=my%20app&sslmode=disable'" in text
    with pytest.raises(ConfigError, match="prefix"):
        backend_from_url(f"{POSTGRES_URL}?prefix=cron:")
    conninfo = PostgresBackend("host=127.0.0.1 password='a b' dbname=test")
    assert "a b" not in repr(conninfo)


async def test_postgres_scheme_alias_and_libpq_defaults(
    cleanup: None, namespace: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    backend = backend_from_url(POSTGRES_URL.replace("postgresql://", "postgres://", 1)
                               + f"?table={namespace}")
    await backend.start()
    try:
        assert (await backend.claim(req("job", await backend.clock_ms()))).won
    finally:
        await backend.stop()
    # No connection given: libpq's defaults, i.e. the PG* environment variables.
    info = psycopg.conninfo.conninfo_to_dict(POSTGRES_URL)
    for key, var in (("host", "PGHOST"), ("port", "PGPORT"), ("user", "PGUSER"),
                     ("dbname", "PGDATABASE")):
        if key in info:
            monkeypatch.setenv(var, str(info[key]))
    default = PostgresBackend(table=namespace)
    await default.start()
    try:
        assert [r.runner for r in await default.history("job")] == ["a"]
    finally:
        await default.stop()


async def test_long_table_names_get_distinct_meta_tables(
    admin: Any, cleanup: None, namespace: str
) -> None:
    long_a = (namespace + "a" * 63)[:63]
    long_b = long_a[:-1] + "b"
    for i, name in enumerate((long_a, long_b)):
        backend = PostgresBackend(POSTGRES_URL, table=name)
        await backend.start()
        try:
            slot = await backend.clock_ms()
            assert (await backend.claim(req("job", slot, f"r{i}"))).won
        finally:
            await backend.stop()
    made = admin.execute("SELECT tablename FROM pg_tables WHERE tablename LIKE %s",
                         (namespace + "%",)).fetchall()
    metas = [t for (t,) in made if t.endswith("_meta")]
    assert len(metas) == 2, made
    assert all(len(t) <= 63 for t in metas)


# -- connections: who owns what -----------------------------------------------------------


async def test_connection_opened_from_a_url_is_closed_on_stop(
    admin: Any, cleanup: None, namespace: str
) -> None:
    app = f"anarchon-{namespace}"
    backend = PostgresBackend(f"{POSTGRES_URL}?application_name={app}", table=namespace)
    await backend.start()
    assert sessions(admin, app, 1) == 1
    await backend.stop()
    assert sessions(admin, app, 0) == 0


async def test_users_async_connection_and_pool_stay_open(
    cleanup: None, namespace: str
) -> None:
    conn = await psycopg.AsyncConnection.connect(POSTGRES_URL, autocommit=True)
    pool = AsyncConnectionPool(POSTGRES_URL, min_size=1, max_size=2, open=False)
    await pool.open(wait=True, timeout=10)
    try:
        for i, client in enumerate((conn, pool)):
            backend = PostgresBackend(client, table=namespace)
            await backend.start()
            slot = await backend.clock_ms() + i
            r = req("job", slot, overlap=True)
            assert (await backend.claim(r)).won
            assert await backend.finish(ref(r), "success")
            await backend.stop()
        assert not conn.closed
        assert (await (await conn.execute("SELECT 1")).fetchone()) == (1,)
        assert not pool.closed
        async with pool.connection() as pooled:
            assert (await (await pooled.execute("SELECT 2")).fetchone()) == (2,)
        reader = PostgresBackend(pool, table=namespace)
        assert [r.status for r in await reader.history("job")] == ["success", "success"]
    finally:
        await conn.close()
        await pool.close()


async def test_users_sync_connection_and_pool_work_and_stay_open(
    cleanup: None, namespace: str
) -> None:
    conn = psycopg.connect(POSTGRES_URL)  # not autocommit: anarchon must still commit
    pool = ConnectionPool(POSTGRES_URL, min_size=1, max_size=2, open=False)
    pool.open(wait=True, timeout=10)
    try:
        for i, client in enumerate((conn, pool)):
            backend = PostgresBackend(client, table=namespace)
            await backend.start()
            slot = await backend.clock_ms() + i
            r = req("job", slot, overlap=True)
            assert (await backend.claim(r)).won
            assert await backend.heartbeat(ref(r), 30_000)
            assert await backend.finish(ref(r), "success")
            await backend.stop()
        assert not conn.closed
        assert not pool.closed
        # Another session sees both runs: they were committed, not left in a transaction.
        other = PostgresBackend(POSTGRES_URL, table=namespace)
        try:
            assert [r.status for r in await other.history("job")] == ["success", "success"]
        finally:
            await other.stop()
    finally:
        conn.close()
        pool.close()


async def test_connection_inside_a_users_transaction_is_refused(
    cleanup: None, namespace: str
) -> None:
    conn = await psycopg.AsyncConnection.connect(POSTGRES_URL)
    try:
        backend = PostgresBackend(conn, table=namespace)
        await backend.start()
        await conn.execute("SELECT 1")  # opens an implicit transaction (not autocommit)
        with pytest.raises(StoreError, match="inside a transaction"):
            await backend.claim(req("job", 1_000))
        await conn.rollback()
        assert (await backend.claim(req("job", await backend.clock_ms()))).won
    finally:
        await conn.close()


# -- failures -----------------------------------------------------------------------------


async def test_dropped_connection_is_reopened_and_the_run_goes_on(
    admin: Any, cleanup: None, namespace: str, caplog: pytest.LogCaptureFixture
) -> None:
    app = f"anarchon-{namespace}"
    backend = PostgresBackend(f"{POSTGRES_URL}?application_name={app}", table=namespace)
    await backend.start()
    try:
        slot = await backend.clock_ms()
        r = req("job", slot)
        assert (await backend.claim(r)).won
        killed = admin.execute("SELECT pg_terminate_backend(pid) FROM pg_stat_activity "
                               "WHERE application_name = %s", (app,)).fetchall()
        assert killed == [(True,)]
        # The call that finds the connection dead fails as transient (the scheduler
        # retries it, with no retry loop of the backend's own); the next one reconnects.
        with pytest.raises(StoreUnavailable) as caught:
            await backend.heartbeat(ref(r), 60_000)
        assert isinstance(caught.value.__cause__, psycopg.OperationalError)
        assert await backend.heartbeat(ref(r), 60_000)
        assert (await backend.claim(req("job", slot, "b"))).outcome is ClaimOutcome.RUNNING
        assert await backend.finish(ref(r), "success")
        assert sessions(admin, app, 1) == 1
    finally:
        await backend.stop()
    assert sessions(admin, app, 0) == 0


async def test_claim_waiting_on_a_frozen_lock_holder_fails_without_writing(
    admin: Any, cleanup: None, namespace: str
) -> None:
    """A claim that cannot commit never reports won and leaves nothing behind."""
    backend = PostgresBackend(POSTGRES_URL, table=namespace, timeout_ms=300)
    await backend.start()
    holder = connect()
    try:
        slot = await backend.clock_ms()
        holder.execute("BEGIN")
        holder.execute(backend._sql["lock_job"], {"lock_key": "job"})  # as a frozen claim
        # The holder never lets go: only the lock timeout ends the wait.
        with pytest.raises(StoreUnavailable) as caught:
            await asyncio.wait_for(backend.claim(req("job", slot)), 30)
        assert isinstance(caught.value.__cause__, psycopg.errors.LockNotAvailable)
        assert (await backend.claim(req("other-job", slot))).won, "other jobs must not wait"
        holder.execute("ROLLBACK")
        assert await backend.history("job") == []
        assert (await backend.claim(req("job", slot))).won
    finally:
        holder.close()
        await backend.stop()


async def test_heartbeat_and_finish_wait_for_a_claim_in_progress(
    admin: Any, cleanup: None, namespace: str
) -> None:
    """Finish and claim of one run are serialised: a finish racing a takeover cannot leave
    two successes. A claim that may take the run over reads it ``FOR UPDATE``; the finish
    waits for that row lock, then finds itself fenced if the claim took the run over."""
    backend = PostgresBackend(POSTGRES_URL, table=namespace)
    await backend.start()
    holder = connect()
    try:
        slot = await backend.clock_ms()
        runs = [req("job", slot + i, overlap=True) for i in range(2)]
        for r in runs:
            assert (await backend.claim(r)).won
        for r, takeover in zip(runs, (False, True), strict=True):
            holder.execute("BEGIN")
            holder.execute(backend._sql["lock_job"], {"lock_key": "job"})
            holder.execute(backend._sql["current"], {"job": "job", "slot": r.slot, "manual": 0})
            finish = asyncio.ensure_future(backend.finish(ref(r), "success"))
            await asyncio.sleep(0.3)
            assert not finish.done(), "finish did not wait for the claim's row lock"
            if takeover:  # what a claim that took the run over writes, then commits
                holder.execute(backend._sql["end_attempt"], {
                    "job": "job", "slot": r.slot, "manual": 0, "attempt": 1,
                    "status": "interrupted", "error": "lease expired", "now": slot})
            holder.execute("COMMIT" if takeover else "ROLLBACK")
            assert await asyncio.wait_for(finish, 5) is not takeover
        assert [x.status for x in await backend.history("job")] == ["interrupted", "success"]
    finally:
        holder.close()
        await backend.stop()


async def test_a_finish_racing_a_takeover_never_leaves_two_runs(
    cleanup: None, namespace: str
) -> None:
    """An expired run's finish and a backup's claim, sent at once from two instances, many
    times: each time exactly one of them wins (the run finished, or it was taken over)."""
    owner = PostgresBackend(POSTGRES_URL, table=namespace)
    backup = PostgresBackend(POSTGRES_URL, table=namespace)
    await owner.start()
    await backup.start()
    try:
        base = await owner.clock_ms()
        for i in range(30):
            r = req("job", base + i, overlap=True, lease_ms=1)
            assert (await owner.claim(r)).won
            await asyncio.sleep(0.005)  # the lease has expired: a backup may take it over
            finished, taken = await asyncio.gather(
                owner.finish(ref(r), "success"),
                backup.claim(req("job", r.slot, "b", overlap=True)))
            assert finished != taken.won, f"slot {i}: finished={finished}, claim={taken}"
            history = {(x.attempt, x.status) for x in await owner.history("job", 100)
                       if x.slot == r.slot}
            assert history == ({(1, "success")} if finished
                               else {(1, "interrupted"), (2, "running")}), history
    finally:
        await owner.stop()
        await backup.stop()


async def test_a_claim_and_a_heartbeat_are_one_message_each(
    cleanup: None, namespace: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Once the session has its claim function, a claim is one statement and one round
    trip (no BEGIN, no COMMIT), and so is a heartbeat."""
    backend = PostgresBackend(POSTGRES_URL, table=namespace)
    await backend.start()
    sent: list[str] = []
    real = psycopg.AsyncCursor.execute

    async def execute(self: Any, query: Any, *args: Any, **kw: Any) -> Any:
        sent.append(str(query))
        return await real(self, query, *args, **kw)

    try:
        slot = await backend.clock_ms()
        assert (await backend.claim(req("first", slot))).won  # creates the function
        monkeypatch.setattr(psycopg.AsyncCursor, "execute", execute)
        r = req("job", slot)
        assert (await backend.claim(r)).won
        assert await backend.heartbeat(ref(r), 60_000)
        assert (await backend.claim(req("job", slot, "b"))).outcome is ClaimOutcome.RUNNING
        assert len(sent) == 3, sent
        assert all(";" not in text and "BEGIN" not in text for text in sent), sent
        # A lone claim calls the lone claim's function, not the batch's (JSON in, rows out).
        assert "pg_temp.anarchon_claim_one_" in sent[0], sent[0]
        assert "JSON" not in sent[0], sent[0]
        assert sent[1].startswith("UPDATE")
        # Claims made together: the first goes alone, the two made meanwhile share one
        # call of the batch function.
        sent.clear()
        results = await backend.claim_many([req(f"many{i}", slot) for i in range(3)])
        assert all(not isinstance(r, BaseException) and r.won for r in results), results
        assert "pg_temp.anarchon_claim_one_" in sent[0], sent
        batch = [text for text in sent if "AS JSON" in text]
        assert len(batch) == 1, sent
        assert "many1" in batch[0], batch
        assert "many2" in batch[0], batch
    finally:
        await backend.stop()


async def test_the_claim_function_lives_in_the_session_and_comes_back_after_a_reset(
    admin: Any, cleanup: None, namespace: str
) -> None:
    """The function is the session's own (pg_temp): nothing is left in the database. A
    reset that drops it (``DISCARD ALL``, as a pool may do) costs one transient error; the
    next claim creates it again."""
    conn = await psycopg.AsyncConnection.connect(POSTGRES_URL, autocommit=True)
    backend = PostgresBackend(conn, table=namespace)
    try:
        await backend.start()
        slot = await backend.clock_ms()
        assert (await backend.claim(req("a", slot))).won
        [(temp,)] = admin.execute(
            "SELECT count(*) FROM pg_proc p JOIN pg_namespace n ON n.oid = p.pronamespace "
            "WHERE p.proname LIKE 'anarchon_claim%%' AND n.nspname NOT LIKE 'pg_temp%%'"
        ).fetchall()
        assert temp == 0, "a claim function was left outside the session"
        await conn.execute("DISCARD ALL")
        with pytest.raises(StoreUnavailable, match="created again"):
            await backend.claim(req("b", slot))
        assert (await backend.claim(req("b", slot))).won
        assert (await backend.claim(req("c", slot))).won
    finally:
        await backend.stop()
        await conn.close()


async def test_transaction_pooling_keeps_nothing_in_the_server_session(
    cleanup: None, namespace: str
) -> None:
    """Behind PgBouncer in transaction mode a session's state does not last: with
    ``?transaction_pooling=true`` anarchon creates no function and prepares nothing."""
    backend = backend_from_url(f"{POSTGRES_URL}?table={namespace}&transaction_pooling=true")
    assert isinstance(backend, PostgresBackend)
    assert backend.transaction_pooling
    await backend.start()
    try:
        slot = await backend.clock_ms()
        for i in range(12):  # beyond psycopg's threshold for preparing a statement
            r = req(f"job{i % 3}", slot + i, overlap=True)
            assert (await backend.claim(r)).won
            assert await backend.heartbeat(ref(r), 60_000)
            assert await backend.finish(ref(r), "success")
        conn = backend._source.slots[0].conn  # type: ignore[attr-defined]
        cur = await conn.execute(
            "SELECT (SELECT count(*) FROM pg_proc WHERE pronamespace = pg_my_temp_schema()), "
            "(SELECT count(*) FROM pg_prepared_statements)")
        assert await cur.fetchone() == (0, 0)
    finally:
        await backend.stop()


async def test_a_session_that_keeps_losing_its_functions_falls_back(
    cleanup: None, namespace: str, caplog: pytest.LogCaptureFixture
) -> None:
    """Each loss costs one transient error (the scheduler retries); after three, claims
    stop using the functions, with one warning, and the losses stop."""
    conn = await psycopg.AsyncConnection.connect(POSTGRES_URL, autocommit=True)
    backend = PostgresBackend(conn, table=namespace)
    try:
        await backend.start()
        slot = await backend.clock_ms()
        failures = 0
        with caplog.at_level("WARNING", logger="anarchon.postgres"):
            for i in range(6):
                assert (await backend.claim(req(f"before{i}", slot))).won
                await conn.execute("DISCARD ALL")
                try:
                    assert (await backend.claim(req(f"after{i}", slot))).won
                except StoreUnavailable:
                    failures += 1
                    assert (await backend.claim(req(f"after{i}", slot))).won
        assert failures == pg_backend.MAX_VANISHED
        warnings = [rec.getMessage() for rec in caplog.records]
        assert len(warnings) == 1, warnings
        assert "transaction_pooling=True" in warnings[0]
    finally:
        await backend.stop()
        await conn.close()


async def test_a_role_that_may_not_create_temporary_objects_claims_in_two_trips(
    admin: Any, namespace: str, caplog: pytest.LogCaptureFixture
) -> None:
    """Without the TEMPORARY right the claim function cannot be made: claims fall back to
    two round trips with the same decisions, and one warning says what to grant."""
    database, role = f"{namespace}_notemp", f"{namespace}_r"
    admin.execute(sql.SQL("CREATE DATABASE {}").format(sql.Identifier(database)))
    try:
        admin.execute(sql.SQL("CREATE ROLE {} LOGIN").format(sql.Identifier(role)))
        admin.execute(sql.SQL("REVOKE TEMPORARY ON DATABASE {} FROM PUBLIC").format(
            sql.Identifier(database)))
        base = POSTGRES_URL.rsplit("/", 1)[0]
        with psycopg.connect(f"{base}/{database}", autocommit=True) as owner:
            owner.execute(sql.SQL("GRANT CREATE ON SCHEMA public TO {}").format(
                sql.Identifier(role)))
        url = f"{base}/{database}".replace("postgres@", f"{role}@", 1)
        backend = PostgresBackend(url, table="runs")
        try:
            await backend.start()
            slot = await backend.clock_ms()
            with caplog.at_level("WARNING", logger="anarchon.postgres"):
                r = req("job", slot)
                assert (await backend.claim(r)).won
                assert (await backend.claim(req("job", slot, "b"))).outcome \
                    is ClaimOutcome.RUNNING
                assert (await backend.claim(req("job", slot + 1000, "b"))).outcome \
                    is ClaimOutcome.OVERLAP
                assert await backend.finish(ref(r), "success")
                assert (await backend.claim(req("job", slot, "b"))).outcome \
                    is ClaimOutcome.DONE
            warnings = [rec.getMessage() for rec in caplog.records]
            assert len(warnings) == 1, warnings
            assert "TEMPORARY" in warnings[0]
        finally:
            await backend.stop()
    finally:
        admin.execute(sql.SQL("DROP DATABASE IF EXISTS {} WITH (FORCE)").format(
            sql.Identifier(database)))
        admin.execute(sql.SQL("DROP ROLE IF EXISTS {}").format(sql.Identifier(role)))


# -- creation and indexes -----------------------------------------------------------------


async def test_many_instances_starting_at_once_create_the_table_once(
    cleanup: None, namespace: str
) -> None:
    table = f"{namespace}_s.runs"
    backends = [PostgresBackend(POSTGRES_URL, table=table) for _ in range(8)]
    try:
        await asyncio.gather(*(b.start() for b in backends))
        slot = await backends[0].clock_ms()
        results = await asyncio.gather(*(b.claim(req("job", slot, f"r{i}"))
                                         for i, b in enumerate(backends)))
        assert [r.outcome for r in results].count(ClaimOutcome.WON) == 1
    finally:
        for b in backends:
            await b.stop()


def plan_nodes(plan: Any) -> Iterator[str]:
    yield plan["Node Type"]
    for child in plan.get("Plans", []):
        yield from plan_nodes(child)


async def test_claim_queries_use_indexes_on_a_long_history(
    admin: Any, cleanup: None, namespace: str
) -> None:
    backend = PostgresBackend(POSTGRES_URL, table=namespace)
    await backend.start()
    await backend.stop()
    runs = sql.Identifier(namespace)
    admin.execute(sql.SQL(
        "INSERT INTO {} SELECT 'job' || (i % 20), i * 1000, 0, 1, 't', 'success', 'r', NULL, "
        "i * 1000, i * 1000 + 5, NULL FROM generate_series(1, 100000) i").format(runs))
    admin.execute(sql.SQL("ANALYZE {}").format(runs))
    q = backend._sql
    key = {"job": "job3", "slot": 5_000_000, "manual": 0, "now": 5_000_000}
    for name, params in (("current", key), ("other_live", key),
                         ("history", {"job": "job3", "limit": 20}),
                         ("trim_cutoff", {"job": "job3", "keep_runs": 1000})):
        # Bound the values into the text: EXPLAIN cannot take server-side parameters.
        text = sql.SQL(q[name].replace("%(", "{").replace(")s", "}")).format(
            **{k: sql.Literal(v) for k, v in params.items()})
        (plan,) = admin.execute(sql.SQL("EXPLAIN (FORMAT JSON) ") + text).fetchone()
        plan = plan if isinstance(plan, list) else json.loads(plan)
        nodes = list(plan_nodes(plan[0]["Plan"]))
        assert "Seq Scan" not in nodes, f"{name} scans the whole table: {nodes}"


async def test_commit_whose_answer_was_lost_is_never_reported_twice(
    cleanup: None, namespace: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The connection drops after COMMIT reached the server: the call fails as transient;
    the caller's retry of the claim (same token) wins its own attempt once, and the
    retried finish sees its own result."""
    backend = PostgresBackend(POSTGRES_URL, table=namespace)
    await backend.start()
    real = pg_connections.drive_async
    lose_next = False

    async def drive(*args: Any) -> Any:
        nonlocal lose_next
        result = await real(*args)  # committed
        if lose_next:
            lose_next = False
            raise psycopg.OperationalError("server closed the connection")
        return result

    monkeypatch.setattr(pg_connections, "drive_async", drive)
    try:
        slot = await backend.clock_ms()
        r = req("job", slot)
        lose_next = True
        with pytest.raises(StoreUnavailable):
            await backend.claim(r)
        result = await backend.claim(r)
        # The retry carries the same token: the caller owns attempt 1, recorded once.
        assert (result.outcome, result.attempt) == (ClaimOutcome.WON, 1)
        assert [(x.attempt, x.status) for x in await backend.history("job")] == [(1, "running")]
        other = await backend.claim(req("job", slot))
        assert other.outcome is ClaimOutcome.RUNNING

        r2 = req("job", slot + 1, overlap=True)
        assert (await backend.claim(r2)).won
        lose_next = True
        with pytest.raises(StoreUnavailable):
            await backend.finish(ref(r2), "failed", "ValueError: x")
        assert await backend.finish(ref(r2), "failed", "ValueError: x")
        assert not await backend.finish(ref(r2), "failed", "ValueError: x"), "finished twice"
    finally:
        await backend.stop()


# ---------------------------------------------------------------- read-only, meta upgrade

async def test_read_only_backend_works_with_a_select_only_role(
    admin: Any, namespace: str, cleanup: None,
) -> None:
    writer = PostgresBackend(POSTGRES_URL, table=namespace)
    await writer.start()
    role = f"anarchon_ro_{namespace}"
    try:
        r = req("sync", await writer.clock_ms())
        assert (await writer.claim(r)).won
        assert await writer.finish(ref(r), "success", meta={"task": "42"})
        admin.execute(sql.SQL("CREATE ROLE {} LOGIN").format(sql.Identifier(role)))
        for table in (namespace, f"{namespace}_meta"):
            admin.execute(sql.SQL("GRANT SELECT ON {} TO {}").format(
                sql.Identifier(table), sql.Identifier(role)))
        as_role = POSTGRES_URL.replace("postgres@", f"{role}@", 1)
        assert as_role != POSTGRES_URL
        reader = PostgresBackend(as_role, table=namespace, read_only=True)
        await reader.start()
        try:
            [run] = await reader.history("sync")
            assert (run.status, run.meta) == ("success", {"task": "42"})
            assert [x.slot for x in await reader.runs(HistoryQuery())] == [r.slot]
            assert list(await reader.job_names()) == ["sync"]
            with pytest.raises(ReadOnlyError):
                await reader.claim(req("sync", r.slot + 1000))
        finally:
            await reader.stop()
        # the role really is read-only: a writing backend cannot even write the format row
        refused = PostgresBackend(as_role, table=namespace)
        with pytest.raises(StoreError, match=r"(?i)permission denied"):
            await refused.start()
        await refused.stop()
    finally:
        await writer.stop()
        exists = admin.execute("SELECT 1 FROM pg_roles WHERE rolname = %s", (role,)).fetchone()
        if exists:
            admin.execute(sql.SQL("DROP OWNED BY {}").format(sql.Identifier(role)))
            admin.execute(sql.SQL("DROP ROLE {}").format(sql.Identifier(role)))


async def test_a_format_1_table_gets_the_meta_column(
    admin: Any, namespace: str, cleanup: None,
) -> None:
    # The table as format 1 created it, before Run.meta existed.
    statements = sql_schema("postgresql", namespace)
    old = statements[0].replace("meta TEXT, ", "")
    assert old != statements[0]
    for statement in (old, *statements[1:]):
        admin.execute(statement)
    admin.execute(sql.SQL(
        "INSERT INTO {} (job, slot, manual, attempt, token, status, runner, started_at, "
        "finished_at) VALUES ('sync', 1000, 0, 1, 't', 'success', 'old', 1000, 2000)"
    ).format(sql.Identifier(namespace)))
    reader = PostgresBackend(POSTGRES_URL, table=namespace, read_only=True)
    await reader.start()
    try:
        [run] = await reader.history("sync")  # read-only: nothing changed, meta reads empty
        assert (run.runner, run.meta) == ("old", {})
    finally:
        await reader.stop()
    columns = "SELECT column_name FROM information_schema.columns WHERE table_name = %s"
    assert "meta" not in {c for (c,) in admin.execute(columns, (namespace,)).fetchall()}
    writer = PostgresBackend(POSTGRES_URL, table=namespace)
    await writer.start()
    try:
        assert "meta" in {c for (c,) in admin.execute(columns, (namespace,)).fetchall()}
        r = req("sync", await writer.clock_ms())
        assert (await writer.claim(r)).won
        assert await writer.finish(ref(r), "success", meta={"k": "v"})
        assert [x.meta for x in await writer.history("sync")] == [{"k": "v"}, {}]
    finally:
        await writer.stop()
    assert admin.execute(sql.SQL("SELECT value FROM {} WHERE name = 'format'").format(
        sql.Identifier(f"{namespace}_meta"))).fetchone() == ("1",)

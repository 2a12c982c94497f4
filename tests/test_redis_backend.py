"""RedisBackend/ValkeyBackend beyond the lease contract: key layout, strategies, options.

Real servers: the shared Redis 7 (own prefixes), the dedicated Valkey 8.1 and the local
Redis Cluster of tests/stores/redis.py.
"""

from __future__ import annotations

import asyncio
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import redis
from redis.crc import key_slot

from anarchon_core import Scheduler
from anarchon_core.backend import Retention, new_token
from anarchon_core.backends.redis import (
    Idmp,
    Lease,
    RedisBackend,
    Script,
    StreamId,
    ValkeyBackend,
)
from anarchon_core.backends.redis.claims import IdmpState, claim_only
from anarchon_core.backends.redis.clients import Commands, LuaScript, open_client
from anarchon_core.backends.redis.stores import ClaimOnlyStore, LeaseStore
from anarchon_core.decision import late_error
from anarchon_core.errors import (
    ConfigError,
    ReadOnlyError,
    StoreError,
    StoreFormatError,
    UnsupportedStrategyError,
)
from anarchon_core.models import ClaimOutcome, ClaimRequest, HistoryQuery, RunRef
from anarchon_core.url import backend_from_url

from .stores.redis import SHARED_URL
from .support.helpers import start_redis

pytestmark = pytest.mark.timeout(60)
ROOT = Path(__file__).resolve().parent.parent


def req(slot: int, runner: str = "a", **kw: Any) -> ClaimRequest:
    return ClaimRequest(job=kw.pop("job", "job"), slot=slot, token=new_token(), runner=runner,
                        **kw)


def ref(r: ClaimRequest, attempt: int = 1) -> RunRef:
    return RunRef(r.job, r.slot, r.token, attempt, r.manual)


@pytest.fixture
def admin() -> Any:
    with redis.Redis(port=6379, decode_responses=True) as client:
        yield client


def keys_of(admin: Any, prefix: str) -> dict[str, str]:
    found = set(admin.scan_iter(match=f"*{prefix}*", count=1000))
    return {k: admin.type(k) for k in found}


# ---------------------------------------------------------------- key layout

async def test_lease_key_layout_and_types(admin: Any, namespace: str) -> None:
    prefix = f"{namespace}:"
    backend = RedisBackend(SHARED_URL, prefix=prefix)
    await backend.start()
    try:
        now = await backend.clock_ms()
        done = req(now - 10_000, job="sync", overlap=True)
        assert (await backend.claim(done)).won
        assert await backend.finish(ref(done), "success")
        assert (await backend.claim(req(now, job="sync"))).won  # stays running
        skipped = await backend.claim(req(now - 120_000, job="sync", max_late_ms=1_000))
        assert skipped.outcome is ClaimOutcome.LATE
    finally:
        await backend.stop()
    tag = f"{{{prefix}sync}}"
    assert keys_of(admin, prefix) == {
        f"{prefix}format": "string",
        f"{prefix}jobs": "set",
        f"{tag}:state": "hash",
        f"{tag}:active": "set",
        f"{tag}:slots": "zset",
        f"{tag}:runs": "stream",
        f"{tag}:results": "zset",
    }
    assert admin.get(f"{prefix}format") == "1"
    assert admin.smembers(f"{prefix}jobs") == {"sync"}
    assert len({key_slot(k.encode()) for k in keys_of(admin, prefix) if "{" in k}) == 1
    assert admin.hlen(f"{tag}:state") == 3
    assert admin.smembers(f"{tag}:active") == {str(now)}
    assert admin.zcard(f"{tag}:slots") == 3
    assert admin.xlen(f"{tag}:runs") == 3   # one entry per attempt, skips included
    assert admin.zcard(f"{tag}:results") == 2  # the success and the skip


async def test_claim_only_key_layout_and_types(admin: Any, namespace: str) -> None:
    for strategy in ("stream-id", "script"):
        prefix = f"{namespace}{strategy}:"
        backend = RedisBackend(SHARED_URL, strategy=strategy, prefix=prefix)
        await backend.start()
        try:
            now = await backend.clock_ms()
            scheduled = req(now, job="sync")
            manual = req(now + 5, job="sync", manual=True)
            assert (await backend.claim(scheduled)).won
            assert (await backend.claim(manual)).won
            assert await backend.finish(ref(scheduled), "failed", "boom")
            assert await backend.finish(ref(manual), "success")
            runs = await backend.history("sync")
        finally:
            await backend.stop()
        assert keys_of(admin, prefix) == {
            f"{prefix}format": "string",
            f"{prefix}jobs": "set",
            f"{prefix}sync:runs": "stream",
            f"{prefix}sync:manual": "stream",
            f"{prefix}sync:results": "zset",
        }
        assert [(r.slot, r.manual, r.status, r.error) for r in runs] == [
            (now + 5, True, "success", None), (now, False, "failed", "boom")]


# ---------------------------------------------------------------- the lease script

async def test_late_skip_text_is_decision_late_error(namespace: str) -> None:
    backend = RedisBackend(SHARED_URL, prefix=f"{namespace}:")
    await backend.start()
    try:
        now = await backend.clock_ms()
        r = req(now - 5_000, max_late_ms=1_000)
        assert (await backend.claim(r)).outcome is ClaimOutcome.LATE
        [run] = await backend.history("job")
    finally:
        await backend.stop()
    assert run.started_at is not None
    claimed_ms = round(run.started_at.timestamp() * 1000)
    assert run.error == late_error(r, claimed_ms)


async def test_noscript_falls_back_to_eval(namespace: str) -> None:
    backend = RedisBackend(SHARED_URL, prefix=f"{namespace}:")
    await backend.start()
    try:
        # SCRIPT FLUSH would touch every user of the shared server, so the NOSCRIPT
        # answer comes from a wrapper; the EVAL that follows goes to the real server.
        calls: list[str] = []
        inner = backend._conn
        assert inner is not None

        async def send(args: Any) -> Any:
            calls.append(args[0])
            if args[0] == "EVALSHA":
                raise redis.exceptions.NoScriptError("No matching script.")
            return await inner.call(*args)

        conn = Commands(send, label="test", owned=False, blocking=False)
        reply = await LuaScript.load("format").run(conn, [f"{namespace}:format"], [1])
        assert str(reply) == "1"
        assert calls == ["EVALSHA", "EVAL"]
    finally:
        await backend.stop()


# ---------------------------------------------------------------- claim-only behaviour

async def test_stream_id_late_claim_for_an_earlier_slot_loses(namespace: str) -> None:
    backend = RedisBackend(SHARED_URL, strategy=StreamId(), prefix=f"{namespace}:")
    await backend.start()
    try:
        now = await backend.clock_ms()
        assert (await backend.claim(req(now))).won
        assert (await backend.claim(req(now))).outcome is ClaimOutcome.TAKEN
        # documented: an earlier slot can no longer be written once a later one was
        assert (await backend.claim(req(now - 1_000))).outcome is ClaimOutcome.TAKEN
        assert (await backend.claim(req(now + 1_000))).won
    finally:
        await backend.stop()


@pytest.mark.parametrize("strategy", ["stream-id", "script"])
async def test_claim_only_retry_with_the_same_token_still_wins(strategy: str,
                                                               namespace: str) -> None:
    backend = RedisBackend(SHARED_URL, strategy=strategy, prefix=f"{namespace}:")
    await backend.start()
    try:
        r = req(await backend.clock_ms())
        assert (await backend.claim(r)).won
        assert (await backend.claim(r)).won, "a retried claim whose answer was lost"
        assert (await backend.claim(req(r.slot))).outcome is ClaimOutcome.TAKEN
        assert await backend.finish(ref(r), "success")
        assert not await backend.finish(ref(r), "failed"), "one result per run"
    finally:
        await backend.stop()


@pytest.mark.parametrize("strategy", ["stream-id", "script"])
async def test_claim_only_concurrent_claims_have_one_winner(strategy: str,
                                                            namespace: str) -> None:
    backends = [RedisBackend(SHARED_URL, strategy=strategy, prefix=f"{namespace}:")
                for _ in range(4)]
    try:
        for b in backends:
            await b.start()
        base = await backends[0].clock_ms()
        for i in range(5):
            results = await asyncio.gather(*(b.claim(req(base + i * 1000, f"r{n}"))
                                             for n, b in enumerate(backends) for _ in range(3)))
            assert [r.outcome for r in results].count(ClaimOutcome.WON) == 1
    finally:
        for b in backends:
            await b.stop()


async def test_script_window_forgets_old_claims(namespace: str) -> None:
    backend = RedisBackend(SHARED_URL, strategy=Script(window_ms=300), prefix=f"{namespace}:")
    await backend.start()
    try:
        slot = await backend.clock_ms()
        assert (await backend.claim(req(slot))).won
        assert (await backend.claim(req(slot))).outcome is ClaimOutcome.TAKEN
        await asyncio.sleep(0.5)
        # past window_ms the run is forgotten: why window_ms must exceed jitter + max_late
        assert (await backend.claim(req(slot))).won
    finally:
        await backend.stop()


async def test_claim_only_history_is_trimmed(admin: Any, namespace: str) -> None:
    prefix = f"{namespace}:"
    backend = RedisBackend(SHARED_URL, strategy="stream-id", prefix=prefix)
    backend.configure_retention(Retention(history_size=10))
    await backend.start()
    try:
        base = await backend.clock_ms()
        for i in range(400):
            r = req(base + i)
            assert (await backend.claim(r)).won
            assert await backend.finish(ref(r), "success")
        runs = await backend.history("job", limit=1000)
    finally:
        await backend.stop()
    assert admin.zcard(f"{prefix}job:results") == 10
    assert admin.xlen(f"{prefix}job:runs") < 400
    assert [r.slot for r in runs[:3]] == [base + 399, base + 398, base + 397]


@pytest.mark.parametrize("drawn", [True, False])
async def test_lease_claims_trim_only_when_the_draw_says(
        admin: Any, namespace: str, monkeypatch: pytest.MonkeyPatch, drawn: bool) -> None:
    # A won claim trims on about 1 in TRIM_EVERY (drawn by the caller, as on PostgreSQL):
    # forced on, the job keeps exactly history_size runs; forced off, nothing is dropped.
    monkeypatch.setattr("anarchon_core.backends.redis.lease.trim_drawn", lambda: drawn)
    prefix = f"{namespace}:"
    backend = RedisBackend(SHARED_URL, prefix=prefix)
    backend.configure_retention(Retention(history_size=5))
    await backend.start()
    try:
        base = await backend.clock_ms() - 100_000
        for i in range(30):
            r = req(base + i, overlap=True, max_late_ms=None)
            assert (await backend.claim(r)).won
            assert await backend.finish(ref(r), "success")
        runs = await backend.history("job", limit=100)
    finally:
        await backend.stop()
    kept = 5 if drawn else 30
    assert len(runs) == kept
    assert admin.zcard(f"{{{prefix}job}}:slots") == kept
    assert admin.hlen(f"{{{prefix}job}}:state") == kept
    assert [r.slot for r in runs[:2]] == [base + 29, base + 28]


async def test_two_prefixes_on_one_server_are_isolated(namespace: str) -> None:
    for strategy in ("lease", "stream-id", "script"):
        one = RedisBackend(SHARED_URL, strategy=strategy, prefix=f"{namespace}{strategy}a:")
        two = RedisBackend(SHARED_URL, strategy=strategy, prefix=f"{namespace}{strategy}b:")
        await one.start()
        await two.start()
        try:
            slot = await one.clock_ms()
            assert (await one.claim(req(slot, "a"))).won
            assert (await two.claim(req(slot, "b"))).won
            assert [r.runner for r in await one.history("job")] == ["a"]
            assert [r.runner for r in await two.history("job")] == ["b"]
        finally:
            await one.stop()
            await two.stop()


# ---------------------------------------------------------------- format record

@pytest.mark.parametrize("strategy", ["lease", "stream-id", "script"])
@pytest.mark.parametrize("stored", ["2", "999", "garbage"])
async def test_newer_or_foreign_format_is_refused(admin: Any, namespace: str, strategy: str,
                                                  stored: str) -> None:
    admin.set(f"{namespace}:format", stored)
    backend = RedisBackend(SHARED_URL, strategy=strategy, prefix=f"{namespace}:")
    with pytest.raises(StoreFormatError) as info:
        await backend.start()
    await backend.stop()
    assert info.value.code == "ANARCHON_STORE_FORMAT"
    assert stored in str(info.value)
    assert admin.get(f"{namespace}:format") == stored, "a refused store is left untouched"


async def test_same_format_is_accepted(admin: Any, namespace: str) -> None:
    admin.set(f"{namespace}:format", "1")
    backend = RedisBackend(SHARED_URL, prefix=f"{namespace}:")
    await backend.start()
    await backend.stop()


# ---------------------------------------------------------------- idmp

async def test_idmp_on_redis_7_is_unsupported(namespace: str) -> None:
    backend = RedisBackend(SHARED_URL, strategy=Idmp(), prefix=f"{namespace}:")
    with pytest.raises(UnsupportedStrategyError) as info:
        await backend.start()
    await backend.stop()
    text = str(info.value)
    assert "Redis 8.6" in text
    assert "Redis 7." in text
    for other in ("'lease'", "'stream-id'", "'script'"):
        assert other in text


async def test_idmp_on_valkey_is_unsupported(store_handles: Any, namespace: str) -> None:
    server = store_handles("valkey").extra
    backend = RedisBackend(server.url, strategy={"name": "idmp", "duration_sec": 60},
                           prefix=f"{namespace}:")
    with pytest.raises(UnsupportedStrategyError) as info:
        await backend.start()
    await backend.stop()
    assert "Valkey 8." in str(info.value)
    assert "'script'" in str(info.value)


async def test_idmp_config_script_runs_up_to_xcfgset_on_redis_7(admin: Any,
                                                                namespace: str) -> None:
    # The parts of lua/idmp_config.lua that Redis 7 has (create the stream, XINFO STREAM)
    # run; XCFGSET itself is Redis 8.6, so the script stops exactly there.
    conn = open_client(SHARED_URL)
    key = f"{namespace}:job:runs"
    script = LuaScript.load("idmp_config")
    line = next(n for n, text in enumerate(script.source.splitlines(), 1)
                if "redis.call('XCFGSET'" in text)
    try:
        with pytest.raises(StoreError, match=f"(?i)unknown.*@user_script:{line}\\b") as caught:
            await script.run(conn, [key], [300, 1000])
        assert isinstance(caught.value.__cause__, redis.ResponseError)
    finally:
        await conn.close()
    # it got past creating the empty stream (XGROUP CREATE MKSTREAM + DESTROY) and XINFO
    assert admin.type(key) == "stream"
    assert admin.xlen(key) == 0
    assert admin.xinfo_groups(key) == []
    admin.delete(key)


async def test_idmp_claim_sends_the_documented_commands() -> None:
    # Pure logic (no Redis 8.6 here): what the idmp path sends and how it reads replies,
    # against a stand-in that answers like Redis 8.6 documents XADD ... IDMP.
    sent: list[tuple[Any, ...]] = []
    first: dict[str, tuple[str, str]] = {}

    async def send(args: Any) -> Any:
        sent.append(tuple(args))
        if args[0] == "EVALSHA" and args[1] == LuaScript.load("idmp_config").sha:
            return 1
        if args[0] == "XADD":
            iid = (args[3], args[4])
            first.setdefault(f"{iid}", (f"{len(first) + 1}-0", args[args.index("token") + 1]))
            return first[f"{iid}"][0]
        if args[0] == "EVALSHA" and args[1] == LuaScript.load("idmp_read").sha:
            entry = args[4]
            return [next(tok for eid, tok in first.values() if eid == entry),
                     "1791633610050"]
        raise AssertionError(args)

    conn = Commands(send, label="stand-in", owned=False, blocking=False)
    state = IdmpState()
    strategy = Idmp(duration_sec=900, max_size=5000)
    a = req(1_791_633_610_000, "a", job="sync")
    b = req(1_791_633_610_000, "b", job="sync")
    assert (await claim_only(conn, "cron:", strategy, a, idmp=state, history_size=1000)).won
    assert (await claim_only(conn, "cron:", strategy, b, idmp=state, history_size=1000)
            ).outcome is ClaimOutcome.TAKEN
    xadds = [s for s in sent if s[0] == "XADD"]
    assert xadds[0][:6] == ("XADD", "cron:sync:runs", "IDMP", "sync", "1791633610000", "*")
    configs = [s for s in sent if s[1] == LuaScript.load("idmp_config").sha]
    assert configs == [("EVALSHA", configs[0][1], 1, "cron:sync:runs", 900, 5000)], \
        "the stream is configured once per job, before its first XADD"


# ---------------------------------------------------------------- strategies and options

def test_strategies_as_objects_names_and_dicts() -> None:
    assert isinstance(RedisBackend(strategy="script").strategy, Script)
    b = RedisBackend(strategy={"name": "script", "window_ms": 600_000})
    assert b.strategy == Script(window_ms=600_000)
    assert type(b) is RedisBackend
    assert isinstance(b.store, ClaimOnlyStore)
    assert not b.supports_leases
    assert RedisBackend().supports_leases
    assert isinstance(RedisBackend().store, LeaseStore)
    lease = RedisBackend(strategy=Lease())
    assert type(lease) is RedisBackend
    assert lease.supports_leases
    assert RedisBackend(strategy=Idmp(duration_sec=900, max_size=5_000)).strategy.as_dict() == \
        {"name": "idmp", "duration_sec": 900, "max_size": 5_000}
    v = ValkeyBackend(strategy=StreamId())
    assert type(v) is ValkeyBackend
    assert isinstance(v.store, ClaimOnlyStore)
    assert not v.supports_leases
    assert "ValkeyBackend(valkey=" in v.describe()


@pytest.mark.parametrize("strategy", [
    {"name": "lease", "window_ms": 1},
    {"name": "stream-id", "duration_sec": 5},
    {"name": "script", "window_ms": 0},
    {"name": "script", "window_ms": "600000"},
    {"name": "idmp", "duration_sec": 86_401},
    {"name": "idmp", "max_size": 0},
    {"name": "nope"},
    {"window_ms": 5},
    "leases",
    42,
])
def test_wrong_strategy_settings_are_config_errors(strategy: Any) -> None:
    with pytest.raises(ConfigError):
        RedisBackend(strategy=strategy)


@pytest.mark.parametrize("strategy", [Idmp(), "idmp", {"name": "idmp"}])
def test_valkey_backend_refuses_idmp(strategy: Any) -> None:
    with pytest.raises(ConfigError, match="Valkey"):
        ValkeyBackend(strategy=strategy)


def test_valkey_idmp_is_a_type_error() -> None:
    source = ROOT / "tests" / "typing_valkey_idmp.py"
    result = subprocess.run(
        [sys.executable, "-m", "mypy", "--strict", "--no-incremental",
         "--cache-dir=/dev/null", "tests/typing_valkey_idmp.py"],
        capture_output=True, text=True, cwd=ROOT, timeout=120, check=False,
    )
    expected = {n for n, line in enumerate(source.read_text().splitlines(), 1)
                if "# type error expected" in line}
    errors = {int(line.split(":")[1]) for line in result.stdout.splitlines()
              if line.startswith("tests/typing_valkey_idmp.py:") and ": error:" in line}
    assert expected, "the typing file marks the lines that must not type-check"
    assert errors == expected, result.stdout


def test_script_window_must_exceed_jitter_plus_max_late() -> None:
    scheduler = Scheduler(RedisBackend(strategy=Script(window_ms=30_000)))

    async def handler(ctx: Any) -> None:
        pass

    scheduler.every("ok", "10s", handler, jitter_ms=500, max_late_ms=10_000)
    with pytest.raises(ConfigError, match="window_ms"):
        scheduler.every("too-late", "10s", handler, jitter_ms=1_000, max_late_ms=29_000)
    with pytest.raises(ConfigError, match="window_ms"):
        scheduler.every("hourly", "1h", handler)  # default max_late_ms is 60 s


@pytest.mark.parametrize("target", [
    "http://localhost:6379", "redis://localhost:notaport/0",
    {"hots": "localhost"}, {"cluster": "maybe"},
])
def test_bad_connection_settings_are_config_errors(target: Any) -> None:
    with pytest.raises(ConfigError):
        RedisBackend(target)


@pytest.mark.parametrize("prefix", ["", "has space", "a{b}", "x" * 101, "new\nline"])
def test_bad_prefixes_are_config_errors(prefix: str) -> None:
    with pytest.raises(ConfigError):
        RedisBackend(prefix=prefix)


def test_from_url_reads_prefix_and_strategy_and_hides_the_password() -> None:
    b = backend_from_url("redis://user:s3cret@127.0.0.1:6380/2?prefix=billing:cron:"
                         "&strategy=script")
    assert isinstance(b, RedisBackend)
    assert not b.supports_leases
    assert (b.prefix, b.strategy) == ("billing:cron:", Script())
    assert "s3cret" not in repr(b)
    assert "***" in repr(b)
    v = backend_from_url("valkeys://:pw@127.0.0.1:6390/1")
    assert isinstance(v, ValkeyBackend)
    assert "pw@" not in repr(v)
    with pytest.raises(ConfigError, match="table"):
        backend_from_url("redis://127.0.0.1:6379/0?table=x")
    with pytest.raises(ConfigError):
        backend_from_url("valkey://127.0.0.1:6379/0?strategy=idmp")


def test_options_dict_hides_the_password() -> None:
    b = RedisBackend({"host": "127.0.0.1", "port": 6379, "password": "s3cret", "db": 1})
    assert "s3cret" not in repr(b)
    assert "6379" in repr(b)


async def test_valkey_url_reaches_valkey(store_handles: Any, namespace: str) -> None:
    server = store_handles("valkey").extra
    backend = backend_from_url(f"valkey://127.0.0.1:{server.port}/0?prefix={namespace}:")
    assert isinstance(backend, ValkeyBackend)
    await backend.start()
    try:
        assert (await backend.claim(req(await backend.clock_ms()))).won
    finally:
        await backend.stop()


async def test_cluster_runs_every_strategy_without_crossslot(
    store_handles: Any, namespace: str
) -> None:
    port = store_handles("redis-cluster").extra.port
    for strategy in ("lease", "stream-id", "script"):
        for job in ("alpha", "beta", "gamma", "delta"):  # jobs spread over the nodes
            backend = RedisBackend(f"redis://127.0.0.1:{port}/0?cluster=true",
                                   strategy=strategy, prefix=f"{namespace}{strategy}:")
            await backend.start()
            try:
                slot = await backend.clock_ms()
                r = req(slot, job=job)
                assert (await backend.claim(r)).won
                assert (await backend.claim(req(slot, job=job))).outcome in (
                    ClaimOutcome.RUNNING, ClaimOutcome.TAKEN)
                m = req(slot, job=job, manual=True, overlap=True)
                assert (await backend.claim(m)).won
                assert await backend.finish(ref(r), "success")
                assert await backend.finish(ref(m), "success")
                assert {(x.manual, x.status) for x in await backend.history(job)} == {
                    (False, "success"), (True, "success")}
            finally:
                await backend.stop()


# ---------------------------------------------------------------- read-only with an ACL user

async def test_read_only_backend_works_for_an_acl_user_limited_to_reads(
    tmp_path: Path, namespace: str,
) -> None:
    server = start_redis(tmp_path)
    try:
        with redis.Redis(port=server.port, decode_responses=True) as admin_client:
            admin_client.execute_command(
                "ACL", "SETUSER", "reader", "on", ">s3cret", "~*", "resetchannels", "-@all",
                "+@read", "+@connection", "+time", "+evalsha_ro", "+eval_ro")
        prefix = f"{namespace}:"
        for strategy in ("lease", "stream-id"):
            writer = RedisBackend(server.url, strategy=strategy, prefix=f"{strategy}{prefix}")
            await writer.start()
            try:
                r = req(await writer.clock_ms(), job="sync", max_late_ms=None)
                assert (await writer.claim(r)).won
                assert await writer.finish(ref(r), "success", meta={"task": "42"})
            finally:
                await writer.stop()
            reader_url = f"redis://reader:s3cret@127.0.0.1:{server.port}/0"
            reader = RedisBackend(reader_url, strategy=strategy, prefix=f"{strategy}{prefix}",
                                  read_only=True)
            await reader.start()
            try:
                [run] = await reader.history("sync")
                assert (run.slot, run.status, run.meta) == (r.slot, "success", {"task": "42"})
                assert [x.slot for x in await reader.runs(HistoryQuery())] == [r.slot]
                assert list(await reader.job_names()) == ["sync"]
                with pytest.raises(ReadOnlyError):
                    await reader.claim(req(r.slot + 1000, job="sync"))
            finally:
                await reader.stop()
            # the ACL really refuses writes: a writing backend cannot start
            refused = RedisBackend(reader_url, strategy=strategy, prefix=f"{strategy}{prefix}")
            with pytest.raises(StoreError, match=r"(?i)noperm|permission"):
                await refused.start()
            await refused.stop()
    finally:
        server.stop()

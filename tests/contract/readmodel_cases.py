"""The read model on every store: Run.meta, runs() pages and filters, job_names(), read-only.

Written once as coroutines over a backend; test_lease_contract.py and
test_claim_contract.py run them on every lease and every claim-only store.
"""

from __future__ import annotations

import asyncio

import pytest

from anarchon_core.backend import Backend, new_token
from anarchon_core.errors import ConfigError, ReadOnlyError, StoreNotSetUp
from anarchon_core.models import ClaimRequest, HistoryQuery, Run, RunRef

Key = tuple[int, str, bool, int]


def request(job: str, slot: int, runner: str = "a", **kw: object) -> ClaimRequest:
    kw.setdefault("max_late_ms", None)
    kw.setdefault("overlap", True)
    return ClaimRequest(job=job, slot=slot, token=new_token(), runner=runner, lease_ms=60_000,
                        **kw)  # type: ignore[arg-type]


def ref(r: ClaimRequest) -> RunRef:
    return RunRef(r.job, r.slot, r.token, 1, r.manual)


async def run_once(backend: Backend, job: str, slot: int, status: str = "success",
                   runner: str = "a", meta: dict[str, str] | None = None) -> None:
    r = request(job, slot, runner)
    assert (await backend.claim(r)).won, (job, slot)
    if status != "running":
        assert await backend.finish(ref(r), status, None if status == "success" else "boom",
                                    meta)


def key(run: Run) -> Key:
    return (run.slot, run.job, run.manual, run.attempt)


async def all_pages(backend: Backend, query: HistoryQuery) -> list[list[Run]]:
    pages: list[list[Run]] = []
    cursor: str | None = None
    for _ in range(100):
        page = await backend.runs(HistoryQuery(job=query.job, status=query.status,
                                               runner=query.runner, before=cursor,
                                               limit=query.limit))
        pages.append(list(page))
        cursor = page.cursor
        if cursor is None:
            return pages
        assert isinstance(cursor, str)
    raise AssertionError("runs() never reached its last page")


async def meta_round_trips(backend: Backend) -> None:
    base = await backend.clock_ms()
    meta = {"celery_task_id": "6f1c-42", "sent by": "beat ü", "empty": ""}
    await run_once(backend, "meta", base, meta=meta)
    await run_once(backend, "meta", base + 1000)
    newest, first = await backend.history("meta")
    assert first.meta == meta
    assert newest.meta == {}
    page = await backend.runs(HistoryQuery(job="meta"))
    assert [r.meta for r in page] == [{}, meta]


async def meta_size_is_checked(backend: Backend) -> None:
    base = await backend.clock_ms()
    r = request("meta", base)
    assert (await backend.claim(r)).won
    with pytest.raises(ConfigError, match="64"):
        await backend.finish(ref(r), "success", meta={"k" * 65: "v"})
    with pytest.raises(ConfigError, match=r"1024|1,024"):
        await backend.finish(ref(r), "success", meta={"id": "x" * 1025})
    with pytest.raises(ConfigError, match="16"):
        await backend.finish(ref(r), "success", meta={f"k{i}": "v" for i in range(17)})
    with pytest.raises(ConfigError, match=r"4096|4,096"):
        await backend.finish(ref(r), "success", meta={f"k{i}": "v" * 1000 for i in range(5)})
    with pytest.raises(ConfigError, match="str"):
        await backend.finish(ref(r), "success", meta={"n": 1})  # type: ignore[dict-item]
    # A refused meta records nothing: the run can still end, once.
    assert await backend.finish(ref(r), "success", meta={"ok": "1"})
    [run] = await backend.history("meta")
    assert (run.status, run.meta) == ("success", {"ok": "1"})


async def pages_are_stable_under_concurrent_writes(backend: Backend) -> None:
    base = await backend.clock_ms() - 100_000
    jobs = ["alpha", "beta", "gamma"]
    for i in range(9):
        for job in jobs:
            await run_once(backend, job, base + i * 1000)
    expected = sorted(((base + i * 1000, job, False, 1) for i in range(9) for job in jobs),
                      reverse=True)
    first = await backend.runs(HistoryQuery(limit=7))
    assert [key(r) for r in first] == expected[:7]
    assert first.cursor is not None

    async def write_newer() -> None:
        for i in range(6):
            await run_once(backend, jobs[i % 3], base + 50_000 + i * 1000)

    writer = asyncio.ensure_future(write_newer())
    seen = [key(r) for r in first]
    cursor: str | None = first.cursor
    for _ in range(20):
        page = await backend.runs(HistoryQuery(before=cursor, limit=7))
        seen += [key(r) for r in page]
        cursor = page.cursor
        if cursor is None:
            break
    await writer
    assert seen == expected, "pages after the first must hold exactly the older runs"
    again = await all_pages(backend, HistoryQuery(limit=5))
    flat = [key(r) for page in again for r in page]
    assert flat[:6] == sorted(((base + 50_000 + i * 1000, jobs[i % 3], False, 1)
                               for i in range(6)), reverse=True)
    assert flat[6:] == expected
    assert all(len(p) == 5 for p in again[:-1])


async def filters_apply_before_the_limit(backend: Backend) -> None:
    base = await backend.clock_ms() - 100_000
    # newest first: many successes by r1, then older failures by r2 and r1
    for i in range(4):
        await run_once(backend, "sync", base + i * 1000, "failed", runner="r2")
    await run_once(backend, "other", base + 4500, "failed", runner="r1")
    for i in range(5, 12):
        await run_once(backend, "sync", base + i * 1000, "success", runner="r1")
    failed = await backend.runs(HistoryQuery(status="failed", limit=3))
    assert [(r.job, r.slot, r.status) for r in failed] == [
        ("other", base + 4500, "failed"), ("sync", base + 3000, "failed"),
        ("sync", base + 2000, "failed")]
    assert failed.cursor is not None
    rest = await backend.runs(HistoryQuery(status="failed", limit=3, before=failed.cursor))
    assert [r.slot for r in rest] == [base + 1000, base]
    assert rest.cursor is None
    by_r2 = await backend.runs(HistoryQuery(runner="r2", limit=10))
    assert [r.slot for r in by_r2] == [base + i * 1000 for i in (3, 2, 1, 0)]
    assert {r.runner for r in by_r2} == {"r2"}
    mixed = await backend.runs(HistoryQuery(job="sync", runner="r1", status="success", limit=2))
    assert [r.slot for r in mixed] == [base + 11_000, base + 10_000]
    assert await backend.runs(HistoryQuery(job="sync", runner="nobody")) == []
    with pytest.raises(ConfigError, match="cursor"):
        await backend.runs(HistoryQuery(before="not-a-cursor"))
    with pytest.raises(ConfigError, match="status"):
        await backend.runs(HistoryQuery(status="done"))


async def job_names_lists_the_store(backend: Backend, other: Backend, fresh: Backend) -> None:
    base = await backend.clock_ms() - 10_000
    await run_once(backend, "report:daily/eu ü", base)
    await run_once(backend, "report:daily/eu ü", base + 1000, "failed")
    await run_once(other, "sync", base + 500, "running", runner="b")
    names = await fresh.job_names()
    assert sorted(names) == ["report:daily/eu ü", "sync"]
    newest = names["report:daily/eu ü"]
    assert newest is not None
    assert (newest.slot, newest.status) == (base + 1000, "failed")
    running = names["sync"]
    assert running is not None
    assert (running.slot, running.status, running.runner) == (base + 500, "running", "b")


async def read_only_refuses_writes(writer: Backend, reader: Backend) -> None:
    base = await writer.clock_ms()
    await run_once(writer, "sync", base - 2000, meta={"k": "v"})
    live = request("sync", base)
    assert (await writer.claim(live)).won
    await reader.start()
    try:
        assert reader.read_only is True
        before = [key(r) for r in await writer.history("sync")]
        history = await reader.history("sync")
        assert [key(r) for r in history] == before
        assert history[-1].meta == {"k": "v"}
        assert [key(r) for r in await reader.runs(HistoryQuery())] == before
        assert sorted(await reader.job_names()) == ["sync"]
        calls = {
            "claim": lambda: reader.claim(request("sync", base + 1000)),
            "heartbeat": lambda: reader.heartbeat(ref(live), 60_000),
            "finish": lambda: reader.finish(ref(live), "success"),
            "release": lambda: reader.release(ref(live)),
        }
        for name, call in calls.items():
            with pytest.raises(ReadOnlyError, match=f"{name}.*read.only"):
                await call()
        assert [key(r) for r in await writer.history("sync")] == before
        assert (await writer.history("sync"))[0].status == "running"
    finally:
        await reader.stop()


async def read_only_needs_a_store(reader: Backend) -> None:
    try:
        with pytest.raises(StoreNotSetUp, match="never set up"):
            await reader.start()
    finally:
        await reader.stop()

"""NatsBackend specifics: options, subject escaping, the stream it makes or shares."""

from __future__ import annotations

import uuid
from collections.abc import AsyncIterator

import nats
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from nats.js import api

from anarchon_core import Scheduler, backend_from_url
from anarchon_core.backend import new_token
from anarchon_core.backends.nats import NatsBackend, _subject_covers, job_token, token_job
from anarchon_core.errors import ConfigError, StoreError
from anarchon_core.models import ClaimOutcome, ClaimRequest

from .stores import unavailable
from .stores.nats import URL

pytestmark = pytest.mark.timeout(60)


def req(slot: int, runner: str = "a", **kw: object) -> ClaimRequest:
    return ClaimRequest(job=str(kw.pop("job", "job")), slot=slot, token=new_token(),
                        runner=runner, **kw)  # type: ignore[arg-type]


@settings(deadline=None)
@given(st.text(min_size=1, max_size=60))
def test_job_tokens_are_single_valid_tokens_and_reversible(job: str) -> None:
    token = job_token(job)
    assert token
    assert not set(token) & set(". *>\t\r\n")
    assert token.isascii()
    assert token_job(token) == job


def test_job_token_examples() -> None:
    assert job_token("report:daily") == "report~3Adaily"
    assert job_token("tenant-42_sync") == "tenant-42_sync"
    assert job_token("a.b") != job_token("a~2Eb")


@pytest.mark.parametrize(("pattern", "prefix", "covered"), [
    ("cron.>", "cron.", True),
    ("cron.>", "cron.a.", True),
    ("*.>", "cron.", True),
    (">", "x.", True),
    ("cron.a.>", "cron.", False),
    ("cron.*", "cron.", False),
    ("other.>", "cron.", False),
])
def test_subject_cover(pattern: str, prefix: str, covered: bool) -> None:
    assert _subject_covers(pattern, prefix) is covered


def test_from_url_reads_prefix_and_stream_and_masks_the_password() -> None:
    backend = backend_from_url("nats://app:s3cret@nats:4222?prefix=billing.&stream=BILL")
    assert isinstance(backend, NatsBackend)
    assert (backend.prefix, backend.stream) == ("billing.", "BILL")
    assert "s3cret" not in repr(backend)
    with pytest.raises(ConfigError, match="unknown parameter"):
        backend_from_url("nats://nats:4222?table=x")


@pytest.mark.parametrize(("kwargs", "match"), [
    ({"prefix": "a..b"}, "empty subject tokens"),
    ({"prefix": ".a"}, "empty subject tokens"),
    ({"prefix": "a b"}, "invalid prefix"),
    ({"stream": "CR.ON"}, "invalid stream"),
    ({"max_age_ms": 1000}, "max_age_ms"),
    ({"servers": "amqp://x"}, "expected nats"),
])
def test_bad_options_are_config_errors(kwargs: dict[str, object], match: str) -> None:
    with pytest.raises(ConfigError, match=match):
        NatsBackend(**kwargs)  # type: ignore[arg-type]


def test_job_whose_late_claims_outlive_the_stream_is_refused() -> None:
    scheduler = Scheduler(NatsBackend(URL, max_age_ms=120_000))
    with pytest.raises(ConfigError, match="max_age_ms"):
        scheduler.every("slowpoke", "1h", lambda ctx: None, max_late_ms=61_000)
    scheduler.every("fine", "1h", lambda ctx: None, max_late_ms=59_000)


@pytest.fixture
async def js() -> AsyncIterator[object]:
    try:
        nc = await nats.connect(URL, allow_reconnect=False, connect_timeout=3)
    except Exception as exc:  # noqa: BLE001 - any failure means "not there"
        unavailable(f"NATS at {URL}", f"{type(exc).__name__}: {exc}")
    try:
        yield nc.jetstream()
    finally:
        await nc.close()


@pytest.fixture
def stream_name() -> str:
    return f"T{uuid.uuid4().hex[:12].upper()}"


async def test_creates_an_r1_file_stream_with_the_format(js: object, stream_name: str) -> None:
    backend = NatsBackend(URL, prefix=f"{stream_name.lower()}.", stream=stream_name,
                          max_age_ms=3_600_000)
    try:
        await backend.start()
        info = await js.stream_info(stream_name)  # type: ignore[attr-defined]
        assert info.config.subjects == [f"{stream_name.lower()}.>"]
        assert info.config.num_replicas == 1
        assert info.config.storage == api.StorageType.FILE
        assert info.config.max_age == 3600
        assert info.config.description == "anarchon-format=1"
    finally:
        await backend.stop()
        await js.delete_stream(stream_name)  # type: ignore[attr-defined]


async def test_prefixes_share_one_stream(js: object, stream_name: str) -> None:
    one = NatsBackend(URL, prefix="one.", stream=stream_name)
    two = NatsBackend(URL, prefix="two", stream=stream_name)
    try:
        await one.start()
        await two.start()
        info = await js.stream_info(stream_name)  # type: ignore[attr-defined]
        assert sorted(info.config.subjects) == ["one.>", "two.>"]
        slot = await one.clock_ms()
        assert (await one.claim(req(slot, "a"))).won
        assert (await two.claim(req(slot, "b"))).won
        assert [r.runner for r in await one.history("job")] == ["a"]
        assert [r.runner for r in await two.history("job")] == ["b"]
    finally:
        await one.stop()
        await two.stop()
        await js.delete_stream(stream_name)  # type: ignore[attr-defined]


async def test_a_users_own_stream_is_used_as_it_is(js: object, stream_name: str) -> None:
    await js.add_stream(name=stream_name, subjects=["apps.>"],  # type: ignore[attr-defined]
                        description="our events", max_age=600)
    backend = NatsBackend(URL, prefix="apps.cron.", stream=stream_name)
    try:
        await backend.start()
        info = await js.stream_info(stream_name)  # type: ignore[attr-defined]
        assert info.config.subjects == ["apps.>"]
        assert info.config.description == "our events"
        slot = await backend.clock_ms()
        assert (await backend.claim(req(slot))).won
        assert (await backend.claim(req(slot, "b"))).outcome is ClaimOutcome.TAKEN
    finally:
        await backend.stop()
        await js.delete_stream(stream_name)  # type: ignore[attr-defined]


async def test_unreachable_server_is_a_store_error_without_the_password() -> None:
    backend = NatsBackend("nats://app:s3cret@127.0.0.1:1", timeout_s=1,
                          connect_options={"allow_reconnect": False})
    with pytest.raises(StoreError) as info:
        await backend.start()
    assert "s3cret" not in str(info.value)


async def test_run_now_through_the_scheduler(js: object, stream_name: str) -> None:
    calls: list[bool] = []

    async def work(ctx: object) -> None:
        calls.append(ctx.manual)  # type: ignore[attr-defined]

    backend = NatsBackend(URL, prefix=f"{stream_name.lower()}.", stream=stream_name)
    scheduler = Scheduler(backend, instance_id="me")
    scheduler.every("report", "1h", work)
    try:
        run = await scheduler.run_now("report")
        assert (run.manual, run.status, run.runner) == (True, "success", "me")
        assert calls == [True]
        [stored] = await scheduler.history("report")
        assert (stored.slot, stored.manual, stored.status) == (run.slot, True, "success")
    finally:
        await scheduler.stop()
        await js.delete_stream(stream_name)  # type: ignore[attr-defined]

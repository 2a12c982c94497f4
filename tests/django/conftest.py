"""The Django test project: settings ``tests.django.settings``, pytest-django fixtures.

``store`` runs a test against each kind of backend the app supports: the project's SQLite
database, the shared PostgreSQL (a test database of this pytest session), and Redis by URL; each
test gets a table or prefix of its own.
"""

from __future__ import annotations

import os
import shutil
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

os.environ["DJANGO_SETTINGS_MODULE"] = "tests.django.settings"

import django

django.setup()

import pytest  # noqa: E402

from tests.stores import unavailable  # noqa: E402
from tests.stores.postgres import POSTGRES_URL  # noqa: E402
from tests.stores.redis import SHARED_URL as REDIS_URL  # noqa: E402

from .settings import WORKDIR  # noqa: E402


@dataclass
class Store:
    """One backend for a test: its id, the ANARCHON settings, and the DB alias if any."""

    id: str
    anarchon: dict[str, Any]
    alias: str | None


def _reachable_postgres() -> None:
    import psycopg  # noqa: PLC0415

    try:
        psycopg.connect(POSTGRES_URL, connect_timeout=5).close()
    except psycopg.OperationalError as exc:
        unavailable("PostgreSQL", str(exc).strip())


def _reachable_redis() -> None:
    import redis  # noqa: PLC0415

    try:
        redis.Redis.from_url(REDIS_URL, socket_timeout=5).ping()
    except redis.RedisError as exc:
        unavailable("Redis", str(exc))


def _drop_redis_prefix(prefix: str) -> None:
    import redis  # noqa: PLC0415

    client = redis.Redis.from_url(REDIS_URL)
    try:
        keys = list(client.scan_iter(match=f"*{prefix}*", count=1000))
        if keys:
            client.delete(*keys)
    finally:
        client.close()


STORE_IDS = ["sqlite", "postgres", "redis"]


def make_store(kind: str, **extra: Any) -> Iterator[Store]:
    """Settings for ``kind`` with a namespace of the test's own (a generator: cleans up)."""
    ns = f"t{uuid.uuid4().hex[:12]}"
    if kind == "sqlite":
        yield Store(kind, {"BACKEND": "default", "TABLE": ns, "LEASE_MS": 3_000, **extra},
                    "default")
    elif kind == "postgres":
        _reachable_postgres()
        yield Store(kind, {"BACKEND": "pg", "TABLE": ns, "LEASE_MS": 3_000, **extra}, "pg")
    else:
        _reachable_redis()
        try:
            yield Store(kind, {"BACKEND": REDIS_URL, "PREFIX": f"{ns}:", "LEASE_MS": 3_000,
                               **extra}, None)
        finally:
            _drop_redis_prefix(ns)


@pytest.fixture
def anarchon_reset() -> Iterator[None]:
    """Forget the process's scheduler before and after the test."""
    from anarchon_django import runtime  # noqa: PLC0415

    runtime.reset()
    yield
    runtime.reset()


def pytest_sessionfinish(session: pytest.Session) -> None:
    if not os.environ.get("ANARCHON_DJANGO_TEST_DIR"):
        shutil.rmtree(WORKDIR, ignore_errors=True)


def create_table(store: Store) -> None:
    """Create the store's runs table as ``migrate`` does (needs database access)."""
    from django.db import connections  # noqa: PLC0415

    from anarchon_django.db import create_runs_table  # noqa: PLC0415

    assert store.alias is not None
    with connections[store.alias].schema_editor() as editor:
        create_runs_table(editor, store.anarchon["TABLE"])


def _use(kind: str, settings: Any) -> Iterator[Store]:
    stores = make_store(kind)
    store = next(stores)
    settings.ANARCHON = store.anarchon
    if store.alias is not None:
        create_table(store)
    try:
        yield store
    finally:
        from anarchon_django import runtime  # noqa: PLC0415

        runtime.reset()
        stores.close()


@pytest.fixture(params=STORE_IDS)
def store(request: pytest.FixtureRequest, settings: Any,
          anarchon_reset: None) -> Iterator[Store]:
    """ANARCHON set to each backend kind in turn, with a namespace of the test's own."""
    yield from _use(request.param, settings)


@pytest.fixture(params=["sqlite", "postgres"])
def db_store(request: pytest.FixtureRequest, settings: Any,
             anarchon_reset: None) -> Iterator[Store]:
    """ANARCHON set to each database alias in turn (``BACKEND = "<alias>"``)."""
    yield from _use(request.param, settings)


@pytest.fixture(params=[kind for kind in STORE_IDS if kind not in ("sqlite", "postgres")])
def url_store(request: pytest.FixtureRequest, settings: Any,
              anarchon_reset: None) -> Iterator[Store]:
    """ANARCHON set to each store reached by URL, not through a database alias."""
    yield from _use(request.param, settings)


def typo(store: Store) -> tuple[str, str]:
    """The setting that names ``store``'s namespace, and a value naming none (a typo)."""
    if store.alias is not None:
        return "TABLE", f"{store.anarchon['TABLE']}x"
    return "PREFIX", f"{store.anarchon['PREFIX'][:-1]}x:"


def namespace_exists(store: Store, name: str) -> bool:
    """Whether anything of namespace ``name`` is in ``store`` (a table, or a Redis key)."""
    if store.alias is not None:
        from django.db import connections  # noqa: PLC0415

        tables = set(connections[store.alias].introspection.table_names())
        return bool({name, f"{name}_meta"} & tables)
    import redis  # noqa: PLC0415

    client = redis.Redis.from_url(REDIS_URL)
    try:
        return any(True for _ in client.scan_iter(match=f"*{name}*", count=1000))
    finally:
        client.close()


def set_up(store: Store) -> None:
    """Set up ``store``'s namespace as a worker's start does (a database's table is there)."""
    import asyncio  # noqa: PLC0415

    from anarchon_django import conf  # noqa: PLC0415

    backend = conf.build_backend(conf.load())

    async def start_and_stop() -> None:
        try:
            await backend.start()
        finally:
            await backend.stop()

    asyncio.run(start_and_stop())

"""Secrets in URLs never reach logs or reprs: mask_url and every backend's describe()."""

from __future__ import annotations

from pathlib import Path

import pytest

from anarchon_core import ConfigError, backend_from_url, mask_url
from anarchon_core.backends.postgres import PostgresBackend
from anarchon_core.url import split_namespace_params

SECRET = "s3cr3t-PW"


@pytest.mark.parametrize(
    ("url", "masked"),
    [
        ("redis://user:pass@host:6379/0", "redis://user:***@host:6379/0"),
        ("redis://:pass@host", "redis://:***@host"),
        ("rediss://default:pass@cache.example.com:6380/2?prefix=a:",
         "rediss://default:***@cache.example.com:6380/2?prefix=a:"),
        ("redis://user:pass@[::1]:6379/0", "redis://user:***@[::1]:6379/0"),
        ("redis://user:pass@[2001:db8::1]/0", "redis://user:***@[2001:db8::1]/0"),
        ("postgresql://app:p%40ss@db/prod", "postgresql://app:***@db/prod"),
        ("amqp://guest:guest@127.0.0.1:5672/%2F", "amqp://guest:***@127.0.0.1:5672/%2F"),
        ("redis://u:p@ss@host/0", "redis://u:***@host/0"),  # '@' inside the password
        # A port that does not parse must not make masking fail (or leak).
        ("redis://u:pass@host:abc/0", "redis://u:***@host:abc/0"),
        # libpq and others accept a password in the query string.
        ("postgresql://db/prod?password=pass&sslmode=require",
         "postgresql://db/prod?password=***&sslmode=require"),
        ("postgresql://db/prod?sslmode=require&PASSWORD=pass",
         "postgresql://db/prod?sslmode=require&PASSWORD=***"),
    ],
)
def test_mask_url_hides_passwords(url: str, masked: str) -> None:
    assert mask_url(url) == masked
    assert "pass" not in mask_url(url).replace("password=", "")


@pytest.mark.parametrize(
    "url",
    ["redis://host:6379/0", "redis://user@host:6379/0", "rediss://cache.example.com:6380",
     "sqlite:////abs/path/cron.db", "sqlite:///relative.db?table=runs",
     "redis://[::1]:6379/0?prefix=x:", "nats://127.0.0.1:4222"],
)
def test_mask_url_leaves_urls_without_password_alone(url: str) -> None:
    assert mask_url(url) == url


def test_mask_url_on_unparseable_input() -> None:
    assert mask_url("redis://user:pass@[::1/0") == "<unparseable url>"


@pytest.mark.parametrize(
    "url",
    [f"redis://user:{SECRET}@127.0.0.1:6379/0?prefix=t:",
     f"rediss://default:{SECRET}@[::1]:6380/2",
     f"valkey://:{SECRET}@127.0.0.1:6379/0",
     f"valkeys://app:{SECRET}@127.0.0.1:6380/0",
     f"postgresql://app:{SECRET}@127.0.0.1:5432/test?table=cron_runs",
     f"postgres://app:{SECRET}@[::1]:5432/test",
     f"postgresql://127.0.0.1:5432/test?password={SECRET}",
     f"amqp://guest:{SECRET}@127.0.0.1:5672/",
     f"amqps://guest:{SECRET}@127.0.0.1:5671/vhost?prefix=cron.",
     f"nats://user:{SECRET}@127.0.0.1:4222"],
)
def test_backend_repr_and_describe_never_show_the_password(url: str) -> None:
    backend = backend_from_url(url)  # builds without connecting
    assert SECRET not in repr(backend)
    assert SECRET not in backend.describe()
    assert SECRET not in str(backend)


def test_postgres_conninfo_password_is_masked() -> None:
    backend = PostgresBackend(f"host=127.0.0.1 dbname=test password={SECRET} user=app")
    assert SECRET not in repr(backend)
    assert "host=127.0.0.1" in backend.describe()


@pytest.mark.parametrize(
    "url",
    [f"amqp://guest:{SECRET}@127.0.0.1:5672/?table=x",
     f"postgresql://app:{SECRET}@127.0.0.1/test?stream=x",
     f"mongodb://app:{SECRET}@127.0.0.1/test"],
)
def test_url_errors_never_show_the_password(url: str) -> None:
    with pytest.raises(ConfigError) as info:
        backend_from_url(url)
    assert SECRET not in str(info.value)


def test_split_namespace_params(tmp_path: Path) -> None:
    rest, ours = split_namespace_params("redis://h:6379/0?prefix=billing:&socket_timeout=5")
    assert ours == {"prefix": "billing:"}
    assert rest == "redis://h:6379/0?socket_timeout=5"
    backend = backend_from_url(f"sqlite:///{tmp_path}/a.db?table=svc_runs")
    assert backend.describe() == f"SqliteBackend(path='{tmp_path}/a.db', table='svc_runs')"

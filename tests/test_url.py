"""Secrets in URLs never reach logs or reprs: mask_url and every backend's describe()."""

from __future__ import annotations

import asyncio
import contextlib
from pathlib import Path
from typing import Any
from urllib.parse import quote

import pytest

from anarchon_core import ConfigError, backend_from_url, mask_url
from anarchon_core.backends.nats import NatsBackend
from anarchon_core.backends.postgres import PostgresBackend
from anarchon_core.backends.rabbitmq import RabbitMQBackend
from anarchon_core.backends.redis import RedisBackend
from anarchon_core.url import redact, split_namespace_params, url_secrets

from .support.helpers import free_port

SECRET = "s3cr3t-PW"


@pytest.mark.parametrize(
    ("url", "masked"),
    [
        ("redis://user:pass@host:6379/0", "redis://user:***@host:6379/0"),
        ("redis://:pass@host", "redis://:***@host"),
        # a lone userinfo is a token for NATS, and a password to several Redis clients
        ("redis://pass@host:6379/0", "redis://***@host:6379/0"),
        ("nats://pass@host:4222", "nats://***@host:4222"),
        ("rediss://default:pass@cache.example.com:6380/2?prefix=a:",
         "rediss://default:***@cache.example.com:6380/2?prefix=a:"),
        ("redis://user:pass@[::1]:6379/0", "redis://user:***@[::1]:6379/0"),
        ("redis://user:pass@[2001:db8::1]/0", "redis://user:***@[2001:db8::1]/0"),
        ("postgresql://app:p%40ss@db/prod", "postgresql://app:***@db/prod"),
        ("amqp://guest:guest@127.0.0.1:5672/%2F", "amqp://guest:***@127.0.0.1:5672/%2F"),
        ("redis://u:p@ss@host/0", "redis://***@host/0"),  # '@' inside the password
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
    ["redis://host:6379/0", "postgresql://app@host/db", "rediss://cache.example.com:6380",
     "sqlite:////abs/path/cron.db", "sqlite:///relative.db?table=runs",
     "redis://[::1]:6379/0?prefix=x:", "nats://127.0.0.1:4222"],
)
def test_mask_url_leaves_urls_without_password_alone(url: str) -> None:
    assert mask_url(url) == url


def test_mask_url_on_unparseable_input() -> None:
    # Masking is string work: a URL urllib cannot parse is still shown, without the secret.
    assert mask_url("redis://user:pass@[::1/0") == "redis://user:***@[::1/0"
    assert mask_url("postgres://[::1") == "postgres://[::1"


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


# ------------------------------------------------------------------ every place a secret sits

#: A password with every character that has a meaning in a URL.
NASTY = "Zq9/#@?%:&=+ x"
NASTY_Q = quote(NASTY, safe="")
TOKEN = "T0k3nZq9xv"


def _assert_hidden(text: str, *secrets: str) -> None:
    for secret in secrets:
        assert secret not in text, text


@pytest.mark.parametrize(
    ("url", "secrets"),
    [
        # percent-encoded passwords, as the URL standard wants them
        (f"redis://app:{NASTY_Q}@127.0.0.1:6379/0", [NASTY, NASTY_Q]),
        (f"rediss://:{NASTY_Q}@127.0.0.1:6380/1", [NASTY, NASTY_Q]),
        (f"valkey://app:{NASTY_Q}@127.0.0.1:6379/0", [NASTY, NASTY_Q]),
        (f"postgresql://app:{NASTY_Q}@127.0.0.1:5432/test", [NASTY, NASTY_Q]),
        (f"postgres://app:{NASTY_Q}@[::1]:5432/test", [NASTY, NASTY_Q]),
        (f"amqp://app:{NASTY_Q}@127.0.0.1:5672/%2F", [NASTY, NASTY_Q]),
        (f"nats://app:{NASTY_Q}@127.0.0.1:4222", [NASTY, NASTY_Q]),
        # a token-only userinfo
        (f"nats://{TOKEN}@127.0.0.1:4222", [TOKEN]),
        (f"tls://{TOKEN}@127.0.0.1:4222", [TOKEN]),
        # secrets in the query string
        (f"postgresql://127.0.0.1/test?sslpassword={TOKEN}", [TOKEN]),
        (f"postgresql://127.0.0.1/test?password={NASTY_Q}&sslmode=disable", [NASTY_Q, NASTY]),
        (f"redis://127.0.0.1/0?password={TOKEN}", [TOKEN]),
        (f"redis://127.0.0.1/0?ssl_password={TOKEN}", [TOKEN]),
    ],
)
def test_every_credential_is_masked_in_repr_and_describe(url: str, secrets: list[str]) -> None:
    backend = backend_from_url(url)
    for text in (repr(backend), backend.describe(), str(backend), mask_url(url)):
        _assert_hidden(text, *secrets)
    assert "***" in backend.describe()


@pytest.mark.parametrize(
    "url",
    [
        # unencoded characters that end the authority early: refused, never echoed
        f"redis://app:{NASTY}@127.0.0.1:6379/0", f"postgresql://app:{NASTY}@127.0.0.1/test",
        f"amqp://app:{NASTY}@127.0.0.1/", f"nats://app:{NASTY}@127.0.0.1:4222",
        "redis://app:Zq9/secretpart@127.0.0.1/0", "postgres://app:Zq9#secretpart@h/db",
        "amqp://app:Zq9?secretpart@h/", "nats://secretpart/x@h:4222",
        # malformed in other ways, with a password inside
        "redis://app:secretpart@[::1/0", "postgres://app:secretpart@[::1",
        "redis://app:secretpart@h:99999/0", "redis://app:secretpart@h/abc",
        "redis://app:secretpart@h/0?foo=bar", "redis://app:secretpart@h/0?socket_timeout=x",
        "postgresql://app:secretpart@h/db?foo=bar", "postgresql://app:secretpart@h:0/db",
        "postgresql://app:secretpart@h/db?connect_timeout=soon",
        "postgresql://app:p%zzsecretpart@h/db",  # libpq quotes the bad token in its error
        "amqp://app:secretpart@h:70000/", "amqp://app:secretpart@h/?heartbeat=often",
        "amqp://app:secretpart@/", "nats://app:secretpart@h?x=1", "nats://app:secretpart@:4222",
        "mongodb://app:secretpart@h/db", "redis://app:secretpart@h/0?prefix=bad prefix",
        "postgresql://h/db?sslpassword=secretpart&table=bad-name",
        "nats://secretpart@h:4222?stream=bad.stream",
    ],
)
def test_errors_for_bad_urls_never_show_a_credential(url: str, caplog: pytest.LogCaptureFixture
                                                     ) -> None:
    caplog.set_level("DEBUG")
    with pytest.raises(ConfigError) as info:
        backend_from_url(url)
    shown = f"{info.value} {info.value!r} {caplog.text}"
    _assert_hidden(shown, "secretpart", NASTY, "Zq9/", "Zq9#", "Zq9?")
    assert "invalid" in str(info.value) or "unknown" in str(info.value)


@pytest.mark.parametrize(
    "conninfo",
    [f"host=127.0.0.1 dbname=test password={TOKEN} user=app",
     f"host=127.0.0.1 sslpassword={TOKEN} dbname=test",
     f"host=127.0.0.1 password='{TOKEN} with spaces' dbname=test",
     f"host=127.0.0.1 password = {TOKEN}"],
)
def test_postgres_conninfo_credentials_are_masked(conninfo: str) -> None:
    backend = PostgresBackend(conninfo)
    _assert_hidden(repr(backend), TOKEN)
    assert "host=127.0.0.1" in backend.describe()
    with pytest.raises(ConfigError) as info:
        PostgresBackend(conninfo + " port=99999")
    _assert_hidden(str(info.value), TOKEN)
    assert "port '99999'" in str(info.value)


@pytest.mark.parametrize(
    ("url", "reason"),
    [
        ("postgres://[::1", "Invalid IPv6 URL"),
        ("redis://[::1", "Invalid IPv6 URL"),
        ("redis://h:6379/abc", "the path '/abc' is not a database number"),
        ("redis://h:6379/0/1", "is not a database number"),
        ("redis://h:99999/0", "port must be a number from 1 to 65535"),
        ("redis://h:0/0", "port must be a number from 1 to 65535"),
        ("redis://h:abc/0", "port must be a number from 1 to 65535"),
        ("redis:///0", "no host"),
        ("redis://", "no host"),
        ("redis://h/0?foo=bar", "unknown parameter 'foo'"),
        ("redis://h/0?socket_timeout=abc", "invalid value 'abc' for parameter 'socket_timeout'"),
        ("redis://h/0?socket_timeout=inf", "parameter 'socket_timeout'"),
        ("redis://h/0?db=-1", "parameter 'db'"),
        ("redis://h/0?retry_on_timeout=maybe", "expected true or false"),
        ("redis://h/0?cluster=perhaps", "cluster"),
        ("redis://my host/0", "spaces or control characters"),
        ("postgresql://h/db?foo=bar", "invalid URI query parameter"),
        ("postgresql://h:99999/db", "port '99999' is not a number"),
        ("postgresql://h1:5432,h2:0/db", "port '0'"),
        ("postgresql://h/db?connect_timeout=abc", "parameter 'connect_timeout'"),
        ("postgresql://h/db?sslmode=sometimes", "parameter 'sslmode'"),
        ("postgresql://h/db?table=a.b.c", "invalid table 'a.b.c'"),
        ("amqp://h:99999/", "port must be a number"),
        ("amqp://h/?foo=bar", "unknown parameter 'foo'"),
        ("amqp://h/?heartbeat=-5", "parameter 'heartbeat'"),
        ("amqp://", "no host"),
        ("nats://h:99999", "port must be a number"),
        ("nats://h?foo=bar", "unknown parameter 'foo'"),
        ("nats://", "no host"),
        ("sqlite:///x.db?foo=bar", "unknown parameter 'foo'"),
        ("1redis://h", "expected scheme://"),
    ],
)
def test_malformed_urls_are_config_errors_at_construction(url: str, reason: str) -> None:
    with pytest.raises(ConfigError) as info:
        backend_from_url(url)
    assert reason in str(info.value)


@pytest.mark.parametrize(
    "url",
    ["redis://127.0.0.1:6379", "redis://127.0.0.1:6379/", "redis://127.0.0.1/15?prefix=a:",
     "redis://h/0?socket_timeout=2.5&socket_connect_timeout=1&retry_on_timeout=yes",
     "rediss://h:6380/0?ssl_cert_reqs=none&ssl_ca_certs=/etc/ca.pem",
     "redis://h/0?cluster=true&strategy=script", "redis://[::1]:6379/0",
     "postgresql://", "postgresql:///test?host=/var/run/postgresql",
     "postgresql://h1:5432,h2:5433/db?target_session_attrs=read-write&connect_timeout=3",
     "postgres://app@h/db?sslmode=verify-full&application_name=cron",
     "amqp://guest:guest@h:5672/%2F?heartbeat=30&name=cron", "amqps://h/vhost?no_verify_ssl=1",
     "nats://h:4222", "nats://u:p@h", "tls://h:4222?prefix=a.&stream=S"],
)
def test_good_urls_are_accepted(url: str) -> None:
    backend_from_url(url)


def test_direct_constructors_validate_their_urls_too() -> None:
    with pytest.raises(ConfigError, match="is not a database number"):
        RedisBackend("redis://h/abc")
    with pytest.raises(ConfigError, match="unknown parameter 'prefix'"):
        RedisBackend("redis://h/0?prefix=x:")  # only from_url reads namespace parameters
    with pytest.raises(ConfigError, match="port must be a number"):
        RabbitMQBackend(f"amqp://u:{TOKEN}@h:0/")
    with pytest.raises(ConfigError, match="unknown parameter") as info:
        NatsBackend([f"nats://{TOKEN}@h:4222", "nats://h2:4222?verbose=1"])
    _assert_hidden(str(info.value), TOKEN)


def test_split_namespace_params_leaves_the_rest_as_written() -> None:
    rest, ours = split_namespace_params("sqlite:////abs/x.db?table=t")
    assert (rest, ours) == ("sqlite:////abs/x.db", {"table": "t"})
    rest, ours = split_namespace_params("redis://h/0?a=%2F&prefix=b%3A&c=1")
    assert (rest, ours) == ("redis://h/0?a=%2F&c=1", {"prefix": "b:"})
    with pytest.raises(ConfigError, match="Invalid IPv6 URL"):
        split_namespace_params(f"redis://u:{TOKEN}@[::1")


def test_redact_removes_credentials_from_any_text() -> None:
    url = f"postgresql://app:{NASTY_Q}@h/db?sslpassword={TOKEN}"
    assert set(url_secrets(url)) >= {NASTY, NASTY_Q, TOKEN}
    text = (f"failed for {url} (password={NASTY_Q}, token {TOKEN}, raw {NASTY}) "
            f"and nats://{TOKEN}@elsewhere:4222")
    cleaned = redact(text, url)
    _assert_hidden(cleaned, NASTY, NASTY_Q, TOKEN)
    assert "failed for postgresql://app:***@h/db" in cleaned
    assert redact("nothing secret here", "redis://h/0") == "nothing secret here"


def _chain(exc: BaseException | None) -> str:
    texts = []
    while exc is not None and len(texts) < 10:
        texts += [str(exc), repr(exc)]
        exc = exc.__cause__ or exc.__context__
    return " ".join(texts)


@pytest.mark.timeout(60)
@pytest.mark.parametrize(
    ("template", "options"),
    [("redis://app:{pw}@127.0.0.1:{port}/0", {}),
     ("valkey://:{pw}@127.0.0.1:{port}/0?strategy=script", {}),
     ("postgresql://app:{pw}@127.0.0.1:{port}/test?sslpassword={token}", {}),
     ("amqp://app:{pw}@127.0.0.1:{port}/", {"timeout_s": 2.0}),
     ("nats://app:{pw}@127.0.0.1:{port}", {"timeout_s": 1.0}),
     ("nats://{token}@127.0.0.1:{port}", {"timeout_s": 1.0})],
)
async def test_store_errors_and_logs_never_show_a_credential(
        template: str, options: dict[str, Any], caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level("DEBUG")
    url = template.format(pw=NASTY_Q, token=TOKEN, port=free_port())
    backend = backend_from_url(url, **options)
    with pytest.raises(Exception) as info:
        await asyncio.wait_for(backend.start(), 30)
    with contextlib.suppress(Exception):
        await backend.stop()
    _assert_hidden(f"{_chain(info.value)} {caplog.text}", NASTY, NASTY_Q, TOKEN)


@pytest.mark.parametrize(("url", "options", "reason"), [
    ("redis://:hunter2@127.0.0.1:6379/0", {"prefx": "a:"},
     "RedisBackend has no option 'prefx' (for 'redis://:***@127.0.0.1:6379/0'); "
     "did you mean 'prefix'?"),
    ("sqlite:///runs.db", {"tabel": "runs"}, "did you mean 'table'?"),
    ("postgresql://u:hunter2@127.0.0.1/test", {"retries": 3},
     "PostgresBackend has no option 'retries' (for 'postgresql://u:***@127.0.0.1/test'); "
     "options: table, timeout_ms, read_only, transaction_pooling"),
    ("amqp://guest:hunter2@127.0.0.1:5672/", {"prefx": "a."}, "did you mean 'prefix'?"),
    ("nats://127.0.0.1:4222", {"strem": "CRON2"}, "did you mean 'stream'?"),
])
def test_an_unknown_keyword_option_is_a_config_error_naming_it(
        url: str, options: dict[str, Any], reason: str) -> None:
    with pytest.raises(ConfigError) as info:
        backend_from_url(url, **options)
    assert reason in str(info.value)
    assert "hunter2" not in str(info.value)

"""The chaos harness, short profile: a fleet under random faults on every store.

Each backend gets five instance processes and about 10 s of SIGKILLs, SIGSTOPs longer
than the lease, SIGTERMs, restarts of a dedicated store server and clock skew (see
``chaos/``), then the checker judges the ledgers and ``history()``. The build fails on any
duplicate success, lost run, side effect by a fenced runner after a takeover, or a clock
shift that did not apply. ``ANARCHON_CHAOS_SEED`` replays a seed; ``ANARCHON_CHAOS_SECONDS``
lengthens the runs. The long profile is ``nox -s chaos -- --profile long`` (docs/chaos.md).
"""

from __future__ import annotations

import os
import secrets
import shutil
from pathlib import Path

import pytest

from chaos.check import format_report
from chaos.run import run_chaos

from .stores import iter_ids, unavailable

pytestmark = [pytest.mark.slow, pytest.mark.timeout(240)]

#: chaos backend name → the tests/stores id whose presence says the backend is there.
BACKENDS = {
    "sqlite": "sqlite",
    "redis": "redis",
    "valkey": "valkey",
    "postgres": "postgres",
    "redis-script": "redis-script",
    "rabbitmq": "rabbitmq",
    "nats": "nats",
}
AVAILABLE = set(iter_ids())
SECONDS = float(os.environ.get("ANARCHON_CHAOS_SECONDS", "10"))


def _seed() -> int:
    given = os.environ.get("ANARCHON_CHAOS_SEED")
    return int(given) if given else secrets.randbelow(2**31)


@pytest.mark.parametrize("backend", [b for b, store in BACKENDS.items() if store in AVAILABLE])
def test_chaos_short_profile(backend: str, tmp_path: Path) -> None:
    if backend == "rabbitmq" and not shutil.which("rabbitmq-server") and \
            not Path("/usr/sbin/rabbitmq-server").exists():
        unavailable("RabbitMQ", "rabbitmq-server is not installed")
    seed = _seed()
    try:
        result = run_chaos(backend, seconds=SECONDS, instances=5, seed=seed, profile="short",
                           workdir=tmp_path / "run")
    except RuntimeError as exc:
        if "not found" in str(exc):
            unavailable(f"the {backend} server", str(exc))
        raise
    report = result.report
    table = format_report(report)
    print(table)
    assert not report.failures(), f"seed {seed}:\n{table}\n" + "\n".join(report.failures())
    assert sum(report.faults.values()) >= 3, f"seed {seed}: too few faults injected\n{table}"
    assert report.total("successes") >= report.total("due") // 3, (
        f"seed {seed}: most due slots did not succeed\n{table}")
    if backend != "sqlite":
        assert report.skew, f"seed {seed}: no clock skew was checked\n{table}"

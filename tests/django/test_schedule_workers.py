"""Schedules in the database with real ``manage.py anarchon`` workers (examples/django).

Three workers on one database: a ``Schedule`` row created by application code (a tenant's
newsletter) is live on every worker within the pick-up bound (5 s; the poll is 2 s), runs
once per slot across them with its kwargs, and an edit, a disable and a delete each reach
every worker within the same bound.
"""

from __future__ import annotations

import re
import subprocess
import sys
import time
from collections import Counter
from contextlib import ExitStack
from pathlib import Path
from typing import Any

import pytest

from tests.django.test_processes import (
    EXAMPLE,
    Setup,
    Worker,
    base_env,
    dedicated_postgres,  # noqa: F401 - a fixture
    migrate,
    postgres_database,
)
from tests.support.helpers import wait_for
from tests.support.procs import read_history

pytestmark = [pytest.mark.slow, pytest.mark.timeout(240)]

#: The pick-up bound a change must meet on every worker (s).
BOUND_S = 5.0
_PUT = re.compile(r"Schedule table: (\d+) job\(s\) put(?: \(([^)]*)\))?, (\d+) dropped")


@pytest.fixture(params=["sqlite", "postgres"])
def deployment(request: pytest.FixtureRequest, tmp_path: Path) -> Setup:
    if request.param == "sqlite":
        url = f"sqlite:///{tmp_path / 'shop.sqlite3'}"
    else:
        url = postgres_database(request.getfixturevalue("dedicated_postgres"))
    return Setup(base_env(url), f"{url}?table=anarchon_runs", url)


def orm(setup: Setup, code: str) -> None:
    """Run ``code`` in the project (``manage.py shell``), as application code would."""
    out = subprocess.run(
        [sys.executable, "manage.py", "shell", "-c",
         "from anarchon_django.models import Schedule\n" + code],
        cwd=EXAMPLE, env=setup.env, capture_output=True, text=True, timeout=60, check=False)
    assert out.returncode == 0, out.stderr[-3000:]


def changes(worker: Worker) -> list[tuple[list[str], int]]:
    """The worker's applied changes: (names put, how many dropped), oldest first."""
    return [([n for n in (m.group(2) or "").split(", ") if n], int(m.group(3)))
            for m in _PUT.finditer(worker.log())]


def live_everywhere(workers: list[Worker], seen: list[int], what: str) -> float:
    """Wait until every worker applied one more change than ``seen``; the slowest (s)."""
    start = time.monotonic()
    wait_for(lambda: all(len(changes(w)) > n for w, n in zip(workers, seen, strict=True)),
             BOUND_S * 3, f"{what} on every worker")
    took = time.monotonic() - start
    assert took <= BOUND_S, f"{what} took {took:.1f} s to reach every worker"
    seen[:] = [len(changes(w)) for w in workers]
    return took


def successes(setup: Setup, job: str) -> list[Any]:
    return [r for r in read_history(setup.history_url, job) if r.status == "success"]


def test_a_tenant_schedule_reaches_every_worker(deployment: Setup, tmp_path: Path) -> None:
    migrate(deployment)
    job = "newsletter-acme"
    with ExitStack() as stack:
        workers = [Worker(deployment, tmp_path / f"worker{i}.log") for i in range(3)]
        for worker in workers:
            stack.callback(worker.kill)
        wait_for(lambda: all(w.ready() for w in workers), 60, "3 workers to start")
        assert all(" and 0 from the Schedule table on " in w.log() for w in workers)
        seen = [len(changes(w)) for w in workers]

        orm(deployment, f"Schedule.objects.create(name={job!r}, target='send-newsletter', "
                        "every='1s', jitter_ms=0, kwargs={'tenant': 'acme'})")
        live_everywhere(workers, seen, "the new schedule")
        assert all(changes(w)[-1][0] == [job] for w in workers)
        wait_for(lambda: len(successes(deployment, job)) >= 3, 20, "three runs")

        orm(deployment, f"Schedule.objects.filter(name={job!r}).update("
                        "kwargs={'tenant': 'acme', 'segment': 'vip'})")
        live_everywhere(workers, seen, "the edit")
        wait_for(lambda: any(r.meta.get("segment") == "vip"
                             for r in successes(deployment, job)), 20, "a run of the edit")

        orm(deployment, f"Schedule.objects.filter(name={job!r}).update(enabled=False)")
        live_everywhere(workers, seen, "the disable")
        assert all(changes(w)[-1] == ([], 1) for w in workers)

        orm(deployment, f"Schedule.objects.filter(name={job!r}).update(enabled=True)")
        live_everywhere(workers, seen, "enabling it again")
        orm(deployment, f"Schedule.objects.filter(name={job!r}).delete()")
        live_everywhere(workers, seen, "the delete")
        time.sleep(1.5)  # a slot claimed before the delete may still end
        count = len(successes(deployment, job))
        time.sleep(3)
        assert len(successes(deployment, job)) == count
        codes = [w.stop() for w in workers]
        assert codes == [0, 0, 0], [w.log()[-2000:] for w in workers]

    runs = successes(deployment, job)
    twice = {slot: n for slot, n in Counter(r.slot for r in runs).items() if n > 1}
    assert not twice, f"slots that succeeded twice: {twice}"
    assert {r.meta.get("tenant") for r in runs} == {"acme"}

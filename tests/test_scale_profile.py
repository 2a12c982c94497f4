"""A CI-sized scale run: many jobs sharing instants, correctness only (no timing asserts).

The full profile (10,000 jobs, several instances, figures) is ``python -m bench.scale``;
here a smaller one checks what must never change with scale: no slot runs twice, none is
missing, and no store call failed (no warning or error line at all).
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import pytest

from bench.scale import run_scale

from .stores import StoreHandle

pytestmark = [pytest.mark.slow, pytest.mark.timeout(180)]


@pytest.mark.parametrize(("store", "jobs", "instances"),
                         [("redis", 1_000, 2), ("postgres", 300, 2)])
def test_many_jobs_sharing_instants_each_run_once(
        store: str, jobs: int, instances: int, tmp_path: Path,
        store_handles: Callable[[str], StoreHandle]) -> None:
    store_handles(store)  # a missing service skips loudly, or fails under CI=true
    row = run_scale(store, jobs, "5s", instances, 10.0, tmp_path, drain_s=6.0)
    assert row["duplicates"] == 0, row
    assert row["ran"] == row["expected"], (
        f"{row['expected'] - row['ran']} of {row['expected']} due runs never started: {row}")
    assert row["warnings"] == 0, f"warning or error lines were logged: {row['samples']}"

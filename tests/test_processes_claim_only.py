"""Real processes racing on every claim-only store: each slot runs exactly once.

Claim-only stores (RabbitMQ, NATS, Redis stream-id/script) have no leases, so there is no
takeover, fencing or hand-over to test: one run per slot, one attempt per run.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from .stores import StoreHandle, StoreSpec
from .support.procs import check_every_slot_runs_once

pytestmark = [pytest.mark.slow, pytest.mark.timeout(120)]


def test_four_processes_run_every_slot_exactly_once(
    claim_store: tuple[StoreSpec, StoreHandle], namespace: str, tmp_path: Path
) -> None:
    handle = claim_store[1]
    assert handle.url is not None
    histories = check_every_slot_runs_once(handle.url(namespace), tmp_path)
    for job, history in histories.items():
        assert all(r.attempt == 1 for r in history), f"{job}: claim-only runs have one attempt"

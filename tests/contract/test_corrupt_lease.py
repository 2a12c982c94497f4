"""A corrupt lease on another run never blocks its job, on every lease store.

The overlap check asks whether another run of the job holds a live lease. A lease further
ahead of the store's clock than anarchon ever writes (``decision.MAX_LEASE_AHEAD_MS``: the
longest ``lease_ms`` plus a margin) is a corrupt record: the check ignores it and the store
reports it once, instead of skipping every later slot of the job for overlap. A long lease
anarchon could have written still counts.
"""

from __future__ import annotations

import logging

import pytest

from anarchon_core.backend import Backend, new_token
from anarchon_core.decision import MAX_LEASE_AHEAD_MS
from anarchon_core.models import ClaimOutcome, ClaimRequest, RunRef
from anarchon_core.options import MAX_LEASE_MS

from ..stores import StoreHandle, StoreSpec

pytestmark = pytest.mark.timeout(60)

JOB = "job"


def _request(slot: int) -> ClaimRequest:
    return ClaimRequest(job=JOB, slot=slot, token=new_token(), runner="r", lease_ms=30_000,
                        overlap=False)


def _corrupt_warnings(caplog: pytest.LogCaptureFixture) -> list[str]:
    return [r.getMessage() for r in caplog.records
            if r.levelno == logging.WARNING and "corrupt record" in r.getMessage()]


async def test_a_lease_further_ahead_than_anarchon_writes_never_blocks_the_job(
        lease_store: tuple[StoreSpec, StoreHandle], lease_backend: Backend, namespace: str,
        caplog: pytest.LogCaptureFixture) -> None:
    spec, handle = lease_store
    assert handle.set_lease is not None, f"{spec.id}: the store needs a set_lease hook"
    now = await lease_backend.clock_ms()
    stuck = _request(now - 60_000)
    assert (await lease_backend.claim(stuck)).won
    corrupt: list[float] = [now + 10**15, now + MAX_LEASE_AHEAD_MS + 600_000]
    if not spec.id.startswith("postgres"):  # a BIGINT column holds no 1e30
        corrupt.append(1e30)
    with caplog.at_level(logging.WARNING, logger="anarchon"):
        for n, lease_until in enumerate(corrupt):
            handle.set_lease(namespace, JOB, stuck.slot, lease_until)
            for k in range(2):
                slot = now - 50_000 + 10_000 * n + 1_000 * k
                later = _request(slot)
                result = await lease_backend.claim(later)
                assert result.outcome is ClaimOutcome.WON, (lease_until, result)
                assert await lease_backend.finish(RunRef(JOB, slot, later.token, 1),
                                                  "success")
    if spec.id != "memory":  # a store's record; the memory backend's are the test's own
        warnings = _corrupt_warnings(caplog)
        assert len(warnings) == 1, warnings  # once per run, not once per claim
        assert all(str(stuck.slot) in w for w in warnings), warnings
    # The corrupt run itself is left alone: it may be running.
    assert (await lease_backend.claim(_request(stuck.slot))).outcome is ClaimOutcome.RUNNING
    # The longest lease anarchon writes still protects the next slot.
    handle.set_lease(namespace, JOB, stuck.slot, now + MAX_LEASE_MS)
    result = await lease_backend.claim(_request(now - 20_000))
    assert result.outcome is ClaimOutcome.OVERLAP

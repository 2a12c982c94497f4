"""The no-op handler every ``Schedule`` row names, and as many code-declared jobs.

``BENCH_CODE_JOBS`` jobs ``every(BENCH_PERIOD_S)`` (``cron(BENCH_CODE_CRON)`` when that is
set) run the same handler, declared in code: the run they are measured in has the
``Schedule`` table left out.
"""

from __future__ import annotations

import os

import anarchon_django
from anarchon_core import JobContext

#: The target of the bench's ``Schedule`` rows.
HANDLER = "bench-noop"


@anarchon_django.handler(HANDLER)
async def noop(ctx: JobContext, **kwargs: object) -> None:
    """Do nothing: the bench measures scheduling, not work (its edits change ``kwargs``)."""


_CRON = os.environ.get("BENCH_CODE_CRON", "")
for _i in range(int(os.environ.get("BENCH_CODE_JOBS", "0"))):
    if _CRON:
        anarchon_django.cron(f"code-{_i:06d}", _CRON, noop, tz="UTC")
    else:
        anarchon_django.every(f"code-{_i:06d}", f"{os.environ.get('BENCH_PERIOD_S', '60')}s",
                              noop)

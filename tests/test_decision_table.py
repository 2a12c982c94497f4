"""The decision table, tested once: decide() and update_applies() against the case list.

The same cases drive the store contract (tests/contract/test_decision_contract.py). This
file also checks that every row of the module docstring's tables has a case and that the
tables in docs/concepts.md say exactly what the docstring says.
"""

from __future__ import annotations

import re
import textwrap
from pathlib import Path

import pytest

from anarchon_core import decision
from anarchon_core.decision import (
    CANCELLED,
    HANDED_OVER,
    WAITING,
    WAITING_HANDED_OVER,
    RunState,
    decide,
    update_applies,
)
from anarchon_core.models import ClaimRequest

from .contract.decision_cases import CLAIMS, UPDATES, ClaimCase, State, UpdateCase

NOW = 1_800_000_000_000
CALLER = "caller-token"
HOLDER = "holder-token"
CONCEPTS = Path(__file__).resolve().parent.parent / "docs" / "concepts.md"

#: What decide() sees for each state: the slot's current attempt, and whether another run
#: of the job holds a live lease.
_STATES: dict[State, tuple[RunState | None, bool]] = {
    State.NONE: (None, False),
    State.NONE_OTHER_LIVE: (None, True),
    State.NONE_OTHER_EXPIRED: (None, False),
    State.NONE_OTHER_WAITING: (None, True),
    State.FINISHED: (RunState(1, HOLDER, "success", None), False),
    State.FAILED: (RunState(1, HOLDER, "failed", None), False),
    State.RUNNING: (RunState(1, HOLDER, "running", NOW + 60_000), False),
    State.RUNNING_OWN: (RunState(1, CALLER, "running", NOW + 60_000), False),
    State.EXPIRED: (RunState(1, HOLDER, "running", NOW - 100), False),
    State.RELEASED: (RunState(1, HOLDER, "running", NOW), False),
    State.WAITING_OWN: (RunState(1, CALLER, "running", NOW + 60_000, WAITING), True),
    State.WAITING_OWN_FREE: (RunState(1, CALLER, "running", NOW + 60_000, WAITING), False),
    State.CANCELLED_OWN: (RunState(1, CALLER, "running", NOW + 60_000, CANCELLED), True),
    State.CANCELLED: (RunState(1, HOLDER, "running", NOW + 60_000, CANCELLED), True),
    State.CANCELLED_EXPIRED: (RunState(1, HOLDER, "running", NOW - 100, CANCELLED), True),
    State.WAITING_EXPIRED: (RunState(1, HOLDER, "running", NOW - 100, WAITING), True),
    State.WAITING_RELEASED: (RunState(1, HOLDER, "running", NOW, WAITING_HANDED_OVER), True),
    State.EXPIRED_OTHER_LIVE: (RunState(1, HOLDER, "running", NOW - 100), True),
}
#: States in which one of the job's other live runs is a waiting attempt.
_OTHER_WAITING = {State.NONE_OTHER_WAITING}
#: The (status, error) of attempt 1 that update_applies() sees for each state.
_UPDATE_STATES: dict[State, tuple[str, str | None]] = {
    State.RUNNING: ("running", None),
    State.RELEASED: ("running", HANDED_OVER),
    State.FINISHED: ("success", None),
    State.WAITING_OWN: ("running", WAITING),
    State.CANCELLED: ("running", CANCELLED),
}


@pytest.mark.parametrize("case", CLAIMS, ids=lambda c: c.id)
def test_decide(case: ClaimCase) -> None:
    state, other_live = _STATES[case.state]
    request = ClaimRequest(job="job", slot=NOW + case.slot_offset_ms, token=CALLER,
                           runner="caller", manual=case.manual, lease_ms=30_000,
                           overlap=case.overlap, max_attempts=case.max_attempts,
                           max_late_ms=case.max_late_ms, missed=case.missed)
    other_waiting = case.state in _OTHER_WAITING
    if not decision.needs_overlap_check(request, state):
        other_live = other_waiting = False
    got = decide(request, state, NOW, other_live, other_waiting)
    assert (got.outcome, got.attempt, got.action) == (case.outcome, case.attempt, case.action)
    if case.action is decision.Action.SKIP:
        _, status, error = case.history[0]
        assert got.status == status
        assert error is not None
        assert error in (got.error or "")
    if case.action is decision.Action.START:
        assert got.lease_until_ms == NOW + 30_000


@pytest.mark.parametrize("case", UPDATES, ids=lambda c: c.id)
def test_update_applies(case: UpdateCase) -> None:
    status, error = _UPDATE_STATES[case.state]
    assert update_applies(case.update, status, error, case.own_token) is case.applies


def test_an_unknown_update_is_refused() -> None:
    with pytest.raises(ValueError, match="unknown lease update"):
        update_applies("renew", "running", None, True)


def _plain(text: str) -> str:
    """A cell as one line of Markdown: roles dropped, RST literals as Markdown code."""
    text = re.sub(r":[a-z]+:`~?([^`]+)`", r"`\1`", text)
    return " ".join(text.replace("``", "`").split())


def rst_tables(doc: str) -> list[list[tuple[str, ...]]]:
    """The simple RST tables of a docstring: rows of cells, continuation lines joined."""
    tables: list[list[tuple[str, ...]]] = []
    lines = doc.splitlines()
    i = 0
    while i < len(lines):
        if not re.fullmatch(r"=+( +=+)+", lines[i]):
            i += 1
            continue
        bounds = [m.span() for m in re.finditer(r"=+", lines[i])]
        borders = 0
        rows: list[list[str]] = []
        while i < len(lines) and borders < 3:
            line = lines[i]
            if re.fullmatch(r"=+( +=+)+", line):
                borders += 1
            elif borders == 2:
                cells = [line[a:b if n < len(bounds) - 1 else None].strip()
                         for n, (a, b) in enumerate(bounds)]
                if cells[0] or not rows:
                    rows.append(cells)
                else:
                    rows[-1] = [f"{old} {new}".strip() for old, new in zip(rows[-1], cells,
                                                                             strict=True)]
            i += 1
        tables.append([tuple(_plain(c) for c in row) for row in rows])
    return tables


def markdown_tables(text: str, section: str) -> list[list[tuple[str, ...]]]:
    """The Markdown tables of one ``## section`` of a page, without their header rows."""
    body = text.split(f"\n## {section}\n", 1)[1].split("\n## ", 1)[0]
    tables: list[list[tuple[str, ...]]] = []
    current: list[tuple[str, ...]] | None = None
    for line in body.splitlines():
        if not line.startswith("|"):
            current = None
            continue
        cells = tuple(_plain(c) for c in line.strip().strip("|").split("|"))
        if current is None:
            current = []
            tables.append(current)
            continue  # the header row
        if all(set(c) <= set("-: ") for c in cells):
            continue
        current.append(cells)
    return tables


def _docstring_tables() -> tuple[list[tuple[str, ...]], list[tuple[str, ...]]]:
    assert decision.__doc__ is not None
    claims, updates = rst_tables(decision.__doc__)
    return claims, updates


def _row_of(rows: list[tuple[str, ...]], key: tuple[str, str]) -> int:
    state, condition = key
    start = _plain(condition)
    hits = [n for n, row in enumerate(rows) if row[0] == state and row[1].startswith(start)
            and (start or not row[1])]
    assert len(hits) == 1, f"{key} names {len(hits)} rows of {rows}"
    return hits[0]


def test_every_row_of_the_tables_has_a_case() -> None:
    claims, updates = _docstring_tables()
    assert len(claims) >= 10
    assert len(updates) >= 4
    claim_rows = {_row_of(claims, case.row) for case in CLAIMS}
    assert claim_rows == set(range(len(claims))), [claims[n] for n in
                                                   set(range(len(claims))) - claim_rows]
    update_rows = {_row_of(updates, case.row) for case in UPDATES}
    assert update_rows == set(range(len(updates))), [updates[n] for n in
                                                     set(range(len(updates))) - update_rows]


def test_docs_concepts_shows_the_same_tables() -> None:
    claims, updates = _docstring_tables()
    docs = markdown_tables(CONCEPTS.read_text(encoding="utf-8"), "The decision table")
    assert len(docs) == 2, "docs/concepts.md: the claim table and the update table"
    assert docs[0] == claims
    assert docs[1] == updates


def test_the_table_parsers() -> None:
    doc = textwrap.dedent("""
        Intro.

        ====  ==========  ====
        a     b           c
        ====  ==========  ====
        x     one ``y``   z
              two         more
        w     :data:`V`   →
        ====  ==========  ====
        """)
    assert rst_tables(doc) == [[("x", "one `y` two", "z more"), ("w", "`V`", "→")]]
    page = "## Other\n| a |\n|---|\n| no |\n\n## T\n| a | b |\n|---|---|\n| x | `y` |\n"
    assert markdown_tables(page, "T") == [[("x", "`y`")]]

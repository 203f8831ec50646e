"""docs/operating.md's table of status condition reasons and the operator code agree.

Both directions: every reason the table lists is a string the operator writes, and
every reason written as a literal in a condition constructor is in the table (under
the same condition type). Reasons chosen through a variable are covered by the first
direction: renaming one in the code fails here until the table follows."""

from __future__ import annotations

import re
from pathlib import Path

from rooftop_api import conditions as cnd

ROOT = Path(__file__).resolve().parents[3]
PACKAGES = ("rooftop_operator", "rooftop_control")
CODE = {p.name: p.read_text() for pkg in PACKAGES for p in (ROOT / "operator" / pkg).glob("*.py")}
TYPES = {name: getattr(cnd, name) for name in ("PLANNED", "FEASIBLE", "DEPLOYED", "READY",
                                               "SLO_MET", "WITHIN_BUDGET",
                                               "WORKLOAD_OBSERVED", "MODEL_CACHED")}  # fmt: skip


def documented() -> set[tuple[str, str]]:
    text = (ROOT / "docs" / "operating.md").read_text()
    section = text.split("## Status conditions", 1)[1].split("\n\n", 2)[2]
    table = section.split("\n\n", 1)[0]
    pairs = set()
    for row in table.splitlines()[2:]:
        cells = [c.strip() for c in row.strip("|").split("|")]
        pairs |= {(cells[0], reason) for reason in re.findall(r"`(\w+)`", cells[1])}
    return pairs


def written_literally() -> set[tuple[str, str]]:
    pairs = set()
    for source in CODE.values():
        for const, reason in re.findall(r'Condition\(\s*cnd\.(\w+),\s*"\w+",\s*"(\w+)"', source):
            pairs.add((TYPES[const], reason))
        for const, reason in re.findall(
            r'Condition\(\s*type=(\w+),\s*status="\w+",\s*reason="(\w+)"', source
        ):
            pairs.add((TYPES[const], reason))
    return pairs


def test_the_table_is_parsed() -> None:
    table = documented()
    assert ("Ready", "Unschedulable") in table and ("Feasible", "NodesUnavailable") in table
    assert len(table) >= 20
    assert {("Ready", "Unschedulable"), ("SLOMet", "NoTraffic")} <= written_literally()


def test_every_literal_reason_is_documented() -> None:
    missing = written_literally() - documented()
    assert not missing, f"add to docs/operating.md's status conditions table: {sorted(missing)}"


def test_every_documented_reason_is_written_by_the_operator() -> None:
    code = "\n".join(CODE.values())
    stale = sorted(r for _, r in documented() if f'"{r}"' not in code)
    assert not stale, f"docs/operating.md documents reasons the operator never writes: {stale}"

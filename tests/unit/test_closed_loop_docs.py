"""The closed loop's goal table in docs/benchmarks.md, and the README's summary of it,
say what the recorded ``bench_simulate.py`` table between its markers says.

``bench_simulate.py --write-docs`` rewrites only that table (a replay takes minutes);
the goal table and the README quote it by hand, so a re-run that moves a figure, or
flips a target from met to missed, fails here until they are brought along.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from types import ModuleType

import pytest

ROOT = Path(__file__).resolve().parents[2]
DOC = (ROOT / "docs" / "benchmarks.md").read_text()
STATIC_FIT_TARGET = 0.7  # x static-fit, mean over seeds (the third target)

Rows = list[list[str]]


def cells(line: str) -> list[str]:
    return [c.strip() for c in line.strip().strip("|").split("|")]


@pytest.fixture(scope="module")
def targets(load_benchmark: Callable[[str], ModuleType]) -> tuple[float, float]:
    """(share of requests within TPOT, x oracle): the targets the benchmarks judge by."""
    bench_targets = load_benchmark("bench_targets")
    return bench_targets.TPOT_TARGET, bench_targets.COST_TARGET


@pytest.fixture(scope="module")
def recorded(load_benchmark: Callable[[str], ModuleType]) -> Rows:
    """The rows of the table ``bench_simulate.py --write-docs`` wrote."""
    bench = load_benchmark("bench_simulate")
    table = DOC[DOC.index(bench.START) : DOC.index(bench.END)]
    return [cells(line) for line in table.splitlines() if line.startswith("| diurnal |")]


def policy_row(rows: Rows, reality: str, policy: str) -> list[str]:
    return next(r for r in rows if r[1] == reality and r[2] == policy)


def seeds_row(rows: Rows, reality: str) -> list[str]:
    """| trace | reality | seeds | worst | mean | $ mean | x oracle: mean | worst |
    x static-fit: mean | worst | (each seed against its own baselines)"""
    return next(r for r in rows if r[1] == reality and r[2].isdigit())


def goal_row(starts: str) -> list[str]:
    line = next(line for line in DOC.splitlines() if line.startswith(f"| {starts}"))
    return cells(line)[1:]


def share(text: str) -> float:
    return float(text.rstrip("%")) / 100


def test_the_goal_table_quotes_the_recorded_runs_and_marks_them(
    recorded: Rows, targets: tuple[float, float]
) -> None:
    tpot_target, oracle_target = targets
    attainment = goal_row("≥ 99 % of requests within TPOT")
    cost = goal_row("≤ 1.15x `oracle`")
    static = goal_row("≤ 0.7x `static-fit`")
    # the goal table has a column per reality factor the recorded run covers, in order
    realities = list(dict.fromkeys(r[1] for r in recorded))
    for i, reality in enumerate(realities):
        seeds = seeds_row(recorded, reality)
        worst, ratio = share(seeds[3]), float(seeds[6])
        fit_ratio = float(seeds[8])
        mark = "✓" if worst >= tpot_target else "✗"
        assert attainment[i].startswith(seeds[3].replace("%", " % ") + mark), attainment[i]
        oracle_meets = share(policy_row(recorded, reality, "oracle")[3]) >= tpot_target
        # against an oracle that misses the SLO itself, a ratio means nothing
        expect = f"{ratio:.2f} " + ("✓" if ratio <= oracle_target else "✗")
        assert cost[i].startswith(expect if oracle_meets else f"{ratio:.2f}, not met"), (
            reality, cost[i])  # fmt: skip
        mark = "✓" if fit_ratio <= STATIC_FIT_TARGET else "✗"
        assert static[i].startswith(f"{fit_ratio:.2f} {mark}"), (reality, static[i], fit_ratio)


def test_the_readme_summary_quotes_the_recorded_runs(
    recorded: Rows, targets: tuple[float, float]
) -> None:
    readme = " ".join((ROOT / "README.md").read_text().split())
    planned = seeds_row(recorded, "1")
    oracle = policy_row(recorded, "1", "oracle")
    tpot_target, oracle_target = targets
    quoted = [
        f"keeps {planned[3].rstrip('%')} % of requests",
        f"{planned[4].rstrip('%')} % on average",
        f"at {float(planned[6]):.2f}x the cost of a hindsight schedule that keeps "
        f"{oracle[3].rstrip('%')} %",
        f"{float(planned[8]):.2f}x the cheapest fixed fleet",
        f"its goals are {tpot_target:.0%}".replace("%", " %") + f" at {oracle_target}x",
    ]
    stale = [q for q in quoted if q not in readme]
    assert not stale, f"README's closed-loop summary is stale: {stale}"

"""The closed loop's goal table in docs/benchmarks.md, and the README's summary of it,
say what the recorded ``bench_simulate.py`` table between its markers says.

``bench_simulate.py --write-docs`` rewrites only that table (a replay takes minutes);
the goal table and the README quote it by hand, so a re-run that moves a figure, or
flips a target from met to missed, fails here until they are brought along.
"""

from __future__ import annotations

from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
DOC = (ROOT / "docs" / "benchmarks.md").read_text()
REALITIES = ("0.7", "1", "1.3")
TPOT_TARGET_PCT, ORACLE_TARGET, STATIC_FIT_TARGET = 99.0, 1.15, 0.7


def cells(line: str) -> list[str]:
    return [c.strip() for c in line.strip().strip("|").split("|")]


def recorded() -> list[list[str]]:
    """The rows of the table ``bench_simulate.py --write-docs`` wrote."""
    start, end = (
        DOC.index("<!-- simulate-table:start -->"),
        DOC.index("<!-- simulate-table:end -->"),
    )
    return [cells(line) for line in DOC[start:end].splitlines()
            if line.startswith("| diurnal |")]  # fmt: skip


def policy_row(reality: str, policy: str) -> list[str]:
    return next(r for r in recorded() if r[1] == reality and r[2] == policy)


def seeds_row(reality: str) -> list[str]:
    """| trace | reality | seeds | worst | mean | $ mean | x oracle mean | worst |"""
    return next(r for r in recorded() if r[1] == reality and r[2].isdigit())


def goal_row(starts: str) -> list[str]:
    line = next(line for line in DOC.splitlines() if line.startswith(f"| {starts}"))
    return cells(line)[1:]


def pct(text: str) -> float:
    return float(text.rstrip("%"))


def test_the_goal_table_quotes_the_recorded_runs_and_marks_them() -> None:
    attainment = goal_row("≥ 99 % of requests within TPOT")
    cost = goal_row("≤ 1.15x `oracle`")
    static = goal_row("≤ 0.7x `static-fit`")
    for i, reality in enumerate(REALITIES):
        seeds = seeds_row(reality)
        worst, ratio = pct(seeds[3]), float(seeds[6])
        fit_ratio = float(seeds[5]) / float(policy_row(reality, "static-fit")[6])
        assert attainment[i].startswith(
            f"{worst:.2f} % " + ("✓" if worst >= TPOT_TARGET_PCT else "✗")
        )
        oracle_meets = pct(policy_row(reality, "oracle")[3]) >= TPOT_TARGET_PCT
        # against an oracle that misses the SLO itself, a ratio means nothing
        expect = f"{ratio:.2f} " + ("✓" if ratio <= ORACLE_TARGET else "✗")
        assert cost[i].startswith(expect if oracle_meets else f"{ratio:.2f}, not met"), (
            reality, cost[i])  # fmt: skip
        mark = "✓" if fit_ratio <= STATIC_FIT_TARGET else "✗"
        assert static[i].startswith(f"{fit_ratio:.2f} {mark}"), (reality, static[i], fit_ratio)


def test_the_readme_summary_quotes_the_recorded_runs() -> None:
    readme = " ".join((ROOT / "README.md").read_text().split())
    fast, planned = seeds_row("0.7"), seeds_row("1")
    oracle = policy_row("1", "oracle")
    quoted = [
        f"keeps {pct(fast[3]):.2f} % of requests",
        f"at {float(fast[6]):.2f}x the cost of a hindsight schedule",
        f"{pct(planned[3]):.2f} % at {float(planned[6]):.2f}x",
        f"the schedule keeps {pct(oracle[3]):.2f} %",
        f"its goals are {TPOT_TARGET_PCT:.0f} % at {ORACLE_TARGET}x",
    ]
    stale = [q for q in quoted if q not in readme]
    assert not stale, f"README's closed-loop summary is stale: {stale}"

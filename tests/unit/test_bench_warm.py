"""The second-day benchmark's table (``benchmarks/bench_warm.py``), on made-up days:
each day's cost is divided by the oracle of that day's own noise seed."""

from __future__ import annotations

from collections.abc import Callable
from types import ModuleType

import pytest


@pytest.fixture(scope="module")
def bench(load_benchmark: Callable[[str], ModuleType]) -> ModuleType:
    return load_benchmark("bench_warm")


def test_each_day_is_priced_against_its_own_seeds_oracle(bench: ModuleType) -> None:
    nan = float("nan")
    day2 = bench.NEXT_DAY_SEED
    results = [
        ((0.7, 0, True), [(0.992, 10.0, nan)]),
        ((0.7, 1, True), [(0.991, 8.0, nan)]),
        ((0.7, day2, True), [(0.992, 12.0, nan)]),
        ((0.7, day2 + 1, True), [(0.991, 9.0, nan)]),
        # per day: attainment, USD, trim at the day's end
        ((0.7, 0, False), [(0.995, 11.0, 0.80), (0.993, 12.0, 0.82)]),
        ((0.7, 1, False), [(0.991, 10.0, 0.75), (0.989, 9.9, 0.78)]),
    ]
    row = bench.table(results, [0.7]).splitlines()[2]
    cells = [c.strip() for c in row.strip("|").split("|")]
    assert cells[1] == "0.80, 0.75"
    assert cells[2] == "99.100% ✓ / 1.175 ✗"  # (11/10 + 10/8) / 2
    assert cells[3] == "98.900% ✗ / 1.050 ✓"  # (12/12 + 9.9/9) / 2
    assert cells[4] == "1 of 2, 1 of 2"

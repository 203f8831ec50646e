"""The right-prior benchmark's search and table (``benchmarks/bench_prior.py``), on a
made-up attainment curve instead of replays."""

from __future__ import annotations

from collections.abc import Callable, Iterable, Iterator
from types import ModuleType
from typing import Any

import pytest


@pytest.fixture(scope="module")
def bench(load_benchmark: Callable[[str], ModuleType]) -> ModuleType:
    return load_benchmark("bench_prior")


def test_next_index_tries_the_top_first_then_bisects(bench: ModuleType) -> None:
    assert bench.next_index(-1, None, 56) == 56
    assert bench.next_index(56, None, 56) is None  # even the top misses: give up
    assert bench.next_index(-1, 56, 56) == 27
    assert bench.next_index(27, 56, 56) == 41
    assert bench.next_index(40, 41, 56) is None  # adjacent: 41 is the answer


class CurvePool:
    """Answers replays from a curve: attainment rises with the trim, the worst seed
    (seed 1) a little lower; cost grows with the trim."""

    def __init__(self, threshold: dict[float, float]) -> None:
        self.threshold = threshold
        self.calls = 0

    def map(self, _fn: Callable[..., Any], jobs: Iterable[Any]) -> Iterator[Any]:
        for reality, seed, trim in jobs:
            self.calls += 1
            attainment = 0.99 + 0.01 * (trim - self.threshold[reality]) - 0.001 * seed
            yield (reality, seed, trim), attainment, 10.0 * trim


def test_search_finds_the_smallest_grid_trim_meeting_the_worst_seed(bench: ModuleType) -> None:
    pool = CurvePool({0.7: 0.7, 1.3: 1.6})
    results = bench.search([0.7, 1.3], [0, 1], pool)
    for reality in (0.7, 1.3):
        worst: dict[float, float] = {}
        for (r, _, trim), attainment, _ in results:
            if r == reality:
                worst[trim] = min(worst.get(trim, 1.0), attainment)
        found = min(t for t, a in worst.items() if a >= 0.99)
        # seed 1 needs trim >= threshold + 0.1: the first grid point there
        want = min(t for t in bench.TRIMS if t >= pool.threshold[reality] + 0.1 - 1e-12)
        assert found == pytest.approx(want)
        assert max(t for t, a in worst.items() if a < 0.99) < want  # its neighbour was tried
    assert pool.calls <= 2 * 2 * 8  # a bisection, not a sweep of 57 trims


def test_search_gives_up_when_the_top_trim_misses(bench: ModuleType) -> None:
    pool = CurvePool({1.3: 5.0})
    results = bench.search([1.3], [0], pool)
    assert [job[2] for job, _, _ in results] == [bench.TRIMS[-1]]


def test_table_marks_the_cheapest_meeting_trim_and_its_neighbour(bench: ModuleType) -> None:
    results = [
        ((1.0, 0, None), 0.992, 10.0),  # each seed's oracle
        ((1.0, 1, None), 0.991, 8.0),
        ((1.0, 0, 0.8), 0.995, 11.0),
        ((1.0, 1, 0.8), 0.989, 8.4),  # misses on its worst seed
        ((1.0, 0, 0.9), 0.995, 12.0),
        ((1.0, 1, 0.9), 0.991, 9.2),
    ]
    rows = bench.table(results, [1.0]).splitlines()[2:]
    # each seed against its own oracle: (11/10 + 8.4/8) / 2, (12/10 + 9.2/8) / 2
    assert "largest missing: 0.800" in rows[0] and "98.900% ✗ / 1.075 ✓" in rows[0]
    assert "smallest meeting: 0.900" in rows[1] and "99.100% ✓ / 1.175 ✗" in rows[1]
    assert "1 of 2" in rows[0] and "1 of 2" in rows[1]

"""The declared-workload benchmark (``benchmarks/bench_declared.py``) on made-up rows:
the worst seed per (trace, scale), a shortfall marked, and the declared lengths scaled
as it says."""

from __future__ import annotations

from collections.abc import Callable
from types import ModuleType
from typing import Any

import numpy as np
import pytest


@pytest.fixture(scope="module")
def bench(load_benchmark: Callable[[str], ModuleType]) -> ModuleType:
    return load_benchmark("bench_declared")


def row(scale: float, seed: int, after: float, ratio: float) -> dict[str, Any]:
    return {"case": "excerpt (8B, p90)", "scale": scale, "seed": seed, "percentile": 0.9,
            "shape": "1x l4", "attainment": after - 0.01, "after_window": after,
            "cost_ratio": ratio, "oracle_attainment": 0.95}  # fmt: skip


def test_the_table_reports_the_worst_seed_and_marks_a_shortfall(bench: ModuleType) -> None:
    rows = [row(0.5, 0, 0.95, 1.1), row(0.5, 1, 0.899, 1.3), row(2.0, 0, 0.97, 1.0)]
    lines = [ln for ln in bench.table(rows, "cmd").splitlines() if ln.startswith("| excerpt")]
    assert lines[0] == (
        "| excerpt (8B, p90) | x0.5 | 1x l4 | 2 | 89.900% (under) | 88.900% | 1.20 | 1.30 |"
    )
    assert "(under)" not in lines[1] and "| x2 |" in lines[1]


def test_the_declared_lengths_are_the_traces_times_the_scale(bench: ModuleType) -> None:
    spec = bench.declared_spec("excerpt (8B, p90)", 2.0)
    _, _, _, (prompt, prompt_p90, output, output_p90) = bench.CASES["excerpt (8B, p90)"]
    assert spec.workload.prompt_tokens.mean == 2 * prompt
    assert spec.workload.output_tokens.p90 == 2 * output_p90


def test_only_requests_after_the_first_window_count(bench: ModuleType) -> None:
    class Result:
        class workload:  # noqa: N801 (stands in for the RequestStream attribute)
            arrival_s = np.array([10.0, 70.0, 80.0, 90.0])

        finished_s = np.array([20.0, 90.0, np.inf, 95.0])
        tpot_s = np.array([0.5, 0.02, np.nan, np.nan])

    # the early miss is left out; the unfinished one misses; the one-token one meets
    assert bench.after_first_window(Result(), 25.0) == pytest.approx(2 / 3)

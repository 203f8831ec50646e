"""The unseen-day benchmark (``benchmarks/bench_unseen.py``) on made-up rows: each
seed's cost against that seed's own oracle and fixed fleet, the worst seed's
attainment; and its day shapes differ from the ones the loop was tuned on."""

from __future__ import annotations

from collections.abc import Callable
from types import ModuleType
from typing import Any

import pytest


@pytest.fixture(scope="module")
def bench(load_benchmark: Callable[[str], ModuleType]) -> ModuleType:
    return load_benchmark("bench_unseen")


def row(policy: str, seed: int, tpot: float, usd: float) -> dict[str, Any]:
    return {"shape": "s", "reality": 1.0, "seed": seed, "policy": policy, "tpot": tpot,
            "usd": usd, "replicas": usd / 10}  # fmt: skip


def test_each_seed_is_priced_against_its_own_baselines(bench: ModuleType) -> None:
    rows = [
        row("rooftop", 0, 0.995, 11.0), row("oracle", 0, 0.99, 10.0),
        row("static-fit", 0, 0.99, 20.0), row("queue-threshold", 0, 0.98, 15.0),
        row("rooftop", 1, 0.989, 12.0), row("oracle", 1, 0.99, 8.0),
        row("static-fit", 1, 0.99, 24.0), row("queue-threshold", 1, 0.97, 16.0),
    ]  # fmt: skip
    lines = bench.table(rows, "cmd").splitlines()
    rooftop = next(ln for ln in lines if "| rooftop |" in ln)
    # 11/10 and 12/8: mean 1.30, worst 1.50; 11/20 and 12/24: 0.53 (0.525), 0.55
    assert rooftop == "| s | 1 | rooftop | 2 | 98.900% | 1.15 | 1.30 | 1.50 | 0.53 | 0.55 |"


def test_no_day_is_the_one_the_loop_was_tuned_on(bench: ModuleType) -> None:
    """bench_simulate's day: the conversation trace, 3:1, peak mid-trace."""
    for trace, ratio, peak_at, _, _ in bench.SHAPES.values():
        assert (trace, ratio, peak_at) != ("azure_llm_2023_conv.csv", 3.0, 0.5)

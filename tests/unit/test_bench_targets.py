"""The targets benchmark's table (``benchmarks/bench_targets.py``), on made-up results:
worst seed for TPOT, mean over seeds against the seed-0 oracle for cost."""

from __future__ import annotations

from collections.abc import Callable
from types import ModuleType

import pytest


@pytest.fixture(scope="module")
def bench(load_benchmark: Callable[[str], ModuleType]) -> ModuleType:
    return load_benchmark("bench_targets")


RESULTS = [
    (("oracle", 1.0, 0), 0.992, 10.0),
    (("default", 1.0, 0), 0.995, 11.0),
    (("default", 1.0, 1), 0.989, 12.0),  # the worst seed misses 99 %
    (("cheap", 1.0, 0), 0.993, 11.0),
    (("cheap", 1.0, 1), 0.991, 11.4),
]


def test_worst_seed_and_mean_cost_decide_the_marks(bench: ModuleType) -> None:
    text = bench.table(RESULTS, ["default", "cheap"], [1.0])
    rows = {line.split("|")[1].strip(): line for line in text.splitlines()[2:]}
    assert "98.900% ✗ / 1.150 ✓" in rows["default"] and "1 of 2" in rows["default"]
    assert "99.100% ✓ / 1.120 ✓" in rows["cheap"] and "2 of 2" in rows["cheap"]


def test_variants_build_real_controller_overrides(bench: ModuleType) -> None:
    from rooftop_control.calibration import TrimConfig

    for name in bench.VARIANTS:
        overrides = bench.controller_overrides(name)
        assert not isinstance(overrides.get("trim"), dict)
    assert bench.controller_overrides("trim-99")["trim"] == TrimConfig(target=0.99, slack=0.998)


def test_unknown_variant_is_refused(bench: ModuleType, capsys: pytest.CaptureFixture[str]) -> None:
    assert bench.main(["--variants", "default,nope"]) == 2
    assert "nope" in capsys.readouterr().err

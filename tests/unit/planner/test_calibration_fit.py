"""The stored fit must explain the measured data it was fitted on (median error bound)."""

from __future__ import annotations

import statistics
from pathlib import Path

import pytest

from rooftop_planner.calibrate import DEFAULT_DATA, load_observations, log_error
from rooftop_planner.efficiency import load_efficiency

DATA = DEFAULT_DATA.resolve()


@pytest.mark.skipif(not DATA.is_file(), reason="shared/data is not beside the checkout")
def test_stored_fit_median_error_is_below_20_percent() -> None:
    import math

    observations = load_observations(Path(DATA))
    table = load_efficiency()
    errors = [abs(math.exp(log_error(o, table)) - 1) for o in observations]
    assert len(observations) > 5000
    assert statistics.median(errors) < 0.20


def test_fitted_values_are_physical() -> None:
    table = load_efficiency()
    assert table.per_gpu, "catalog/efficiency.yaml is missing: run make calibrate"
    for gpu, eff in table.per_gpu.items():
        assert 0.1 < eff.bandwidth_efficiency <= 1.0, gpu
        assert 0.05 < eff.flops_efficiency <= 1.0, gpu

"""The TPOT percentile over requests (``tail.py``) against a Monte Carlo of its own model.

The model: a request with o output tokens sees N ~ Poisson(λ · t̄ · (o − 1)) prompt
admissions during its decode steps, each adding Δ to one step, and a batch deviation
averaged over its life; its TPOT is t_d + s · ε + Δ · N / (o − 1). The closed-form
mixture quantile must match sampling that model, and behave as the tail should.
"""

from __future__ import annotations

import numpy as np
import pytest

from rooftop_planner import tail

ONE = np.ones(1)


def quantile(q: float, outputs: list[float], extra_s: float = 0.03, rate: float = 4.0,
             slope_s: float = 2e-4, batch: float = 20.0) -> float:  # fmt: skip
    outs = np.array(outputs, dtype=float)
    value = tail.tpot_quantile(
        q, ONE * 0.02, ONE * slope_s, ONE * batch, ONE * rate, ONE * 0.025,
        ONE * extra_s, ONE * extra_s**2, outs, float(outs.mean()),
    )  # fmt: skip
    return float(value[0])


def sampled(q: float, outputs: list[float], extra_s: float = 0.03, rate: float = 4.0,
            slope_s: float = 2e-4, batch: float = 20.0) -> float:  # fmt: skip
    rng = np.random.default_rng(0)
    n = 400_000
    o = rng.choice(np.array(outputs, dtype=float), n)
    mean_o = float(np.mean(outputs))
    admissions = rng.poisson(rate * 0.025 * (o - 1.0))
    spread = rng.normal(0.0, np.sqrt(batch * mean_o / (mean_o + o)))
    tpot = 0.02 + slope_s * spread + extra_s * admissions / (o - 1.0)
    return float(np.quantile(tpot, q))


@pytest.mark.parametrize("q", [0.5, 0.9, 0.99])
@pytest.mark.parametrize("outputs", [[200.0], [20.0, 60.0, 150.0, 400.0], [8.0, 500.0]])
def test_the_mixture_quantile_matches_sampling_the_model(q: float, outputs: list[float]) -> None:
    # within 1 ms of 20-60 ms: the moments-based components are approximations
    assert quantile(q, outputs) == pytest.approx(sampled(q, outputs), abs=1.2e-3)


def test_short_answers_widen_the_tail_at_the_same_mean() -> None:
    long_only = quantile(0.99, [400.0])
    mixed = quantile(0.99, [10.0, 400.0])
    assert mixed > long_only + 5e-3


def test_percentiles_rise_and_no_admissions_means_the_decode_step() -> None:
    values = [quantile(q, [20.0, 100.0, 300.0]) for q in (0.5, 0.9, 0.99)]
    assert values == sorted(values) and values[0] < values[-1]
    still = quantile(0.99, [20.0, 100.0], extra_s=0.0, slope_s=0.0)
    assert still == pytest.approx(0.02, abs=1e-6)

"""The TTFT percentile's queue model against a direct simulation of the same queue."""

from __future__ import annotations

import numpy as np
import pytest

from rooftop_planner import prefill_queue
from rooftop_planner.prefill_queue import TTFT_WEIGHTS, own_weights, ttft_quantile, wait_moments

STRATA = len(TTFT_WEIGHTS)


def simulated_waits(rate: float, work: np.ndarray, count: int, seed: int = 0) -> np.ndarray:
    """FCFS waiting times of an M/G/1 queue (Lindley's recursion): Poisson arrivals at
    ``rate``, each bringing work drawn from the strata's values at ``TTFT_WEIGHTS``."""
    rng = np.random.default_rng(seed)
    gaps = rng.exponential(1.0 / rate, count)
    strata = rng.choice(STRATA, size=count, p=TTFT_WEIGHTS / TTFT_WEIGHTS.sum())
    service = work[strata]
    waits = np.zeros(count)
    for i in range(1, count):
        waits[i] = max(waits[i - 1] + service[i - 1] - gaps[i], 0.0)
    return waits


def work_profile(scale: float) -> np.ndarray:
    """Work (s) rising steeply toward the long-prompt strata, as prefill does."""
    return scale * np.geomspace(0.01, 1.0, STRATA)


@pytest.mark.parametrize(("rate", "scale"), [(5.0, 0.2), (20.0, 0.05), (2.0, 1.0)])
def test_wait_moments_match_a_simulated_queue(rate: float, scale: float) -> None:
    work = work_profile(scale)
    waits = simulated_waits(rate, work, 400_000)
    _, mean, var, _ = wait_moments(np.array([rate]), work[None, :], TTFT_WEIGHTS)
    assert mean[0] == pytest.approx(waits.mean(), rel=0.1)
    assert np.sqrt(var[0]) == pytest.approx(waits.std(), rel=0.1)


def test_deterministic_work_gives_the_pollaczek_khinchine_mean() -> None:
    rate, work = 4.0, 0.1  # ρ = 0.4
    _, mean, _, _ = wait_moments(np.array([rate]), np.full((1, STRATA), work), TTFT_WEIGHTS)
    assert mean[0] == pytest.approx(rate * work**2 / (2.0 * (1.0 - rate * work)))


def test_an_overloaded_queue_waits_far_longer_but_stays_finite() -> None:
    rho, mean, _, _ = wait_moments(np.array([20.0]), np.full((1, STRATA), 0.1), TTFT_WEIGHTS)
    assert rho[0] == prefill_queue.MOST_UTILISATION
    assert np.isfinite(mean[0]) and mean[0] > 10 * 0.1


@pytest.mark.parametrize("q", [0.9, 0.99])
@pytest.mark.parametrize(("rate", "scale"), [(5.0, 0.2), (20.0, 0.05), (2.0, 1.0)])
def test_ttft_quantile_matches_the_simulated_queue(q: float, rate: float, scale: float) -> None:
    """TTFT = wait + the decode step in progress (uniform) + own prefill, own rising with
    the prompt's stratum; the model's percentile is within 15 % of the sampled one."""
    decode = 0.02
    work = work_profile(scale)
    own = 1.5 * work + decode
    count = 400_000
    waits = simulated_waits(rate, work, count, seed=1)
    rng = np.random.default_rng(2)
    strata = rng.choice(STRATA, size=count, p=TTFT_WEIGHTS / TTFT_WEIGHTS.sum())
    residual = rng.uniform(0.0, decode, count)
    sampled = np.quantile(waits + residual + own[strata], q)
    model = ttft_quantile(q, np.array([decode]), np.array([rate]), work[None, :], own[None, :])
    assert model[0] == pytest.approx(sampled, rel=0.15)


def test_ttft_rises_with_the_rate() -> None:
    work, own = work_profile(0.1), 1.5 * work_profile(0.1)
    rates = np.array([1.0, 4.0, 8.0])
    out = ttft_quantile(
        0.99, np.full(3, 0.02), rates, np.repeat(work[None], 3, 0), np.repeat(own[None], 3, 0)
    )
    assert out[0] < out[1] < out[2]


def test_own_weights_read_linearly_between_known_lengths() -> None:
    known = (1000.0, 300.0, 5000.0)  # unsorted: the strata, then the percentile's prompt
    values = np.array([10.0, 3.0, 50.0])
    reads = own_weights(known, (300.0, 650.0, 3000.0, 7000.0))
    assert reads @ values == pytest.approx([3.0, 6.5, 30.0, 70.0])


def test_own_weights_of_equal_known_lengths_take_their_value() -> None:
    reads = own_weights((800.0, 800.0), (500.0, 800.0, 900.0))
    assert reads @ np.array([4.0, 4.0]) == pytest.approx([4.0, 4.0, 4.0])

"""Bursty arrivals: the capacity a fleet holds for them, and how burstiness is counted."""

from __future__ import annotations

import numpy as np
import pytest

from rooftop_api.spec import ServingTargetSpec
from rooftop_planner.bursts import BURST_INTERVAL_S, burst_rate, dispersion
from rooftop_planner.search import plan_target

CODE = {
    "model": "llama-3.1-8b",
    "slo": {"tpotMs": 50, "tpotPercentile": "p90", "ttftMs": 2000},
    "workload": {
        "requestsPerSecond": 2.4,
        "promptTokens": {"mean": 2048, "p90": 5188},
        "outputTokens": {"mean": 28, "p90": 55},
    },
    "budget": {"usdPerHour": 100},
    "constraints": {"gpuTypes": ["l4"], "maxReplicas": 24},
}


def _spec(burstiness: float | None) -> ServingTargetSpec:
    workload = {**CODE["workload"], "arrivalDispersion": burstiness}  # type: ignore[dict-item]
    return ServingTargetSpec.model_validate({**CODE, "workload": workload})


@pytest.mark.parametrize(
    ("rate", "burstiness", "share"),
    [(2.5, 70.0, 0.95), (0.1, 70.0, 0.95), (5.5, 1.6, 0.995), (100.0, 2.0, 0.995)],
)
def test_the_burst_rate_is_the_rate_that_share_of_requests_arrive_into(
    rate: float, burstiness: float, share: float
) -> None:
    """Against the model drawn: a gamma rate with mean λ and variance (D − 1)λ/τ, each
    interval weighted by the requests it brings (its rate)."""
    theta = (burstiness - 1.0) / BURST_INTERVAL_S
    draws = np.random.default_rng(0).gamma(rate / theta, theta, 2_000_000)
    order = np.argsort(draws)
    weight = np.cumsum(draws[order]) / draws.sum()
    expected = draws[order][np.searchsorted(weight, share)]
    assert burst_rate(rate, burstiness, share) == pytest.approx(expected, rel=0.01)


def test_poisson_arrivals_need_nothing_beyond_the_headroom() -> None:
    assert burst_rate(5.0, 1.0, 0.95) == 0.0 == burst_rate(5.0, 0.8, 0.95)
    assert plan_target(_spec(1.0)).plan == plan_target(_spec(None)).plan


def test_a_bursty_target_holds_capacity_for_its_bursts() -> None:
    """Azure's code trace counts about 63 times its mean's variance per 15 s: the plan
    sized for the mean rate (one L4) would miss most of its requests."""
    smooth, bursty = plan_target(_spec(None)).plan, plan_target(_spec(63.0)).plan
    assert smooth is not None and bursty is not None
    assert bursty.replicas > 3 * smooth.replicas
    assert bursty.capacity_rps >= burst_rate(2.4, 63.0, 0.95)


def test_a_p99_ttft_slo_holds_capacity_for_the_bursts_its_share_arrives_into() -> None:
    """Every request arriving into a burst beyond capacity queues for its prefill: a p99
    TTFT bound over a p90 TPOT one holds the rate 99.5 % of requests arrive into."""
    doc = _spec(63.0).model_dump(by_alias=True, exclude_none=True)
    doc["slo"].update(ttftPercentile="p99", ttftMs=8000)  # the p99 prompt: ~13k tokens
    strict = ServingTargetSpec.model_validate(doc)
    assert strict.slo.burst_aim == 0.995 and _spec(63.0).slo.burst_aim == 0.95
    plan = plan_target(strict).plan
    assert plan is not None
    assert plan.capacity_rps >= burst_rate(2.4, 63.0, 0.995) > burst_rate(2.4, 63.0, 0.95)
    assert "99.5 % of requests arrive into" in plan_target(strict).explain()


def test_burstiness_counts_clumps_and_not_the_days_drift() -> None:
    """Poisson counts read 1; so do Poisson counts whose rate grows fivefold over the range (the
    window's rate follows that); requests in clumps of four read 4 (a compound Poisson
    process: the clump's second moment over its first)."""
    rng = np.random.default_rng(1)
    steady = rng.poisson(30.0, 20_000)
    drifting = rng.poisson(np.linspace(10.0, 50.0, 20_000))
    clumped = 4 * rng.poisson(7.5, 20_000)
    assert dispersion(steady) == pytest.approx(1.0, rel=0.05)
    assert dispersion(drifting) == pytest.approx(1.0, rel=0.05)
    assert np.var(drifting) / np.mean(drifting) > 3.0  # the plain index would read drift
    assert dispersion(clumped) == pytest.approx(4.0, rel=0.05)
    assert np.isnan(dispersion([5])) and np.isnan(dispersion([0, 0, 0]))


@pytest.mark.parametrize("shape", [1.0, 0.25, 0.1])
def test_gamma_spaced_arrivals_read_one_over_their_shape(shape: float) -> None:
    """What the spec's description promises a user of ``vllm bench serve --burstiness``."""
    gaps = np.random.default_rng(0).gamma(shape, 1.0 / (5.0 * shape), 400_000)
    counts = np.bincount((np.cumsum(gaps) // BURST_INTERVAL_S).astype(int))
    assert dispersion(counts) == pytest.approx(1.0 / shape, rel=0.1)


def test_the_plan_says_what_it_holds_for_bursts() -> None:
    bursty = plan_target(_spec(63.0))
    (line,) = [r for r in bursty.reasons if r.startswith("holds capacity for")]
    held = burst_rate(2.4, 63.0, 0.95)
    assert f"{held:.3g} req/s" in line and "arrivalDispersion 63" in line and "2.88" in line
    assert not any(r.startswith("holds") for r in plan_target(_spec(None)).reasons)

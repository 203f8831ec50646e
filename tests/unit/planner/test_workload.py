"""Token-length distributions: the strata the search's prefill cost is averaged over."""

from __future__ import annotations

import numpy as np
import pytest

from rooftop_planner.search import PROMPT_STRATA
from rooftop_planner.workload import LengthDistribution, lognormal_from_mean_p90

WIDTHS = np.diff(PROMPT_STRATA)


def test_lognormal_strata_average_to_the_mean_and_keep_the_tail() -> None:
    dist = lognormal_from_mean_p90(1155.0, 2600.0)
    means = np.array(dist.stratum_means(PROMPT_STRATA))
    assert float(WIDTHS @ means) == pytest.approx(1155.0, rel=1e-9)
    assert np.all(np.diff(means) > 0)
    assert means[0] < dist.quantile(0.5) < means[1]
    assert means[-1] > dist.quantile(0.95)  # the top stratum sits above its lower edge


def test_lognormal_strata_match_sampling() -> None:
    dist = lognormal_from_mean_p90(800.0, 1500.0)
    rng = np.random.default_rng(0)
    samples = np.sort(rng.lognormal(dist.mu, dist.sigma, 400_000))
    edges = (np.array(PROMPT_STRATA) * len(samples)).astype(int)
    sampled = [samples[a:b].mean() for a, b in zip(edges[:-1], edges[1:], strict=True)]
    assert dist.stratum_means(PROMPT_STRATA) == pytest.approx(sampled, rel=0.02)


def test_histogram_strata_split_bins_at_the_bounds() -> None:
    # a quarter at 100, half at 1000, a quarter at 5000 tokens
    dist = LengthDistribution(mean=1775.0, bins=((100, 1.0), (1000, 2.0), (5000, 1.0)))
    means = dist.stratum_means((0.0, 0.5, 0.8, 0.95, 1.0))
    assert means == pytest.approx((550.0, (0.25 * 1000 + 0.05 * 5000) / 0.3, 5000.0, 5000.0))
    assert float(WIDTHS @ np.array(means)) == pytest.approx(1775.0)


def test_fixed_length_strata_are_the_length() -> None:
    assert LengthDistribution(mean=512.0).stratum_means(PROMPT_STRATA) == (512.0,) * 4

"""Token-length distributions and the percentiles the SLO search needs.

A length given as mean and p90 is modelled as log-normal (request lengths in production
traces are right-skewed; the Azure 2023 traces in examples/traces/ are). A histogram
is used as given. A mean alone means every request has that length.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from statistics import NormalDist

from rooftop_planner.spec import TokenLengths

_Z90 = NormalDist().inv_cdf(0.9)


@dataclass(frozen=True)
class LengthDistribution:
    """Either log-normal (mu, sigma of ln tokens) or an empirical histogram."""

    mean: float
    mu: float = 0.0
    sigma: float = 0.0
    bins: tuple[tuple[int, float], ...] = ()

    def quantile(self, q: float) -> float:
        """The q-quantile of the length in tokens (0 < q < 1)."""
        if self.bins:
            total = sum(w for _, w in self.bins)
            running = 0.0
            for tokens, weight in sorted(self.bins):
                running += weight
                if running >= q * total:
                    return float(tokens)
            return float(max(t for t, _ in self.bins))
        if self.sigma == 0.0:
            return self.mean
        return math.exp(self.mu + self.sigma * NormalDist().inv_cdf(q))


def from_spec(lengths: TokenLengths) -> LengthDistribution:
    """Fit the distribution the spec describes."""
    if lengths.histogram:
        bins = tuple((b.tokens, b.weight) for b in lengths.histogram)
        total = sum(w for _, w in bins)
        return LengthDistribution(mean=sum(t * w for t, w in bins) / total, bins=bins)
    assert lengths.mean is not None
    if lengths.p90 is None or lengths.p90 <= lengths.mean:
        return LengthDistribution(mean=lengths.mean)
    return lognormal_from_mean_p90(lengths.mean, lengths.p90)


def lognormal_from_mean_p90(mean: float, p90: float) -> LengthDistribution:
    """Solve mean = exp(mu + sigma²/2) and p90 = exp(mu + z90·sigma) for (mu, sigma).

    Subtracting the logs: sigma²/2 − z90·sigma + ln(p90/mean) = 0; take the smaller root.
    Ratios p90/mean above exp(z90²/2) ≈ 2.27 have no solution; sigma is capped at z90.
    """
    ratio = math.log(p90 / mean)
    disc = _Z90**2 - 2.0 * ratio
    sigma = _Z90 - math.sqrt(disc) if disc > 0 else _Z90
    mu = math.log(mean) - sigma**2 / 2.0
    return LengthDistribution(mean=mean, mu=mu, sigma=sigma)

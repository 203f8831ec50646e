"""Token-length distributions and the percentiles the SLO search needs.

A length given as mean and p90 is modelled as log-normal (request lengths in production
traces are right-skewed; the Azure 2023 traces in examples/traces/ are). A histogram
is used as given. A mean alone means every request has that length.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from statistics import NormalDist

from rooftop_api.spec import TokenLengths

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

    def stratum_means(self, bounds: tuple[float, ...]) -> tuple[float, ...]:
        """Mean length (tokens) of each quantile stratum [bounds[i], bounds[i+1]).

        Weighted by the strata's widths, these means average to the distribution's mean
        exactly, and the narrow top strata keep the long tail that equal-weight quantile
        points miss or, placed in it, overweight. Log-normal:
        E[X | a ≤ F(X) < b] = e^{μ+σ²/2} · (Φ(z_b − σ) − Φ(z_a − σ)) / (b − a), z = Φ⁻¹.
        """
        pairs = list(zip(bounds[:-1], bounds[1:], strict=True))
        if self.bins:
            return tuple(self._histogram_stratum(a, b) for a, b in pairs)
        if self.sigma == 0.0:
            return tuple(self.mean for _ in pairs)
        unit = NormalDist()

        def shifted_cdf(q: float) -> float:
            if q <= 0.0:
                return 0.0
            if q >= 1.0:
                return 1.0
            return unit.cdf(unit.inv_cdf(q) - self.sigma)

        mean = math.exp(self.mu + self.sigma**2 / 2.0)
        return tuple(mean * (shifted_cdf(b) - shifted_cdf(a)) / (b - a) for a, b in pairs)

    def _histogram_stratum(self, lower: float, upper: float) -> float:
        """Mean of the histogram's mass between the lower and upper quantiles."""
        total = sum(w for _, w in self.bins)
        start, mass, weighted = 0.0, 0.0, 0.0
        for tokens, weight in sorted(self.bins):
            share = weight / total
            overlap = min(start + share, upper) - max(start, lower)
            if overlap > 0:
                mass += overlap
                weighted += overlap * tokens
            start += share
        return weighted / mass if mass > 0 else self.quantile(upper)


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

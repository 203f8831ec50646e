"""The TPOT percentile over requests, not over steps.

A request's TPOT averages its own decode steps. While it decodes, other requests arrive
(Poisson, rate λ per replica) and each one's prefill rides in one of the running steps
(chunked prefill), adding Δ seconds to that step. A request with o output tokens lives
T = (o − 1) · t̄ seconds, sees N ~ Poisson(λ · T) admissions, so

    TPOT(o) = t_d + s · ε + Δ · N / (o − 1)

with t_d the decode step without prefill at the mean batch B, s = ∂t_d/∂B the cost of one
more running sequence, and ε ~ Normal(0, B · osl/(osl + o)) the running batch's deviation
averaged over the request's life (Poisson occupancy; the batch turns over once per mean
residence, so a long answer averages more of the spread away). The mean over requests is
t_d + λ · t̄ · E[Δ] for every o, but the spread grows as o shrinks: short answers are hit
hardest. The p-quantile over requests is that of the mixture over the output-length
distribution (quantile points, finer among short answers), each component approximated by its first
three moments (normal-power: x = μ + σ · (w + γ · (w² − 1)/6), w standard normal), read
off the mixture's CDF between the components' own quantiles (which bracket it).
Everything is vectorised over the search's batch grid.

A prompt longer than the step's token budget K rides in c = ceil(n / K) consecutive
steps, each adding δ = Δ / c. A request of L = o − 1 decode steps shares only part of
that run with it when c is not small against L: over the run's possible starts the
overlap k has Σk² = S₂(L, c), so one admission's share of the request's TPOT
contributes λt̄ · δ² · S₂ / L² to its variance (λt̄ admissions per step). The model
uses the bound S₂ ≤ L · c · min(c, L) (``chunks_seen``): a run that fits in the life
counts whole (c ≤ L: L · c², which is λt̄ · Δ² / L as above, exact for c = 1), and a
run longer than the life covers all L steps from about c of its starts (c > L: c · L²).
It never understates the variance, and it shows what a smaller K does for an answer
shorter than a prompt's chunk count: for c ≫ L the variance is c times smaller than a
lump's, since a short answer sees a slice of a long prompt's chunks, not all of them.
The price is TTFT: the prompt's own prefill takes c full steps.
"""

from __future__ import annotations

from collections.abc import Callable
from math import sqrt
from statistics import NormalDist

import numpy as np

from rooftop_planner.kernels import FloatArray

# The mixture's output-length strata (quantile bounds): finer at the short end, where
# the tail comes from. A request of a few tokens averages one prefill stall over a few
# gaps; equal sixths put the shortest point at the p8 answer (about 50 tokens in
# Azure's conversation trace), and the 2 % of answers under 20 tokens, which missed a
# p99 TPOT bound 7 % of the time in simulation, were not in the model at all.
OUTPUT_STRATA = (0.0, 0.02, 0.05, 0.1, 0.25, 0.5, 0.75, 1.0)
OUTPUT_WEIGHTS = np.diff(np.array(OUTPUT_STRATA))
CDF_POINTS = 13  # the mixture's CDF is read on this many points across the bracket
_FRACTIONS = np.linspace(0.0, 1.0, CDF_POINTS)
_SQRT2 = sqrt(2.0)
_Z = NormalDist()
# Abramowitz & Stegun 7.1.26: erf to 1.5e-7, vectorised (numpy has no erf)
_AS = (0.254829592, -0.284496736, 1.421413741, -1.453152027, 1.061405429)


def _erf(x: FloatArray) -> FloatArray:
    a = np.abs(x)
    t = 1.0 / (1.0 + 0.3275911 * a)
    # Horner's rule in place: the mixtures' CDFs are the search's largest arrays
    poly = t * _AS[4]
    for coef in (_AS[3], _AS[2], _AS[1], _AS[0]):
        poly += coef
        poly *= t
    np.square(a, out=a)
    np.negative(a, out=a)
    np.exp(a, out=a)
    poly *= a
    np.subtract(1.0, poly, out=poly)
    out: FloatArray = np.copysign(poly, x, out=poly)
    return out


def output_points(quantile: Callable[[float], float]) -> FloatArray:
    """Output lengths at the mid-quantiles of ``OUTPUT_STRATA`` (≥ 2 tokens), the
    mixture's components; ``OUTPUT_WEIGHTS`` are their weights."""
    bounds = OUTPUT_STRATA
    middles = [(a + b) / 2.0 for a, b in zip(bounds[:-1], bounds[1:], strict=True)]
    return np.array([max(quantile(m), 2.0) for m in middles], dtype=np.float64)


def _component_cdf(x: FloatArray, mean: FloatArray, sd: FloatArray, skew: FloatArray) -> FloatArray:
    """P(X ≤ x) under the normal-power approximation of (mean, sd, skew)."""
    z = (x - mean) / np.maximum(sd, 1e-15)
    inv = 1.0 / np.maximum(skew, 1e-6)
    # invert z = w + g (w² − 1)/6 for the root continuous at g → 0:
    # w = √(9/g² + 6z/g + 1) − 3/g, computed in place on z's array
    z *= 6.0 * inv
    z += 9.0 * inv * inv + 1.0
    np.maximum(z, 0.0, out=z)
    np.sqrt(z, out=z)
    z -= 3.0 * inv
    z /= _SQRT2
    cdf = _erf(z)
    cdf += 1.0
    cdf *= 0.5
    return cdf


def chunks_seen(steps: FloatArray, chunks: FloatArray) -> FloatArray:
    """r = min(c, L) / c: the share of a prompt's c chunk steps counted against a request
    of L decode steps, so that L · c² · r is the bound of S₂ (module doc): L · c² where
    the run fits in the life, c · L² where it does not."""
    out: FloatArray = np.minimum(chunks, steps) / chunks
    return out


def tpot_quantile(
    q: float,
    decode_s: FloatArray,
    slope_s: FloatArray,
    batch: FloatArray,
    rate: FloatArray,
    step_s: FloatArray,
    extra_mean_s: FloatArray,
    chunk_extra_s: FloatArray,
    chunks: FloatArray,
    prompt_weights: FloatArray,
    outputs: FloatArray,
    output_mean: float,
    weights: FloatArray | None = None,
) -> FloatArray:
    """The q-quantile over requests of TPOT (seconds), per grid point.

    Arrays are per grid point (shape G): decode step t_d, slope s, mean batch B, per-replica
    rate λ (requests/s), mean step t̄, E[Δ] of one admission's extra step time. Per grid
    point and prompt stratum (G × S): ``chunk_extra_s``, δ, what one chunk-carrying step
    adds (s), and ``chunks``, c, the steps a prompt of the stratum rides in;
    ``prompt_weights`` (S) the strata's shares. ``outputs`` (shape K) are the mixture's
    output lengths, ``weights`` their shares (None: equal); ``output_mean`` the
    distribution's mean.
    """
    g = decode_s[:, None]
    steps = np.maximum(outputs[None, :] - 1.0, 1.0)
    arrivals_per_step = (rate * step_s)[:, None]  # λ · t̄: admissions per decode step
    mean = g + arrivals_per_step * extra_mean_s[:, None]
    spread = batch[:, None] * output_mean / (output_mean + outputs[None, :])
    var_batch = slope_s[:, None] ** 2 * spread
    # compound Poisson over the strata: κ₂ = λt̄ · m₂ / L with m₂ = Σ_s w_s (c_s δ_s)² r_s
    # (S₂ at its bound, ``chunks_seen``), and κ₃ = λt̄ · m₂^{3/2} / L² (E[Δ³] ≈ E[Δ²]^{3/2})
    lumps = chunks * chunk_extra_s  # c · δ: what one admission adds in all, s (G × S)
    seen = chunks_seen(steps[:, None, :], chunks[:, :, None])  # G × S × K
    m2 = ((prompt_weights * lumps * lumps)[:, :, None] * seen).sum(axis=1)  # G × K
    var_prefill = arrivals_per_step * m2 / steps
    third = arrivals_per_step * m2**1.5 / steps**2
    var = var_batch + var_prefill
    sd = np.sqrt(np.maximum(var, 1e-30))
    skew = np.minimum(third / np.maximum(var, 1e-30) ** 1.5, 4.0)
    share = np.full(len(outputs), 1.0 / len(outputs)) if weights is None else weights
    return mixture_quantile(q, mean, sd, skew, share)


def mixture_quantile(
    q: float,
    mean: FloatArray,
    sd: FloatArray,
    skew: FloatArray,
    share: FloatArray,
    passes: int = 1,
) -> FloatArray:
    """The q-quantile per row of a mixture of K components (G × K arrays of mean, sd and
    skew, each component normal-power; ``share`` the weights, K or G × K): the CDF read
    across the bracket of its components' own quantiles (which hold it), then the
    crossing of q, linearly between grid points. Each further pass reads the CDF again
    across the grid interval the crossing lies in: a mixture whose components sit far
    apart has a CDF that is flat, then steep, within one interval of the first grid."""
    z = float(_Z.inv_cdf(q))
    own = mean + sd * (z + skew * (z * z - 1.0) / 6.0)
    lo, hi = own.min(axis=1), own.max(axis=1)
    shares = np.broadcast_to(share, own.shape)
    weights = shares / shares.sum(axis=1, keepdims=True)
    rows = np.arange(len(lo))
    for _ in range(passes):
        xs = lo[:, None] + (hi - lo)[:, None] * _FRACTIONS[None, :]  # G × M
        cdf = _component_cdf(xs[:, None, :], mean[:, :, None], sd[:, :, None], skew[:, :, None])
        mix = np.einsum("gkm,gk->gm", cdf, weights)  # G × M, rising in x
        above = np.argmax(mix >= q, axis=1)  # first grid point at or past q (0 if none)
        i = np.clip(above, 1, len(_FRACTIONS) - 1)
        x0, x1 = xs[rows, i - 1], xs[rows, i]
        f0, f1 = mix[rows, i - 1], mix[rows, i]
        reached = mix[:, -1] >= q
        lo, hi = np.where(reached, x0, hi), np.where(reached, x1, hi)
    frac = np.clip((q - f0) / np.maximum(f1 - f0, 1e-12), 0.0, 1.0)
    out: FloatArray = np.where(reached, x0 + frac * (x1 - x0), hi)
    return out

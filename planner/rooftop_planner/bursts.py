"""Arrival bursts: the request rate a fleet holds capacity for when requests clump.

The search sizes replicas for the mean rate λ (req/s) with a fixed headroom, and its
TPOT tail (``tail``) already spreads the running batch as Poisson arrivals would.
Real traffic can be far burstier: in Azure's 2023 code-completion trace the requests
counted in 15-s intervals vary about 70 times as much as their mean (Poisson: once), and
69 % of its requests arrive in intervals running above twice the hour's mean rate
(``benchmarks/bench_bursts.py``). A
pod takes minutes to start, so a fleet cannot follow such swings; it has to hold the
capacity for them.

Burstiness is read as the index of dispersion D of the requests counted in
``BURST_INTERVAL_S`` intervals (variance over mean; 1 for Poisson). The counts are
modelled as Poisson at a rate that itself varies (a Cox process) with a gamma
distribution: mean λ and variance (D − 1) · λ / τ (req/s)², so shape k = λτ / (D − 1)
and scale θ = (D − 1) / τ. A request is more likely to arrive while the rate is high:
the rate a request arrives into has density r · g(r) / λ, which is gamma with shape
k + 1 and the same scale. The fleet holds capacity for that rate's quantile at the share
of requests the plan aims to keep within the SLO (p90: 95 %). Within an interval the
arrivals are Poisson at the interval's rate, which the tail model covers.

Every request arriving into an interval above capacity counts as missed: the queue it
joins outlasts the interval, and while it drains every running request's steps carry
full prefill chunks. That errs toward holding more: in the simulated engine about the
share C/r of such requests, or more, still met their bound.

Burstiness is what the fleet cannot follow, not the day's drift, which the loop's
window rate does follow: the operator reads D as the variance of consecutive counts'
differences, halved, over their mean (for Poisson counts 1, as the plain variance
over the mean is; a rate that drifts over the range adds nothing).

θ does not depend on λ: clumps of requests (one user's editor firing several
completions) keep their size as the traffic grows, so D measured at one rate holds at
another (a compound Poisson process, whose dispersion is its clump's second moment over
its first).
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from statistics import NormalDist

import numpy as np
import numpy.typing as npt

# Replicas are sized for at least this much more than the mean rate: swings of
# Poisson-like traffic beyond the tail model's own, and a rate that rises between two
# re-plans. A stated or observed burstiness holds more where it needs more.
HEADROOM = 1.2
# The interval dispersion is counted over, s: the scrape and decision interval, the
# finest rate the operator observes (a rate that swings faster averages out within a
# request's own time in the engine, where the tail model's Poisson spread covers it).
BURST_INTERVAL_S = 15.0


def burst_rate(rate: float, dispersion: float, share: float) -> float:
    """The ``BURST_INTERVAL_S`` arrival rate (req/s) that ``share`` of requests arrive
    into, for a mean ``rate`` (req/s) with index of dispersion ``dispersion``; 0 where
    arrivals are Poisson or less bursty (D ≤ 1: nothing beyond the tail model's spread).

    The gamma quantile by Wilson and Hilferty (within 1 % for shape ≥ 1, which k + 1 is):
    x_q = a·θ·(1 − 1/(9a) + z_q / (3√a))³ with a = k + 1, z_q the normal quantile.
    """
    if dispersion <= 1.0 or rate <= 0.0:
        return 0.0
    theta = (dispersion - 1.0) / BURST_INTERVAL_S
    shape = rate / theta + 1.0
    z = NormalDist().inv_cdf(share)
    cube = max(1.0 - 1.0 / (9.0 * shape) + z / (3.0 * math.sqrt(shape)), 0.0) ** 3
    return shape * theta * cube


def dispersion(counts: Sequence[float] | npt.NDArray[np.int64] | npt.NDArray[np.float64]) -> float:
    """D of requests counted in consecutive ``BURST_INTERVAL_S`` intervals: the variance
    of consecutive counts' differences, halved, over the mean count (module doc); NaN
    with fewer than two intervals or none counted. The operator's PromQL
    (``rooftop_operator.metrics_client``) reads the same from Prometheus."""
    values = np.asarray(counts, dtype=np.float64)
    if values.size < 2 or values.mean() <= 0.0:
        return math.nan
    return float(np.diff(values).var() / 2.0 / values.mean())


def interval_counts(times_s: Sequence[float] | npt.NDArray[np.float64]) -> npt.NDArray[np.int64]:
    """Events (arrival or finish times, s from a trace's start) counted in consecutive
    ``BURST_INTERVAL_S`` intervals from 0: what ``dispersion`` reads for a trace."""
    bins = (np.asarray(times_s, dtype=np.float64) // BURST_INTERVAL_S).astype(np.int64)
    return np.bincount(bins).astype(np.int64)

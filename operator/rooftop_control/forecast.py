"""Demand over time: the request rate's trend and where it is heading.

Pure arithmetic over (time s, rate req/s) readings, the ones ``ControllerState.rates``
keeps: the least-squares trend and the rate projected ahead. Separate from the decision
(``control``) because it knows nothing of replicas, the SLO or the planner.
"""

from __future__ import annotations

import math
from collections.abc import Sequence


def forecast_rate(
    rates: Sequence[tuple[float, float]], lead_s: float, trend_from_s: float = -math.inf
) -> float:
    """The rate expected ``lead_s`` ahead, req/s: never below the latest reading.

    A least-squares line over the remembered readings taken at ``trend_from_s`` or
    later; only a rising trend is projected (a falling one is left to the slow
    scale-down, which is the safe side).
    """
    if not rates:
        return 0.0
    latest_t, latest = rates[-1]
    trend = rate_trend([(t, r) for t, r in rates if t >= trend_from_s], 60.0)
    if trend is None:
        return latest
    mean_t, mean_rate, slope = trend
    fitted_now = mean_rate + slope * (latest_t - mean_t)
    return max(latest, fitted_now) + max(0.0, slope) * lead_s


def rate_trend(
    rates: Sequence[tuple[float, float]], min_span_s: float
) -> tuple[float, float, float] | None:
    """The least-squares line through (time s, rate req/s) readings: (mean time s,
    mean rate req/s, slope req/s per s); None with under 3 readings or ``min_span_s``."""
    if len(rates) < 3 or rates[-1][0] - rates[0][0] < min_span_s:
        return None
    n = len(rates)
    mt = sum(t for t, _ in rates) / n
    mr = sum(r for _, r in rates) / n
    var = sum((t - mt) ** 2 for t, _ in rates)
    slope = sum((t - mt) * (r - mr) for t, r in rates) / var if var > 0 else 0.0
    return mt, mr, slope

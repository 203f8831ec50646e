"""Online calibration: how much slower (or faster) the engine really is than predicted.

The planner's roofline prediction is a model; the running engine is the truth. The
controller measures the ratio

    raw = observed mean step time / predicted step time (same batch, same context)

and feeds the planner ``step_time_scale = factor``, a smoothed and bounded ``raw``.
Smoothing is an exponentially weighted moving average whose weight starts at 1 (the
first sample replaces the prior) and decays to ``alpha`` (a running mean until then):
a fresh deployment learns its factor in a few scrapes, a settled one is not thrown by
one noisy window. Bounds keep one broken scrape (a stalled pod, a unit mix-up) from
sizing the fleet 10x: a factor outside [lower, upper] is a bug to report, not to obey.

Only OK samples update the factor (the caller checks metric states): a missing or NaN
reading is "unknown", never "1.0".
"""

from __future__ import annotations

import math
from dataclasses import dataclass, replace

from rooftop_api.spec import aimed_share


@dataclass(frozen=True)
class CalibrationConfig:
    """How the factor is smoothed and bounded.

    Attributes:
        alpha: weight of the newest sample once settled (0 < alpha <= 1).
        lower: smallest factor accepted (engine 2x faster than predicted).
        upper: largest factor accepted (engine 3x slower than predicted).
        min_batch: mean running requests per replica below which a window is not used;
            near-idle step times are dominated by fixed overheads the prediction
            does not model well, so they would bias the factor.
        settled_samples: samples after which the factor is trusted enough to change
            the batch cap (a pod restart), not only replica counts.
    """

    alpha: float = 0.3
    lower: float = 0.5
    upper: float = 3.0
    min_batch: float = 1.0
    settled_samples: int = 8

    def __post_init__(self) -> None:
        if not 0 < self.alpha <= 1:
            raise ValueError(f"alpha must be in (0, 1], got {self.alpha}")
        if not 0 < self.lower <= 1 <= self.upper:
            raise ValueError(f"need 0 < lower <= 1 <= upper, got {self.lower}, {self.upper}")


@dataclass(frozen=True)
class Calibration:
    """The current estimate.

    Attributes:
        factor: observed / predicted step time, smoothed and bounded (1.0 = as predicted).
        samples: how many OK windows went into ``factor``.
        last_raw: the latest unsmoothed ratio (before bounding), for status and debugging.
    """

    factor: float = 1.0
    samples: int = 0
    last_raw: float | None = None

    def settled(self, config: CalibrationConfig) -> bool:
        """Whether enough windows have been seen to act on the factor beyond replicas."""
        return self.samples >= config.settled_samples


def clamp(value: float, lower: float, upper: float) -> float:
    """``value`` limited to ``[lower, upper]``."""
    return min(upper, max(lower, value))


def raw_factor(observed_s: float, predicted_s: float) -> float | None:
    """observed / predicted, or None when either is not a positive finite number."""
    if not (math.isfinite(observed_s) and math.isfinite(predicted_s)):
        return None
    if observed_s <= 0 or predicted_s <= 0:
        return None
    return observed_s / predicted_s


def update(
    cal: Calibration,
    observed_s: float,
    predicted_s: float,
    config: CalibrationConfig | None = None,
) -> Calibration:
    """Fold one window's observation into the estimate.

    Args:
        cal: the estimate so far.
        observed_s: measured mean step time (inter-token latency) over the window, s
            (any unit works as long as both arguments share it).
        predicted_s: the planner's step time for the same batch and context, same unit.
        config: smoothing and bounds.

    Returns:
        The new estimate; ``cal`` unchanged when the sample is unusable.
    """
    cfg = config or CalibrationConfig()
    raw = raw_factor(observed_s, predicted_s)
    if raw is None:
        return cal
    # Bound the sample itself, not only the result: one 50x outlier must not drag a
    # settled estimate to the bound in a single step.
    sample = clamp(raw, cfg.lower, cfg.upper)
    weight = max(cfg.alpha, 1.0 / (cal.samples + 1))
    factor = clamp((1 - weight) * cal.factor + weight * sample, cfg.lower, cfg.upper)
    return replace(cal, factor=factor, samples=cal.samples + 1, last_raw=raw)


# ---------------------------------------------------------------- latency trim


@dataclass(frozen=True)
class TrimConfig:
    """Integral feedback from the observed SLO attainment onto the planned rate.

    The step-time factor makes the planner's MEAN step right at the batch the fleet
    runs; the planner's percentile model can still be off in shape (how fast the tail
    grows with load, prefill bursts), and the SLO is about the tail. The trim
    multiplies the rate the planner sizes for. It is driven by the share of the
    window's requests whose TPOT met the bound (``attainment``), the quantity the SLO
    promises, not by a percentile against an arbitrary margin:

    - attainment below ``target``: up by ``up`` times the shortfall in units of the
      allowed misses (1 - target), at most ``max_steps`` steps: 5 % misses against a
      0.5 % allowance is a planner far off, one miss too many is barely a signal;
    - attainment at least ``slack`` AND the percentile below ``low`` x the bound:
      down by ``down`` times ``low`` x bound / percentile (at most ``max_steps``): a
      percentile at a third of the bound is more room than one just under ``low``;
    - otherwise hold (dead band).

    Which windows may move the trim at all (a settled fleet the planner sized, see
    ``control.trim_after_window``) is the caller's business; ``tight`` is its knob.

    Attributes:
        target: share of requests within the bound to keep, 0..1.
        slack: share that counts as "no misses at all", 0..1.
        low: percentile / bound below which there is room to run hotter.
        up / down: relative change per step; one judgement per metrics window.
        max_steps: the most steps one window may move the trim.
        lower / upper: bounds of the trim.
        tight: a clean window lowers the trim only if this much more load (0.4 =
            40 %) would make the trimmed planner want more replicas than are ready:
            evidence that the fleet ran near the capacity the planner claims.
        settle_windows: metrics windows after a pod became ready before a window may
            move the trim (a request finishing in the window may have started a
            window earlier, on the smaller fleet).
    """

    target: float = 0.995
    slack: float = 0.999
    low: float = 0.7
    up: float = 0.05
    down: float = 0.04
    max_steps: float = 4.0
    lower: float = 0.5
    upper: float = 2.0
    tight: float = 0.4
    settle_windows: float = 2.0

    @classmethod
    def for_percentile(cls, quantile: float) -> TrimConfig:
        """The trim that aims at a TPOT percentile (0.9 for p90) with the margin the
        planner sizes for (``rooftop_api.spec.aimed_share``): ``target = q + ½ (1 − q)``,
        ``slack`` four fifths of the way from there to 1 (p99: 0.995 and 0.999; p90:
        0.95 and 0.99)."""
        target = aimed_share(quantile)
        return cls(target=target, slack=target + 0.8 * (1.0 - target))

    def __post_init__(self) -> None:
        if not 0 < self.target <= self.slack <= 1:
            raise ValueError(f"need 0 < target <= slack <= 1, got {self.target}, {self.slack}")
        if not (self.up > 0 and 0 < self.down * self.max_steps < 1 and self.max_steps >= 1):
            raise ValueError("need up > 0, max_steps >= 1 and 0 < down * max_steps < 1")
        if not 0 < self.lower <= 1 <= self.upper:
            raise ValueError(f"need 0 < lower <= 1 <= upper, got {self.lower}, {self.upper}")
        if self.settle_windows < 0:
            raise ValueError(f"settle_windows must be >= 0, got {self.settle_windows}")


def update_trim(
    trim: float, attainment: float, percentile_ms: float, slo_ms: float, config: TrimConfig
) -> float:
    """One integral step from a window's attainment (0..1) and percentile (ms); the
    caller decides when a window is trustworthy (settled fleet, OK readings)."""
    if not (math.isfinite(attainment) and math.isfinite(percentile_ms) and slo_ms > 0):
        return trim
    if attainment < config.target:
        steps = (1 - attainment) / (1 - config.target)
        trim *= 1 + config.up * min(config.max_steps, steps)
    elif attainment >= config.slack and percentile_ms < config.low * slo_ms:
        steps = config.low * slo_ms / max(percentile_ms, 1e-9)
        trim *= 1 - config.down * min(config.max_steps, steps)
    return clamp(trim, config.lower, config.upper)

"""Online calibration: smoothing, bounds and what counts as a usable sample."""

from __future__ import annotations

import math

import pytest

from rooftop_control.calibration import (
    Calibration,
    CalibrationConfig,
    TrimConfig,
    raw_factor,
    update,
    update_trim,
)

CFG = CalibrationConfig(alpha=0.3, lower=0.5, upper=3.0)


@pytest.mark.parametrize(
    ("observed", "predicted", "expected"),
    [
        (26.0, 20.0, 1.3),  # engine 30 % slower than predicted
        (0.0, 20.0, None),  # a zero step time is a broken scrape, not an infinitely fast GPU
        (20.0, 0.0, None),  # no prediction: nothing to compare
        (math.nan, 20.0, None),  # histogram over an empty window
        (math.inf, 20.0, None),
        (-5.0, 20.0, None),
    ],
)
def test_raw_factor(observed: float, predicted: float, expected: float | None) -> None:
    got = raw_factor(observed, predicted)
    assert got == (None if expected is None else pytest.approx(expected))


def test_first_sample_replaces_the_prior() -> None:
    # A fresh deployment should not need ten scrapes to learn that it is 30 % slow.
    cal = update(Calibration(), 26.0, 20.0, CFG)
    assert cal.factor == pytest.approx(1.3)
    assert cal.samples == 1


def test_running_mean_then_ewma() -> None:
    # Weights 1, 1/2, 1/3 (running mean) until they fall below alpha = 0.3, then 0.3.
    cal = Calibration()
    for obs in (1.0, 2.0, 3.0):
        cal = update(cal, obs, 1.0, CFG)
    assert cal.factor == pytest.approx(2.0)  # mean of 1, 2, 3
    cal = update(cal, 1.0, 1.0, CFG)  # weight max(0.3, 1/4) = 0.3
    assert cal.factor == pytest.approx(0.7 * 2.0 + 0.3 * 1.0)


def test_smoothing_damps_one_noisy_window() -> None:
    # A settled factor moves by alpha * (sample - factor), not to the sample.
    cal = Calibration(factor=1.2, samples=20)
    cal = update(cal, 2.0, 1.0, CFG)
    assert cal.factor == pytest.approx(1.2 + 0.3 * 0.8)


@pytest.mark.parametrize(
    ("raw", "expected"),
    [
        (50.0, 3.0),  # a 50x outlier is clamped to the upper bound
        (0.01, 0.5),  # and a 100x-too-fast one to the lower
    ],
)
def test_bounds_apply_to_first_sample(raw: float, expected: float) -> None:
    cal = update(Calibration(), raw, 1.0, CFG)
    assert cal.factor == expected
    assert cal.last_raw == pytest.approx(raw)  # the unbounded ratio stays visible


def test_outlier_cannot_drag_settled_factor_to_the_bound() -> None:
    # The sample is clamped before averaging: 1.0 -> 1.0 + 0.3 * (3.0 - 1.0), not 15.7.
    cal = update(Calibration(factor=1.0, samples=10), 50.0, 1.0, CFG)
    assert cal.factor == pytest.approx(1.6)


def test_unusable_sample_leaves_estimate_unchanged() -> None:
    cal = Calibration(factor=1.4, samples=5, last_raw=1.5)
    assert update(cal, math.nan, 20.0, CFG) is cal


def test_settled_after_enough_samples() -> None:
    cfg = CalibrationConfig(settled_samples=3)
    cal = Calibration()
    for _ in range(2):
        cal = update(cal, 1.1, 1.0, cfg)
    assert not cal.settled(cfg)
    assert update(cal, 1.1, 1.0, cfg).settled(cfg)


@pytest.mark.parametrize(
    "kwargs", [{"alpha": 0.0}, {"alpha": 1.5}, {"lower": 1.2}, {"upper": 0.9}, {"lower": 0.0}]
)
def test_config_rejects_nonsense(kwargs: dict[str, float]) -> None:
    with pytest.raises(ValueError):
        CalibrationConfig(**kwargs)  # type: ignore[arg-type]


# ---------------------------------------------------------------- latency trim

TRIM = TrimConfig()  # target 99.5 %, slack 99.9 %, low 0.7, up 5 %, down 4 %, 4 steps


@pytest.mark.parametrize(
    ("attainment", "p90_ms", "expected", "why"),
    [
        (0.994, 80.0, 1.0 * (1 + 0.05 * 1.2), "0.6 % misses = 1.2x the allowance"),
        (0.98, 90.0, 1.0 * (1 + 0.05 * 4), "4 % misses = 8x: capped at 4 steps"),
        (0.995, 80.0, 1.0, "exactly on target: hold"),
        (0.997, 50.0, 1.0, "a few misses, room left: dead band, not down"),
        (1.0, 35.0, 1.0 * (1 - 0.04 * 2), "no misses, p90 at half of 0.7 x bound: 2 steps"),
        (1.0, 69.0, 1.0 * (1 - 0.04 * 70 / 69), "just under 0.7 x bound: about one step"),
        (1.0, 5.0, 1.0 * (1 - 0.04 * 4), "far below: capped at 4 steps"),
        (1.0, 75.0, 1.0, "no misses but p90 above 0.7 x bound: hold"),
        (math.nan, 50.0, 1.0, "no requests finished: nothing to judge"),
    ],
)
def test_trim_steps_grow_with_the_evidence(
    attainment: float, p90_ms: float, expected: float, why: str
) -> None:
    assert update_trim(1.0, attainment, p90_ms, 100.0, TRIM) == pytest.approx(expected), why


def test_trim_stays_within_bounds() -> None:
    trim = 1.0
    for _ in range(50):
        trim = update_trim(trim, 0.5, 150.0, 100.0, TRIM)
    assert trim == TRIM.upper
    for _ in range(100):
        trim = update_trim(trim, 1.0, 1.0, 100.0, TRIM)
    assert trim == TRIM.lower


@pytest.mark.parametrize(
    "kwargs",
    [{"target": 0.9999, "slack": 0.999}, {"down": 0.3}, {"up": 0.0}, {"lower": 1.1},
     {"max_steps": 0.5}],
)  # fmt: skip
def test_trim_config_rejects_nonsense(kwargs: dict[str, float]) -> None:
    # down 0.3 x 4 steps would make one clean window take the trim below zero
    with pytest.raises(ValueError):
        TrimConfig(**kwargs)  # type: ignore[arg-type]

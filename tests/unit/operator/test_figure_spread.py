"""A status figure is news beyond the noise measured on the target itself, not only the
noise its counts imply: a TTFT percentile of requests that queue together, or a gauge
read at one instant, wanders by more than √(2/n) of itself, and rewrote a steady
target's status on most ticks."""

from __future__ import annotations

import math
import random
from typing import Any

import pytest

from rooftop_api.spec import ObservedStatus
from rooftop_operator import loop
from rooftop_operator.figure_spread import FigureSpread
from rooftop_operator.loop_memory import LoopMemory

TICK_S = 15.0
RATE = 4.0  # requests/s: 240 in a 60-s window, so the counts' noise of a percentile is
# 3·√(2/240) = 27 % of it


def _figures(rng: random.Random, ttft_ms: float = 400.0) -> dict[str, Any]:
    """One tick's figures of a steady target whose TTFT percentile wanders by 25 % of
    itself (twice what 240 independent requests would give: they queue together) and
    whose running count is over-dispersed (a gauge read at one instant)."""
    return {
        "requestsPerSecond": round(rng.gauss(RATE, math.sqrt(RATE / 60.0)), 4),
        "ttftMs": round(rng.gauss(ttft_ms, 0.25 * ttft_ms), 4),
        "running": float(max(0, round(rng.gauss(12.0, 2.0 * math.sqrt(12.0))))),
    }


def _writes(hours: int, measured: bool, seed: int = 0) -> tuple[list[int], FigureSpread]:
    """Status writes in each of ``hours`` hours of ticks, judged with the measured spread
    or with the counts' noise alone."""
    rng, spread = random.Random(seed), FigureSpread()
    stored = ObservedStatus.model_validate(_figures(rng))
    writes = [0] * hours
    for tick in range(int(hours * 3600 / TICK_S)):
        new = ObservedStatus.model_validate(_figures(rng))
        noise = spread.noise() if measured else None
        spread.add(loop._figures(new), tick * TICK_S)
        if loop.observed_changed(stored, new, 60.0, noise):
            stored = new
            writes[int(tick * TICK_S // 3600)] += 1
    return writes, spread


SEEDS = range(5)


def test_a_steady_target_whose_figures_wander_rewrites_its_status_rarely() -> None:
    """Once the spread has settled (the first hour learns it): about one write an hour
    (some 240 comparisons of each of three figures at three deviations), where the
    counts' noise alone rewrites status on every other tick."""
    measured = [_writes(2, measured=True, seed=seed)[0][1] for seed in SEEDS]
    assert sum(measured) / len(SEEDS) <= 3.0
    counted = [_writes(2, measured=False, seed=seed)[0][1] for seed in SEEDS]
    assert min(counted) >= 60


def test_the_spread_of_a_steady_figure_is_its_tick_to_tick_difference() -> None:
    """Values of standard deviation σ differ from each other by about √2·σ."""
    _, spread = _writes(2, measured=True, seed=1)
    noise = spread.noise()
    assert noise["observed.ttftMs"] == pytest.approx(math.sqrt(2.0) * 100.0, rel=0.25)
    assert noise["observed.running"] == pytest.approx(math.sqrt(2.0 * 4.0 * 12.0), rel=0.25)


def test_a_real_move_is_news_at_once() -> None:
    """Measured noise does not hide a change: TTFT doubling on a steady target is
    written on its first tick."""
    rng, spread = random.Random(2), FigureSpread()
    for tick in range(240):
        spread.add(loop._figures(ObservedStatus.model_validate(_figures(rng))), tick * TICK_S)
    stored = ObservedStatus.model_validate(_figures(rng))
    doubled = ObservedStatus.model_validate(_figures(rng, ttft_ms=800.0))
    assert "observed.ttftMs" in loop.observed_news(stored, doubled, 60.0, spread.noise())


def test_moves_are_measured_over_a_window_and_weighed_by_time() -> None:
    """A figure's move is against the newest tick a window (60 s) older; the squares are
    averaged with weights halving over 15 minutes of time, not of ticks."""
    spread = FigureSpread(lag_s=60.0, half_life_s=900.0)
    for t_s, tpot_ms in ((0.0, 10.0), (30.0, 11.0), (60.0, 14.0), (90.0, 12.0)):
        spread.add({"tpotMs": tpot_ms}, t_s)
    # at 60 s: 14 − 10 = 4 (the first square, held as is); at 90 s: 12 − 11 = 1, weighed
    # by 1 − 2^(−30/900)
    weight = 1.0 - 2.0 ** (-30.0 / 900.0)
    assert spread.noise()["observed.tpotMs"] == pytest.approx(
        math.sqrt(16.0 + weight * (1.0 - 16.0))
    )


def test_a_ramp_is_not_noise() -> None:
    """A rate climbing steadily for an hour (4 to 12 requests/s) with no noise at all:
    its moves over a window are what it climbs in 60 s, so status follows the climb
    instead of counting it as noise."""
    spread = FigureSpread()
    for tick in range(240):
        spread.add({"requestsPerSecond": 4.0 + 8.0 * tick / 240}, tick * TICK_S)
    assert spread.noise()["observed.requestsPerSecond"] == pytest.approx(8.0 / 60.0)


def test_states_and_nested_figures() -> None:
    """Nested figures by dotted path; a state or a flag is no figure."""
    spread = FigureSpread()
    figures = {"metricsState": "ok", "workload": {"promptTokens": {"p90": 2000.0}}, "x": True}
    spread.add(figures, 0.0)
    spread.add(figures, 900.0)
    assert spread.noise() == {"observed.workload.promptTokens.p90": 0.0}


def test_a_served_figure_moves_over_the_served_range() -> None:
    """A figure read over the last 15 minutes moves little in one minute however noisy
    its range: it is compared with itself a range before."""
    spread = FigureSpread(lag_s=60.0, half_life_s=900.0, range_s=900.0)
    for tick in range(61):  # the p90 alternates between two values every range
        p90 = 2000.0 if (tick * TICK_S) // 900 % 2 == 0 else 2400.0
        spread.add({"workload": {"promptTokens": {"p90": p90}}, "ttftMs": 100.0}, tick * TICK_S)
    noise = spread.noise()
    assert noise["observed.workload.promptTokens.p90"] == pytest.approx(400.0)
    assert noise["observed.ttftMs"] == 0.0


def test_a_deleted_target_forgets_its_spread() -> None:
    memory = LoopMemory()
    memory.spread("uid-1", 60.0).add({"tpotMs": 10.0}, 0.0)
    memory.spread("uid-1", 60.0).add({"tpotMs": 10.0}, 60.0)
    assert memory.spread("uid-1", 60.0).noise() == {"observed.tpotMs": 0.0}
    memory.forget("uid-1")
    assert memory.spread("uid-1", 60.0).noise() == {}

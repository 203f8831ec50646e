"""Lulls the loop learns to ride out (``rooftop_control.lulls``): the record's rules,
then the controller on traffic that idles between bursts for longer than its
scale-down window."""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import replace
from pathlib import Path

import pytest
from tests.unit.control.test_control import NOW, config, observe

from rooftop_api.spec import ServingTargetSpec
from rooftop_control.control import ControllerState, decide, initial_state
from rooftop_control.lulls import (
    LULL_MEMORY_S,
    MAX_LULL_S,
    GiveBack,
    Lulls,
    Rise,
    load_returned,
)
from rooftop_control.readings import MetricState, Reading
from rooftop_sim import simulate
from rooftop_sim.cluster import Cluster
from rooftop_sim.policies import RooftopPolicy
from rooftop_sim.report import summary

STARTUP = 120.0
WINDOW = 180.0


def fell_and_rose(
    down_s: float, to: int = 2, low_rps: float | None = None, back_rps: float | None = None
) -> Lulls:
    """6 pods given back to 4 at NOW, then to ``to`` 60 s later (the window's rate
    ``low_rps`` at both), asked back ``down_s`` after the first give-back at
    ``back_rps`` (each give-back waited a 180-s window)."""
    lulls = Lulls().moved(6, 4, NOW, WINDOW, low_rps).moved(4, to, NOW + 60.0, WINDOW, low_rps)
    return lulls.moved(to, 6, NOW + down_s, WINDOW, back_rps)


def test_a_regretted_run_is_learnt_from_the_recommendations_first_fall() -> None:
    # The recommendation fell a window before the first give-back (NOW - 180 s) and
    # rose 300 s after it: a lull of 480 s.
    learnt = fell_and_rose(300.0).regretted(6, NOW + 315.0, STARTUP, 60.0)
    assert learnt.hold_s(NOW + 315.0) == pytest.approx(480.0)
    assert learnt.returned is None, "the same lull is learnt once"


@pytest.mark.parametrize(
    ("down_s", "to", "desired", "why"),
    [
        (90.0, 2, 6, "asked back within a start-up: the window's own noise"),
        (MAX_LULL_S + 15.0, 2, 6, "back after the served range: the day's drift"),
        (300.0, 5, 5, "the give-backs never took the fleet below what it wants now"),
    ],
)
def test_what_is_not_learnt(down_s: float, to: int, desired: int, why: str) -> None:
    lulls = fell_and_rose(down_s, to).regretted(desired, NOW + down_s + 15.0, STARTUP, 60.0)
    assert lulls.hold_s(NOW + down_s + 15.0) == 0.0, why


def test_a_rise_closes_the_run_and_a_new_fall_starts_another() -> None:
    lulls = fell_and_rose(300.0)
    assert lulls.falling == ()
    assert lulls.returned == ((GiveBack(NOW, 4, WINDOW), GiveBack(NOW + 60.0, 2, WINDOW)),
                              Rise(NOW + 300.0))  # fmt: skip
    again = lulls.moved(6, 3, NOW + 900.0, WINDOW)
    assert again.falling == (GiveBack(NOW + 900.0, 3, WINDOW),)
    assert again.moved(3, 3, NOW + 915.0, WINDOW) == again


@pytest.mark.parametrize(
    ("low_rps", "back_rps", "regret_rps", "learnt"),
    [
        (2.0, 12.0, None, True),  # the load left and came back
        (6.0, 5.4, 5.6, False),  # asked back at the rate it left at: sized short
        (6.0, 6.5, 6.4, False),  # within a minute's noise of it (2σ = 0.91 req/s)
        (6.0, 7.0, None, True),
        # a burst's queue asked the pods back before a minute's rate saw it; the window
        # that regrets the give-back sees it
        (1.0, 0.6, 4.4, True),
    ],
)
def test_a_lull_is_load_that_came_back(
    low_rps: float, back_rps: float, regret_rps: float | None, learnt: bool
) -> None:
    rose = fell_and_rose(300.0, 2, low_rps, back_rps)
    regret = rose.regretted(6, NOW + 315.0, STARTUP, 60.0, regret_rps)
    assert (regret.hold_s(NOW + 315.0) > 0.0) is learnt


def test_a_window_long_after_the_rise_reads_the_climb_not_the_return() -> None:
    # Asked back at the rate the pods left at, regretted two minutes later on a rate the
    # day's climb has raised since: a sizing miss on the way up, not a lull.
    rose = fell_and_rose(300.0, 2, 6.0, 6.0)
    later = NOW + 300.0 + 120.0
    assert rose.regretted(6, later, STARTUP, 60.0, 7.5).hold_s(later) == 0.0


@pytest.mark.parametrize(
    ("before", "after", "window_s", "returned"),
    [
        (4.0, 5.0, 60.0, True),  # 2σ = 2·√(9/60) = 0.77 req/s
        (4.0, 4.7, 60.0, False),
        (4.0, 4.7, 600.0, True),  # a longer window's rate is less noisy
        (0.0, 0.5, 60.0, True),  # thirty requests after none
        (None, 1.0, 60.0, True),  # unknown rates keep the lesson the miss taught
        (1.0, None, 60.0, True),
    ],
)
def test_load_returned_is_a_rise_beyond_the_rates_noise(
    before: float | None, after: float | None, window_s: float, returned: bool
) -> None:
    assert load_returned(before, after, window_s) is returned


def test_a_window_long_after_the_rise_regrets_nothing() -> None:
    # Pods starting 5 minutes after the fleet rose back are not the ones the lull took
    # (a batch-cap rollout, a later rise): the shortage is not the lull's doing.
    late = fell_and_rose(300.0).regretted(6, NOW + 300.0 + STARTUP + 75.0, STARTUP, 60.0)
    assert late.hold_s(NOW + 600.0) == 0.0


def test_a_learnt_lull_is_forgotten_after_the_memory() -> None:
    learnt = fell_and_rose(300.0).regretted(6, NOW + 315.0, STARTUP, 60.0)
    assert learnt.hold_s(NOW + 315.0 + LULL_MEMORY_S - 1.0) > 0.0
    assert learnt.hold_s(NOW + 315.0 + LULL_MEMORY_S) == 0.0


# ---------------------------------------------------------------- the controller

TICK = 15.0


def bursts_and_lulls(t_s: float) -> float:
    """12 req/s (6 pods of the fake planner) with lulls at 1 req/s from minute 10 to
    17 and from 25 to 31, and quiet from minute 36 on."""
    minute = t_s / 60.0
    return 1.0 if 10 <= minute < 17 or 25 <= minute < 31 or minute >= 36 else 12.0


def replay(
    minutes: float, learn: bool = True, rate_at: Callable[[float], float] = bursts_and_lulls
) -> list[tuple[float, int, int, str]]:
    """(t s, desired, ready, reason) per tick at ``rate_at(t s)`` req/s: a pod is ready
    ``STARTUP`` s after the loop asks for it; a window misses a tenth of its requests
    while fewer pods are ready than the rate needs (the fake planner's 2 req/s a pod)."""
    cfg = config(startup_s=STARTUP)
    state: ControllerState = replace(initial_state(6, 64), started_s=NOW - 600.0)
    asked: list[tuple[float, int]] = [(NOW - STARTUP, 6)]
    out = []
    for i in range(int(minutes * 60 / TICK)):
        t = NOW + i * TICK
        rate = rate_at(i * TICK)
        started = max(n for s, n in asked if s <= t - STARTUP)
        ready = min(started, state.replicas)
        short = ready < math.ceil(rate / 2.0)
        missed = Reading(0.9 if short else 1.0, MetricState.OK)
        obs = observe(rate=rate, ready=ready, tpot_attainment=missed)
        if not learn:
            state = replace(state, lulls=Lulls())
        decision = decide(state, obs, t, cfg)
        state = decision.state
        asked.append((t, state.replicas))
        asked = [(s, n) for s, n in asked if s > t - 2 * STARTUP] or asked[-1:]
        out.append((i * TICK, state.replicas, ready, decision.reason))
    return out


def test_after_one_lull_cost_the_slo_the_loop_holds_through_the_next() -> None:
    ticks = replay(36.0)
    first = [n for t, n, _, _ in ticks if 13 * 60 <= t < 17 * 60]
    assert min(first) < 6, "the first lull is given back: nothing says it will end"
    second = [n for t, n, _, _ in ticks if 25 * 60 <= t < 31 * 60]
    assert min(second) == 6, "the second lull, no longer than the first, is held"
    back = [ready for t, _, ready, _ in ticks if 31 * 60 <= t < 33 * 60]
    assert min(back) == 6, "the burst after it finds every pod ready"


def test_a_fall_that_outlasts_the_learnt_lull_is_given_back_and_says_why() -> None:
    # From minute 36 the load stays low: the fleet holds through one learnt lull
    # (over 6 minutes from the recommendation's fall), longer than a 180-s window
    # would, then gives its pods back, saying why.
    ticks = replay(50.0)
    top = max(n for t, n, _, _ in ticks if 35 * 60 <= t < 36 * 60)
    t_down, why = next((t, why) for t, n, _, why in ticks if t >= 36 * 60 and n < top)
    assert t_down > 36 * 60 + 240.0
    assert "the longest lull that cost this traffic its SLO" in why
    assert [n for t, n, _, _ in ticks if t >= 46 * 60] == [1] * 16


def steady_then_quiet(t_s: float) -> float:
    """8 req/s, 8.4 from minute 6 (within a minute's noise of 8: 2σ = 1.05 req/s), and
    2 req/s from minute 15."""
    minute = t_s / 60.0
    return 8.0 if minute < 6 else 8.4 if minute < 15 else 2.0


def test_a_pod_asked_back_at_the_rate_it_left_at_teaches_no_lull() -> None:
    # The fleet of 6 gives 2 pods back to the 4 that 8 req/s needs, and at minute 6 asks
    # for a fifth on a rise within the rate's noise; the window misses while it starts.
    # The load never left, so the miss is the sizing's and no lull is learnt: when the
    # load falls at minute 15, the pods go after the plain window, not a learnt lull.
    ticks = replay(25.0, rate_at=steady_then_quiet)
    assert any(ready < n for t, n, ready, _ in ticks if 6 * 60 <= t < 9 * 60), "it missed"
    t_down, why = next((t, why) for t, n, _, why in ticks if t >= 15 * 60 and n < 5)
    assert "the longest lull" not in why
    assert t_down <= 15 * 60 + 180.0


def test_without_the_lesson_the_loop_gives_the_second_lull_back_too() -> None:
    # The same traffic with the record wiped every tick: what the loop did before it
    # learnt lulls, so the test above is about the lesson, not the traffic.
    second = [n for t, n, _, _ in replay(36.0, learn=False) if 25 * 60 <= t < 31 * 60]
    assert min(second) < 6


# ---------------------------------------------------------------- a batch-cap rollout

CODE_TRACE = Path(__file__).resolve().parents[3] / "examples" / "traces" / "azure_llm_2023_code.csv"
CODE_70B = {
    "model": "llama-3.1-70b",
    "mode": "simulated",
    "slo": {"tpotMs": 50, "tpotPercentile": "p90", "ttftMs": 2000, "ttftPercentile": "p90"},
    "workload": {"requestsPerSecond": 2, "promptTokens": {"mean": 2171, "p90": 5538},
                 "outputTokens": {"mean": 28, "p90": 52}},  # the code trace's own lengths
    "budget": {"usdPerHour": 400},
}  # fmt: skip


def test_a_batch_cap_rollout_waits_while_a_learnt_lull_holds_the_pods() -> None:
    """A 70B on the code day, whose requests come in clumps minutes apart: after a burst
    the loop holds its pods through the lull it learnt, while its factor, read on the
    light batches the spare pods leave, calls a larger batch cap safe. The rollout to
    that cap is sized at the lull's rate and would give the held pods back at once (12
    to 2, where the next clump needs 9); it waits until the hold lets them go, and the
    target keeps its p90 (87.9 % when the rollout went ahead)."""
    spec = ServingTargetSpec.model_validate(CODE_70B)
    stream = simulate.workload_from_trace(str(CODE_TRACE), diurnal=True)
    scn = simulate.scenario(spec, stream, seed=0)
    policy, _ = simulate.make_policy(scn, "rooftop")
    result = Cluster(scn.workload, simulate.cluster_config(scn, "rooftop")).run(policy)
    assert isinstance(policy, RooftopPolicy)
    assert summary(result, scn.slo, 1.0)["slo_attainment_tpot"] >= 0.9
    waits = [d.reason for d in policy.decisions if "while a learnt lull holds" in d.reason]
    assert waits, "a rollout came due during a held lull"

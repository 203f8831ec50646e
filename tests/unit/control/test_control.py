"""The controller's decisions: one table row per rule, each with why it must hold.

A fake planner keeps these fast and exact: one replica serves 2 req/s at factor 1.0
of the declared 200-token answers (so ``replicas = ceil(rate * factor / 2)``, and
twice that for 400-token answers), the batch cap is ``64 / factor``, and the predicted
step time is always 20 ms (so ``factor = observed step ms / 20``).
"""

from __future__ import annotations

import math
from dataclasses import dataclass, replace

import pytest

from rooftop_control.calibration import Calibration, TrimConfig
from rooftop_control.control import (
    Cause,
    ControllerConfig,
    ControllerState,
    clamp_replicas,
    decide,
    initial_state,
    replica_limits,
    scale_down_window,
)
from rooftop_control.forecast import forecast_rate
from rooftop_control.readings import MetricState, Observation, Reading
from rooftop_control.sizing import Sizing
from rooftop_control.traffic import Lengths, Traffic
from rooftop_planner.pricing import GpuPrice, ReplicaPrice

NOW = 10_000.0
WINDOW = 180.0  # ControllerConfig's default scale_down_window_s


# mean, then p10, p50, p90 and p99 (traffic.QUANTILES), tokens
DECLARED = Traffic(
    prompt=Lengths(1000.0, (300.0, 800.0, 2000.0, 4000.0)),
    output=Lengths(200.0, (50.0, 160.0, 400.0, 800.0)),
)


class FakePlanner:
    def size(
        self,
        requests_per_second: float,
        step_time_scale: float,
        max_num_seqs: int | None = None,
        traffic: Traffic | None = None,
    ) -> Sizing:
        answers = (traffic or DECLARED).output.mean / DECLARED.output.mean
        n = math.ceil(requests_per_second * step_time_scale * answers / 2.0 - 1e-9)
        return Sizing(n, int(64 / step_time_scale), 1.0)

    def step_ms(self, batch: float, prompt_tokens: float, output_tokens: float) -> float:
        return 20.0


def config(**kw: object) -> ControllerConfig:
    base = ControllerConfig(
        planner=FakePlanner(),
        tpot_slo_ms=40.0,
        ttft_slo_ms=2000.0,
        min_replicas=1,
        max_replicas=16,
        budget_usd_per_hour=100.0,
        price=ReplicaPrice.flat(1.0),
        declared=DECLARED,
        headroom=0.0,  # exact arithmetic in the table; headroom has its own test
    )
    return replace(base, **kw)  # type: ignore[arg-type]


def ok(value: float) -> Reading:
    return Reading(value, MetricState.OK)


BAD = {
    "missing": Reading(),
    "stale": Reading(math.nan, MetricState.STALE),
    "nan": Reading(math.nan, MetricState.NAN),
}


def observe(rate: float = 4.0, tpot: float = 30.0, ready: int = 2, **kw: object) -> Observation:
    base = Observation(
        tpot_ms=ok(tpot),
        ttft_ms=ok(500.0),
        requests_per_second=ok(rate),
        running=ok(10.0 * ready),
        waiting=ok(0.0),
        kv_usage_ratio=ok(0.3),
        step_ms=ok(20.0),
        ready_replicas=ready,
    )
    return replace(base, **kw)  # type: ignore[arg-type]


def with_reading(obs: Observation, name: str, reading: Reading) -> Observation:
    changes: dict[str, object] = {name: reading}
    return replace(obs, **changes)  # type: ignore[arg-type]


def settled(replicas: int, low: int, held_s: float, cap: int = 64) -> ControllerState:
    """A controller that has recommended ``low`` for ``held_s`` seconds of OK data, read
    through windows it watched whole (it started a metrics window before them)."""
    history = tuple((NOW - t, low) for t in range(int(held_s), 0, -15))
    state = ControllerState(replicas, cap, Calibration(1.0, 10), history, NOW - held_s)
    return replace(state, started_s=NOW - held_s - 60.0)


def watching(replicas: int, cap: int) -> ControllerState:
    """A fresh controller that has watched ``replicas`` ready pods for ten minutes."""
    return replace(initial_state(replicas, cap), ready_seen=replicas, started_s=NOW - 600.0)


@dataclass(frozen=True)
class Case:
    name: str
    state: ControllerState
    obs: Observation
    want_replicas: int
    why: str
    cfg: ControllerConfig = config()


CASES = [
    Case(
        "observed TPOT breach scales up at once",
        initial_state(2, 64),
        observe(rate=4.0, tpot=60.0),
        3,
        "TPOT 1.5x over the SLO on 2 ready replicas -> ceil(2 * 1.5) = 3, no waiting",
    ),
    Case(
        "predicted breach scales up before any latency breach",
        initial_state(2, 64),
        observe(rate=8.0, tpot=30.0),
        4,
        "the planner needs 4 replicas for 8 req/s; waiting for the breach costs start-up",
    ),
    Case(
        "pending pods count as capacity",
        initial_state(4, 64),
        observe(rate=4.0, tpot=48.0, ready=2),
        4,
        "2 ready + 2 starting; the breach asks ceil(2 * 1.2) = 3 <= 4: no double scale-up",
    ),
    Case(
        "breach while pods start still adds when starting pods are too few",
        initial_state(3, 64),
        observe(rate=4.0, tpot=80.0, ready=2),
        4,
        "2 ready, TPOT 2x: ceil(2 * 2) = 4 > 3 desired",
    ),
    Case(
        "breach step is bounded",
        initial_state(2, 64),
        observe(rate=4.0, tpot=400.0),
        4,
        "TPOT 10x over would ask 20 replicas; one step is at most 2x (max_breach_step)",
    ),
    Case(
        "queue adds replicas by batch caps",
        initial_state(2, 64),
        observe(rate=4.0, waiting=ok(130.0)),
        4,
        "130 waiting / cap 64 -> 3 more, bounded to 2x ready = 4",
    ),
    Case(
        "full KV cache adds one",
        initial_state(2, 64),
        observe(rate=4.0, kv_usage_ratio=ok(0.95)),
        3,
        "above 90 % KV usage vLLM preempts; one more replica relieves it",
    ),
    Case(
        "lower recommendation not held long enough: hold",
        settled(4, 2, WINDOW - 60.0),
        observe(rate=4.0),
        4,
        "only 120 s of the 180 s window have passed",
    ),
    Case(
        "lower recommendation held for the window: scale down",
        settled(4, 2, WINDOW),
        observe(rate=4.0),
        2,
        "2 was recommended for the whole 180 s window",
    ),
    Case(
        "scale down only to the window's highest recommendation",
        replace(settled(4, 2, WINDOW), history=((NOW - 90, 3), (NOW - 45, 2))),
        observe(rate=4.0),
        3,
        "3 was recommended 90 s ago, inside the window",
    ),
    Case(
        "a batch-cap rollout running a pod short keeps that pod on top of a scale-down",
        replace(settled(4, 2, WINDOW), last_cap_change_s=NOW - 60),
        observe(rate=4.0, ready=3, outdated_replicas=3),
        3,
        "no surge room (maxUnavailable 1): 2 recommended + the 1 out of service = 3",
    ),
    Case(
        "no scale-down below the recommendation plus the pods a rollout holds out",
        replace(settled(4, 3, WINDOW), last_cap_change_s=NOW - 60),
        observe(rate=4.0, ready=3, outdated_replicas=3),
        4,
        "3 recommended + 1 out of service = 4: removing one would leave 2 serving",
    ),
    Case(
        "a rollout two pods short keeps both on top of the recommendation",
        replace(settled(7, 2, WINDOW), last_cap_change_s=NOW - 60),
        observe(rate=4.0, ready=5, outdated_replicas=5),
        4,
        "a one-at-a-time rollout no longer holds 7 pods where 2 are planned: 2 + 2 out",
    ),
    Case(
        "a surging batch-cap rollout does not hold a scale-down",
        replace(settled(4, 2, WINDOW), last_cap_change_s=NOW - 60),
        observe(rate=4.0, ready=4, outdated_replicas=3),
        2,
        "maxUnavailable 0: all 4 desired pods serve, the surge pods are extra",
    ),
    Case(
        "a scale-up's starting pods after a cap change are no rollout",
        replace(settled(4, 2, WINDOW), last_cap_change_s=NOW - 60),
        observe(rate=4.0, ready=3, pending_replicas=1),
        2,
        "pods on the current template: the scale-down window alone decides",
    ),
    Case(
        "a rollout long after the last cap change does not freeze scale-down",
        replace(settled(4, 2, WINDOW), last_cap_change_s=NOW - 3600),
        observe(rate=4.0, ready=3, pending_replicas=1, outdated_replicas=1),
        2,
        "an unschedulable pod stays pending forever; the hold is bounded by the cooldown",
    ),
    *[
        Case(
            f"{state} {name} never scales down",
            settled(4, 2, 600.0),
            with_reading(observe(rate=4.0), name, BAD[state]),
            4,
            "a missing/stale/NaN gauge could hide load; hold until it is trustworthy",
        )
        for state in BAD
        for name in ("requests_per_second", "running", "waiting", "kv_usage_ratio")
    ],
    Case(
        "missing TPOT under traffic never scales down",
        settled(4, 2, 600.0),
        observe(rate=4.0, tpot_ms=BAD["nan"]),
        4,
        "with requests flowing, a NaN percentile means broken metrics, not idle",
    ),
    Case(
        "bad metrics still allow scaling up on a visible breach",
        initial_state(2, 64),
        observe(rate=4.0, tpot=80.0, running=BAD["missing"]),
        4,
        "scaling up is the safe direction even with partial data",
    ),
    Case(
        "no traffic: NaN latencies do not block a scale-down",
        settled(4, 1, WINDOW),
        observe(rate=0.0, tpot_ms=BAD["nan"], ttft_ms=BAD["nan"], running=ok(0.0)),
        1,
        "rate is a trustworthy 0, so the NaN percentile is expected",
    ),
    Case(
        "budget caps the replica count",
        initial_state(2, 64),
        observe(rate=20.0),
        5,
        "10 needed at $1/h but the budget is $5/h",
        config(budget_usd_per_hour=5.0),
    ),
    Case(
        "max replicas caps the replica count",
        initial_state(2, 64),
        observe(rate=40.0),
        16,
        "20 needed, maxReplicas 16",
    ),
    Case(
        "min replicas floors the replica count",
        settled(3, 0, WINDOW),
        observe(rate=0.0, tpot_ms=BAD["nan"], running=ok(0.0)),
        2,
        "the planner wants 0, minReplicas is 2",
        config(min_replicas=2),
    ),
    Case(
        "budget wins over min replicas",
        initial_state(3, 64),
        observe(rate=4.0),
        2,
        "minReplicas 3 costs $3/h, the budget is $2.5/h: never exceed the budget",
        config(min_replicas=3, budget_usd_per_hour=2.5),
    ),
    Case(
        "over budget is cut even with missing metrics",
        initial_state(6, 64),
        observe(rate=4.0, running=BAD["missing"]),
        5,
        "the budget is a hard limit; 'hold on bad metrics' never means 'overspend'",
        config(budget_usd_per_hour=5.0),
    ),
    Case(
        "calibrated factor sizes the re-plan",
        initial_state(2, 64),
        observe(rate=4.0, step_ms=ok(30.0)),
        3,
        "observed 30 ms vs predicted 20 -> factor 1.5 -> ceil(4 * 1.5 / 2) = 3",
    ),
]


@pytest.mark.parametrize("case", CASES, ids=[c.name for c in CASES])
def test_decide_table(case: Case) -> None:
    got = decide(case.state, case.obs, NOW, case.cfg)
    assert got.replicas == case.want_replicas, f"{case.why}: {got.reason}"
    lower, upper = replica_limits(case.cfg)
    assert lower <= got.replicas <= upper
    assert case.cfg.price.usd_per_hour(got.replicas) <= case.cfg.budget_usd_per_hour


CAUSES = {
    "observed TPOT breach scales up at once": Cause.SLO_VIOLATION,
    "queue adds replicas by batch caps": Cause.SLO_VIOLATION,
    "full KV cache adds one": Cause.SLO_VIOLATION,
    "predicted breach scales up before any latency breach": Cause.LOAD_CHANGE,
    "calibrated factor sizes the re-plan": Cause.LOAD_CHANGE,
    "lower recommendation held for the window: scale down": Cause.OVERPROVISIONED,
    "budget caps the replica count": Cause.BUDGET,
    "max replicas caps the replica count": Cause.BUDGET,
    "over budget is cut even with missing metrics": Cause.BUDGET,
}


@pytest.mark.parametrize("name", sorted(CAUSES))
def test_each_decision_names_its_cause(name: str) -> None:
    """The cause labels the operator's decision metric: chosen by the signal that won,
    never by searching the reason's words."""
    case = next(c for c in CASES if c.name == name)
    got = decide(case.state, case.obs, NOW, case.cfg)
    assert got.changed and got.cause is CAUSES[name], got.reason


def _cond(decision_conditions: tuple[object, ...], kind: str) -> object:
    return next(c for c in decision_conditions if c.type == kind)  # type: ignore[attr-defined]


@pytest.mark.parametrize(
    ("obs", "cfg", "slo", "budget"),
    [
        # breach with room to grow: SLO False with the breach as the reason
        (observe(tpot=60.0), config(), ("False", "TPOTAboveSLO"), ("True", "WithinBudget")),
        # breach that the budget stops us fixing: say so on both conditions
        (
            observe(rate=20.0, tpot=60.0),
            config(budget_usd_per_hour=5.0),
            ("False", "BudgetLimited"),
            ("True", "CappedAtBudget"),
        ),
        # breach that maxReplicas stops us fixing (budget is not the limit)
        (
            observe(rate=40.0, tpot=60.0),
            config(),
            ("False", "MaxReplicasLimited"),
            ("True", "WithinBudget"),
        ),
        # breach that the cluster's free GPUs stop us fixing, budget and max to spare
        (
            observe(rate=20.0, tpot=60.0),
            config(inventory_replicas=3),
            ("False", "InventoryLimited"),
            ("True", "WithinBudget"),
        ),
        # TTFT alone over the SLO
        (
            observe(ttft_ms=ok(5000.0)),
            config(),
            ("False", "TTFTAboveSLO"),
            ("True", "WithinBudget"),
        ),
        # the metrics pipeline is broken: Unknown, not False
        (
            observe(tpot_ms=BAD["missing"]),
            config(),
            ("Unknown", "MetricsUnavailable"),
            ("True", "WithinBudget"),
        ),
        # idle target: Unknown with its own reason (not an alarm)
        (
            observe(rate=0.0, tpot_ms=BAD["nan"]),
            config(),
            ("Unknown", "NoTraffic"),
            ("True", "WithinBudget"),
        ),
        (observe(), config(), ("True", "SLOMet"), ("True", "WithinBudget")),
    ],
)
def test_conditions(
    obs: Observation, cfg: ControllerConfig, slo: tuple[str, str], budget: tuple[str, str]
) -> None:
    got = decide(initial_state(2, 64), obs, NOW, cfg)
    s, b = _cond(got.conditions, "SLOMet"), _cond(got.conditions, "WithinBudget")
    assert (s.status, s.reason) == slo, s.message  # type: ignore[attr-defined]
    assert (b.status, b.reason) == budget, b.message  # type: ignore[attr-defined]


def test_the_cluster_s_free_gpus_cap_a_scale_up() -> None:
    got = decide(initial_state(2, 64), observe(rate=20.0, tpot=60.0), NOW, config())
    assert got.replicas > 3
    capped = decide(
        initial_state(2, 64), observe(rate=20.0, tpot=60.0), NOW, config(inventory_replicas=3)
    )
    assert capped.replicas == 3 and "room on the cluster's free GPUs for 3" in capped.reason


def test_owned_gpus_are_spent_first_and_the_budget_still_binds() -> None:
    """Four owned replicas at $0, then $5 each: a $10/h budget allows six, and the
    decision's price is what those six cost (two on demand)."""
    price = ReplicaPrice(GpuPrice(5.0, owned=4), tp=1)
    cfg = config(price=price, budget_usd_per_hour=10.0)
    assert replica_limits(cfg) == (1, 6)
    got = decide(initial_state(2, 64), observe(rate=40.0, tpot=60.0), NOW, cfg)
    assert got.replicas == 6 and got.usd_per_hour == pytest.approx(10.0)
    budget = _cond(got.conditions, "WithinBudget")
    assert budget.reason == "CappedAtBudget"  # type: ignore[attr-defined]
    assert "$10.00/h of $10.00/h (6 replica(s) of 1 GPU(s): 4 owned" in budget.message  # type: ignore[attr-defined]


def test_hold_reason_names_the_bad_metric() -> None:
    got = decide(settled(4, 2, 600.0), observe(waiting=BAD["stale"]), NOW, config())
    assert got.replicas == 4
    assert "waiting: stale" in got.reason
    assert got.metrics_state is MetricState.STALE


def test_outage_restarts_the_scale_down_window() -> None:
    # After metrics return, a full window of OK data must pass before a scale-down:
    # the outage could have hidden a peak.
    cfg = config()
    state = decide(settled(4, 2, 600.0), observe(running=BAD["missing"]), NOW, cfg).state
    end = 15 + int(cfg.scale_down_window_s)
    for t in range(15, end, 15):  # the first OK reading (t = 15) starts the window
        d = decide(state, observe(), NOW + t, cfg)
        assert d.replicas == 4, f"scaled down {t} s after the outage"
        state = d.state
    assert decide(state, observe(), NOW + end, cfg).replicas == 2


def test_calibration_updates_only_on_ok_data() -> None:
    cfg = config()
    d = decide(initial_state(2, 64), observe(step_ms=ok(26.0)), NOW, cfg)
    assert d.calibration_factor == pytest.approx(1.3)
    d2 = decide(d.state, observe(step_ms=BAD["nan"]), NOW + 15, cfg)
    assert d2.state.calibration == d.state.calibration
    # an idle replica's step time says little about a loaded one: skipped
    d3 = decide(d.state, observe(step_ms=ok(60.0), running=ok(0.0)), NOW + 30, cfg)
    assert d3.state.calibration == d.state.calibration


def test_batch_cap_follows_a_settled_factor_with_cooldown() -> None:
    cfg = config()
    settle = cfg.calibration.settled_samples
    state = initial_state(3, 64)  # 3 replicas: what factor 1.3 needs, so the fleet is steady
    full = ok(60.0)  # the pods run full batches: a lower cap binds
    for i in range(settle - 1):  # not settled yet: the cap waits for evidence
        slow = observe(step_ms=ok(26.0), ready=3, step_batch=full)
        state = decide(state, slow, NOW + 15 * i, cfg).state
        assert state.max_num_seqs == 64
    t = NOW + 15 * settle
    d = decide(state, observe(step_ms=ok(26.0), ready=3, step_batch=full), t, cfg)
    assert d.max_num_seqs == int(64 / 1.3)  # 64 seqs would miss TPOT at factor 1.3
    assert "max_num_seqs 64 -> 49" in d.reason
    # the engine turns out fast; but a cap change restarts pods: wait for the cooldown
    state = d.state
    for dt in range(60, 900, 60):
        state = decide(state, observe(step_ms=ok(12.0), ready=3), t + dt, cfg).state
        assert state.max_num_seqs == 49
    raised = decide(state, observe(step_ms=ok(12.0), ready=3), t + 900, cfg)
    # raised to what the planner still picks with 15 % slower steps (hysteresis)
    assert raised.max_num_seqs == int(64 / (raised.calibration_factor * 1.15))


def test_no_cap_change_while_scaling() -> None:
    # A new cap rolls every pod; on top of a scale-up it would delay the new capacity.
    cfg = config()
    state = replace(initial_state(2, 64), calibration=Calibration(1.3, 50))
    d = decide(state, observe(rate=8.0, step_ms=ok(26.0)), NOW, cfg)
    assert d.replicas > 2 and d.max_num_seqs == 64


def test_a_lower_cap_that_would_not_bind_rolls_nothing() -> None:
    """Factor 1.3 makes cap 64 miss TPOT at a full batch, but the pods run 10 requests:
    a cap of 49 would change no step, and its rollout would restart every pod. It waits
    until the batch reaches half of it (the replicas are sized for it meanwhile)."""
    cfg = config()
    state = replace(initial_state(3, 64), calibration=Calibration(1.3, 50))
    light = decide(state, observe(step_ms=ok(26.0), ready=3, step_batch=ok(10.0)), NOW, cfg)
    assert light.max_num_seqs == 64
    busy = decide(state, observe(step_ms=ok(26.0), ready=3, step_batch=ok(25.0)), NOW, cfg)
    assert busy.max_num_seqs == 49


def test_no_cap_change_on_a_window_of_the_fleet_before_a_pod_became_ready() -> None:
    """The window's batch and TPOT still describe the smaller fleet; a rollout decided
    on them would restart pods on stale evidence."""
    cfg = config()
    state = replace(initial_state(3, 64), calibration=Calibration(1.3, 50), ready_seen=2)
    grown = decide(state, observe(step_ms=ok(26.0), ready=3, step_batch=ok(60.0)), NOW, cfg)
    assert grown.max_num_seqs == 64
    later = decide(grown.state, observe(step_ms=ok(26.0), ready=3, step_batch=ok(60.0)),
                   NOW + cfg.metrics_window_s, cfg)  # fmt: skip
    assert later.max_num_seqs == 49


def test_a_fresh_controller_leaves_the_trim_for_two_windows() -> None:
    """Its first windows may hold a fleet that was short before it looked (a target's
    first traffic arriving on the prior's size): misses then are no model error."""
    cfg = config()
    missed = observe(rate=3.0, tpot=30.0, tpot_attainment=ok(0.99))  # 2 pods suffice
    state = replace(initial_state(2, 64), ready_seen=2)
    for k in range(8):  # the decisions of its first two minutes at 15 s
        state = decide(state, missed, NOW + 15 * k, cfg).state
    assert state.trim == 1.0
    assert decide(state, missed, NOW + 120, cfg).state.trim == pytest.approx(1.1)


def test_latency_ignored_right_after_pods_became_ready() -> None:
    # The window still holds the smaller fleet's latencies: acting on them again would
    # double the scale-up that is just taking effect.
    cfg = config()
    state = decide(initial_state(3, 64), observe(ready=2), NOW, cfg).state
    d = decide(state, observe(ready=3, tpot=60.0), NOW + 15, cfg)
    assert d.replicas == 3
    later = decide(d.state, observe(ready=3, tpot=60.0), NOW + 15 + 60, cfg)
    assert later.replicas > 3


@pytest.mark.parametrize(
    ("rate", "attained", "tpot", "kw", "expected", "why"),
    [
        (4.0, 0.99, 30.0, {}, 1.10, "1 % misses = 2x the 0.5 % allowance: two 5 % steps"),
        (4.0, 0.90, 30.0, {}, 1.20, "10 % misses: the step is capped at four"),
        (6.0, 0.90, 30.0, {}, 1.0, "planner wants 3 > 2 ready: a lag, not a model error"),
        (4.0, 0.995, 30.0, {}, 1.0, "within target: dead band"),
        (4.0, 1.0, 20.0, {}, 1 - 0.04 * 28 / 20, "clean, p90 at 20 ms < 0.7 x 40: down 1.4 steps"),
        (4.0, 1.0, 7.0, {}, 1 - 0.04 * 4, "p90 at a sixth of the bound: capped at four steps"),
        (2.0, 1.0, 20.0, {}, 1.0, "clean but 40 % more load still fits 2: a spare fleet"),
        (4.0, 1.0, 35.0, {}, 1.0, "clean but little room: dead band"),
        (4.0, 0.9, 30.0, {"pending_replicas": 1}, 1.0, "a pod is starting: would wind up"),
    ],
)
def test_latency_trim(
    rate: float, attained: float, tpot: float, kw: dict[str, object], expected: float, why: str
) -> None:
    # 2 ready pods, SLO 40 ms; the fake planner needs ceil(rate * trim / 2) pods
    state = watching(2, 64)
    obs = observe(rate=rate, tpot=tpot, tpot_attainment=ok(attained), **kw)
    assert decide(state, obs, NOW, config()).state.trim == pytest.approx(expected), why


def test_misses_at_the_replica_ceiling_do_not_raise_the_trim() -> None:
    """At maxReplicas (or the budget) a higher trim adds no pod; it would only hold the
    fleet at the ceiling after the peak that filled it."""
    state = watching(2, 64)
    missed = observe(rate=4.0, tpot=30.0, tpot_attainment=ok(0.99))  # 2 pods suffice
    assert decide(state, missed, NOW, config()).state.trim == pytest.approx(1.1)
    assert decide(state, missed, NOW, config(max_replicas=2)).state.trim == 1.0
    # the budget is a ceiling too: two replicas' worth of $/h
    assert decide(state, missed, NOW, config(budget_usd_per_hour=2.5)).state.trim == 1.0


def test_trim_judges_each_window_once_and_waits_for_new_pods() -> None:
    cfg = config()
    missed = observe(rate=3.0, tpot=30.0, tpot_attainment=ok(0.99))  # 2 pods suffice
    moved = decide(watching(2, 64), missed, NOW, cfg).state
    assert moved.trim == pytest.approx(1.1)
    # the next scrapes see mostly the same requests: no second step within the window
    assert decide(moved, missed, NOW + 15, cfg).state.trim == pytest.approx(1.1)
    assert decide(moved, missed, NOW + 60, cfg).state.trim == pytest.approx(1.1 * 1.1)
    # a third pod just became ready: its window still holds requests served by two
    grown = replace(moved, ready_seen=2)
    three = observe(rate=3.0, ready=3, tpot=30.0, tpot_attainment=ok(0.99))
    state = decide(grown, three, NOW + 60, cfg).state
    assert state.trim == pytest.approx(1.1)
    assert decide(state, three, NOW + 60 + 105, cfg).state.trim == pytest.approx(1.1)
    assert decide(state, three, NOW + 60 + 120, cfg).state.trim > 1.1


def test_trim_settle_windows_sets_how_long_new_pods_are_waited_for() -> None:
    quick = config(trim=TrimConfig(settle_windows=1.0))
    grown = watching(2, 64)
    three = observe(rate=3.0, ready=3, tpot=30.0, tpot_attainment=ok(0.99))
    state = decide(grown, three, NOW, quick).state  # the third pod is ready now
    assert decide(state, three, NOW + 45, quick).state.trim == 1.0
    assert decide(state, three, NOW + 60, quick).state.trim == pytest.approx(1.1)
    assert decide(state, three, NOW + 60, config()).state.trim == 1.0  # default: two windows
    with pytest.raises(ValueError, match="settle_windows"):
        TrimConfig(settle_windows=-1.0)


class CapAwarePlanner(FakePlanner):
    """At factor 1.0 the planner picks cap 64, where a replica serves 2 req/s; a
    replica held at a smaller cap serves proportionally less (cap 32: 1 req/s)."""

    def size(
        self,
        requests_per_second: float,
        step_time_scale: float,
        max_num_seqs: int | None = None,
        traffic: Traffic | None = None,
    ) -> Sizing:
        best = int(64 / step_time_scale)
        cap = max_num_seqs if max_num_seqs is not None and max_num_seqs <= best else best
        per_replica = 2.0 * cap / best / step_time_scale
        return Sizing(math.ceil(requests_per_second / per_replica - 1e-9), cap, 1.0,
                      capacity_rps=per_replica)  # fmt: skip


def test_replicas_are_sized_for_the_cap_the_pods_run() -> None:
    """A new cap waits (for a settled factor, the cooldown, the raise margin); until
    the rollout, a replica serves what the cap it runs allows, not the planner's pick."""
    cfg = config(planner=CapAwarePlanner())
    held = decide(initial_state(2, 32), observe(rate=4.0), NOW, cfg)
    assert (held.replicas, held.max_num_seqs) == (4, 32)  # 1 req/s each at cap 32
    assert "4 for 4.00 req/s at the pods' max_num_seqs 32" in held.reason
    assert decide(initial_state(2, 64), observe(rate=4.0), NOW, cfg).replicas == 2


def test_trim_judges_the_planner_at_the_cap_the_pods_run() -> None:
    """Misses of 2 pods held at cap 32 under 4 req/s are a fleet the planner wants
    bigger (4 at that cap), not a model error: the trim holds. At cap 64 the planner
    called 2 enough, so the same misses raise it."""
    cfg = config(planner=CapAwarePlanner())
    missed = observe(rate=4.0, tpot=30.0, tpot_attainment=ok(0.99))
    at_32 = watching(2, 32)
    assert decide(at_32, missed, NOW, cfg).state.trim == 1.0
    at_64 = watching(2, 64)
    assert decide(at_64, missed, NOW, cfg).state.trim == pytest.approx(1.1)


def test_clamp_replicas() -> None:
    assert clamp_replicas(5, 1, 8) == 5
    assert clamp_replicas(0, 2, 8) == 2  # minReplicas
    assert clamp_replicas(12, 1, 8) == 8  # maxReplicas or budget
    assert clamp_replicas(1, 3, 2) == 2  # the budget wins over minReplicas
    assert config().scale_down_window_s == WINDOW  # what the table above assumes


def test_headroom_and_rising_trend_plan_ahead() -> None:
    cfg = config(headroom=0.1)
    # 4 req/s * 1.1 = 4.4 -> 3 replicas (exactly 2 without headroom)
    assert decide(initial_state(2, 64), observe(rate=4.0), NOW, cfg).replicas == 3
    # rising 1 req/s per minute: 150 s ahead (start-up + half a window) is ~2.5 req/s more
    state = initial_state(1, 64)
    for i, rate in enumerate([1.0, 2.0, 3.0, 4.0]):
        state = decide(state, observe(rate=rate, ready=4), NOW + 60 * i, config()).state
    assert state.replicas == math.ceil(forecast_rate(state.rates, 150.0) / 2.0)
    assert state.replicas == 4  # 4 + 2.5 = 6.5 req/s -> 4 replicas


def test_a_new_controller_gives_back_pods_only_on_windows_it_watched_whole() -> None:
    """Its first minute's windows reach back before it watched (before the traffic
    began, for a new target) and read the load low: the scale-down window's OK
    readings count from one metrics window after its first decision."""
    state, first_down = initial_state(4, 64), None
    for i in range(30):
        t = NOW + 15.0 * i
        d = decide(state, observe(rate=4.0, ready=state.replicas), t, config())
        if d.replicas < state.replicas and first_down is None:
            first_down = t - NOW
        state = d.state
    assert first_down == 60.0 + WINDOW, first_down


def test_the_first_windows_climb_is_not_projected() -> None:
    """A steady 4.8 req/s read through windows that reach back before the traffic began
    climbs 1.2, 2.4, 3.6, 4.8 over the first minute; fitted on those, the trend asked for
    capacity at about twice the load. Only windows watched whole are fitted."""
    state = initial_state(1, 64)
    readings = [1.2, 2.4, 3.6, 4.8, 4.8, 4.8, 4.8]
    for i, rate in enumerate(readings):
        d = decide(state, observe(rate=rate, ready=1), NOW + 15.0 * (i + 1), config())
        state = d.state
    assert "for 4.80 req/s" in d.reason
    # the same readings from a controller that watched them whole are a rising trend
    assert forecast_rate(state.rates, 150.0) > 6.0


@pytest.mark.parametrize(
    ("rates", "expected"),
    [
        ([], 0.0),  # nothing known
        ([(0.0, 3.0)], 3.0),  # one point: no trend
        ([(0.0, 1.0), (60.0, 2.0), (120.0, 3.0)], 3.0 + 100.0 / 60.0),  # rising: projected
        ([(0.0, 3.0), (60.0, 2.0), (120.0, 1.0)], 1.0),  # falling: never projected down
    ],
)
def test_forecast_rate(rates: list[tuple[float, float]], expected: float) -> None:
    assert forecast_rate(rates, 100.0) == pytest.approx(expected)


def _falling_then(low_s: float, per_minute: float) -> ControllerState:
    """4 replicas; the recommendation was 3 until ``low_s`` ago, 2 since; the rate
    readings of the last 300 s move by ``per_minute`` req/s a minute down to 4 req/s."""
    history = tuple((NOW - t, 2 if t < low_s else 3) for t in range(300, 0, -15))
    rates = tuple((NOW - t, 4.0 + per_minute * t / 60.0) for t in range(300, 0, -15))
    state = ControllerState(4, 64, Calibration(1.0, 10), history, NOW - 600.0, rates)
    return replace(state, started_s=NOW - 600.0)


@pytest.mark.parametrize(
    ("per_minute", "replicas", "held"),
    [
        (0.8, 2, "for 120 s while the rate falls 14% a minute"),  # 8 -> 4 req/s in 5 min
        (0.1, 3, "for 180 s"),  # 2 % a minute: within noise, a lull until shown otherwise
        (0.0, 3, "for 180 s"),
        (-0.8, 3, "for 180 s"),  # rising 0 -> 4 req/s: planned 3 for 6 req/s, 180 s
    ],
)
def test_a_falling_rate_shortens_the_scale_down_window(
    per_minute: float, replicas: int, held: str
) -> None:
    # 2 recommended for the last 120 s, 3 before: a steady fall gives back both pods
    # after 120 s; a flat rate waits out the full 180 s, which still holds the 3.
    d = decide(_falling_then(125.0, per_minute), observe(rate=4.0, ready=4), NOW, config())
    assert d.replicas == replicas, d.reason
    assert held in d.reason


def test_a_falling_rate_still_waits_a_full_window_after_an_outage() -> None:
    # Readings from before an outage cannot show that a peak it hid has passed: the
    # shorter window on a fall applies only once the metrics were OK for the full one.
    cfg = config()
    state = replace(_falling_then(125.0, 0.8), healthy_since_s=NOW - 150.0)
    held = decide(state, observe(rate=4.0, ready=4), NOW, cfg)
    assert held.replicas == 4, held.reason
    later = decide(held.state, observe(rate=4.0, ready=4), NOW + 30.0, cfg)
    assert later.replicas == 2 and "while the rate falls" in later.reason, later.reason


@pytest.mark.parametrize(
    ("rates", "cfg", "expected"),
    [
        ([(t, 8.0 - t / 75.0) for t in range(0, 301, 15)], {}, 120.0),  # 4 req/s in 5 min
        ([(t, 8.0 - t / 75.0) for t in range(0, 301, 15)], {"falling_rate_per_minute": 0}, 180),
        ([(t, 8.0 - t / 75.0) for t in range(0, 301, 15)], {"metrics_window_s": 180.0}, 180),
        ([(t, 8.0 - t / 75.0) for t in range(0, 106, 15)], {}, 180.0),  # under 120 s seen
        ([(t, 6.0 - 0.001 * t) for t in range(0, 301, 15)], {}, 180.0),  # 1 % a minute
        ([(t, 0.0) for t in range(0, 301, 15)], {}, 180.0),  # no traffic: nothing falls
    ],
)
def test_scale_down_window(
    rates: list[tuple[float, float]], cfg: dict[str, float], expected: float
) -> None:
    seconds, why = scale_down_window(rates, config(**cfg))
    assert seconds == expected
    assert ("falls" in why) == (seconds < WINDOW)


def test_reading_classification() -> None:
    assert Reading.of(None).state is MetricState.MISSING
    assert Reading.of(float("nan")).state is MetricState.NAN
    assert Reading.of(1.0, age_s=120.0, max_age_s=60.0).state is MetricState.STALE
    assert Reading.of(1.0).ok


def test_no_cap_change_that_would_stop_the_only_pod() -> None:
    # One pod and a budget for exactly one: the rollout could not start the new pod
    # first, so a new cap would mean minutes with nothing serving. Hold and say why.
    cfg = config(budget_usd_per_hour=1.0)
    state = replace(initial_state(1, 64), calibration=Calibration(1.3, 50))
    slow = observe(rate=1.0, step_ms=ok(26.0), ready=1, step_batch=ok(60.0))  # full batches
    d = decide(state, slow, NOW, cfg)
    assert d.replicas == 1 and d.max_num_seqs == 64
    assert "max_num_seqs held at 64, not 49" in d.reason
    assert "no room under maxReplicas and the budget" in d.reason
    assert d.cap_hold_began and d.state.held_cap == 49
    again = decide(d.state, slow, NOW + 15, cfg)
    assert again.max_num_seqs == 64 and not again.cap_hold_began  # one event, not one a tick
    # with room for a surge pod the same evidence does change the cap
    roomy = decide(state, slow, NOW, config())
    assert roomy.max_num_seqs == 49
    # and with two pods one keeps serving while the other is replaced
    busy = replace(slow, requests_per_second=ok(3.0), ready_replicas=2)
    two = decide(replace(state, replicas=2), busy, NOW, config(budget_usd_per_hour=2.0))
    assert two.replicas == 2 and two.max_num_seqs == 49


def test_the_loop_sizes_a_running_rocm_target_too() -> None:
    """A target already running on MI300X (its operator had a ROCm image) is re-sized on
    its own shape; the planner's default families (CUDA only) must not make it infeasible."""
    from rooftop_api.spec import ServingTargetSpec
    from rooftop_control.sizing import PlanTargetPlanner
    from rooftop_planner.search import plan_target

    spec = ServingTargetSpec.model_validate({
        "model": "llama-3.1-8b", "slo": {"tpotMs": 50},
        "workload": {"requestsPerSecond": 2, "promptTokens": {"mean": 500},
                     "outputTokens": {"mean": 100}},
        "budget": {"usdPerHour": 100}, "constraints": {"gpuTypes": ["mi300x"]},
    })  # fmt: skip
    plan = plan_target(spec, engine_families=["cuda", "rocm"]).plan
    assert plan is not None and plan.gpu == "mi300x"
    assert PlanTargetPlanner(spec, plan).size(2.0, 1.0).feasible


def test_the_real_planner_sizes_any_cap_it_would_offer() -> None:
    """``size`` with the pods' cap: that cap's replicas (a smaller cap serves less per
    replica, so never fewer); a cap the planner would not offer there (over the SLO at
    this factor, or one no plan has) gives its own pick."""
    from rooftop_api.spec import ServingTargetSpec
    from rooftop_control.sizing import PlanTargetPlanner
    from rooftop_planner.search import plan_target

    spec = ServingTargetSpec.model_validate({
        "model": "llama-3.1-8b", "slo": {"tpotMs": 50},
        "workload": {"requestsPerSecond": 20, "promptTokens": {"mean": 500},
                     "outputTokens": {"mean": 100}},
        "budget": {"usdPerHour": 1000},
    })  # fmt: skip
    plan = plan_target(spec).plan
    assert plan is not None
    planner = PlanTargetPlanner(spec, plan)
    best = planner.size(20.0, 1.0)
    small = planner.size(20.0, 1.0, 8)
    assert best.max_num_seqs > 8 and small.max_num_seqs == 8
    assert small.replicas > best.replicas
    assert small.capacity_rps is not None and best.capacity_rps is not None
    assert small.capacity_rps < best.capacity_rps
    assert planner.size(20.0, 1.0, 7) == best  # no plan runs cap 7
    assert planner.size(20.0, 1.0, best.max_num_seqs) == best


class LinearStepPlanner(FakePlanner):
    """A step that grows with the batch: 10 ms plus 1 ms per running request."""

    def step_ms(self, batch: float, prompt_tokens: float, output_tokens: float) -> float:
        return 10.0 + batch


def test_calibration_prices_the_windows_steps_at_their_own_batch() -> None:
    """Pods became ready just now: 10 requests per replica run, but the window's steps
    were taken at 20 and took the 30 ms the planner predicts for 20. The step batch
    (decode tokens per iteration over the window) says so and the factor stays 1; the
    instant gauge alone would read a 1.5x slower engine."""
    cfg = config(planner=LinearStepPlanner())
    lagging = observe(step_ms=ok(30.0), running=ok(20.0), ready=2)
    d = decide(initial_state(2, 64), replace(lagging, step_batch=ok(20.0)), NOW, cfg)
    assert d.calibration_factor == pytest.approx(1.0)
    d = decide(initial_state(2, 64), lagging, NOW, cfg)  # no step batch: the gauge
    assert d.calibration_factor == pytest.approx(1.5)
    # a window of idle steps (under min_batch) is skipped whatever the gauge says
    idle = replace(lagging, step_batch=ok(0.5), running=ok(40.0))
    assert decide(initial_state(2, 64), idle, NOW, cfg).state.calibration.samples == 0


def test_a_breach_before_the_new_pods_first_window_holds_them() -> None:
    """Six pods, ready for 20 s of a 60 s window; the planner asks for 2 and has for the
    whole scale-down window, but p90 TPOT still reads above the SLO. The window mixes
    steps of the smaller fleet, so it adds no pod; nor may a pod go before a window of
    the six can say whether they are enough. Once TPOT is within the SLO, they may."""
    state = replace(settled(6, 2, WINDOW + 15), ready_seen=6, ready_grew_s=NOW - 20)
    breach = observe(rate=4.0, tpot=60.0, ready=6)
    d = decide(state, breach, NOW, config())
    assert d.replicas == 6, d.reason
    assert "before the new pods' first window" in d.reason
    assert decide(state, observe(rate=4.0, tpot=30.0, ready=6), NOW, config()).replicas == 2


def _at_cap_32(ok_for_s: float) -> ControllerState:
    """4 replicas at cap 32 (what 4 req/s needs there), factor settled at 1.0, metrics
    OK for ``ok_for_s``: the planner would rather run cap 55 (64, less the raise margin)."""
    state = settled(4, 4, ok_for_s, cap=32)
    return replace(state, calibration=Calibration(1.0, 50), ready_seen=4)


def test_a_cap_raise_rolls_out_the_replicas_the_new_cap_needs() -> None:
    """The rollout replaces every pod anyway: at cap 55 a replica serves 1.72 req/s, so
    3 new pods carry 4 req/s where 4 would start and one be given back a window later."""
    cfg = config(planner=CapAwarePlanner())
    d = decide(_at_cap_32(WINDOW), observe(rate=4.0, ready=4), NOW, cfg)
    assert (d.max_num_seqs, d.replicas) == (55, 3)
    assert "scale down 4 -> 3: the rollout to max_num_seqs 55: planned 3 for 4.00" in d.reason
    assert d.needed_replicas == 3


def test_a_rollout_keeps_the_pods_until_the_metrics_have_been_ok_a_window() -> None:
    """Fewer pods need what any scale-down needs: a full window of OK metrics."""
    cfg = config(planner=CapAwarePlanner())
    d = decide(_at_cap_32(60.0), observe(rate=4.0, ready=4), NOW, cfg)
    assert (d.max_num_seqs, d.replicas) == (55, 4)
    assert "planned 3 for 4.00 req/s" in d.reason
    assert "holding 4 until 180 s of OK metrics" in d.reason

"""The loop plans the whole target again with the lengths it serves: once they differ
from the ones the running plan was made with beyond their noise, after a window of
readings it watched whole, in a steady fleet; once per difference; at the rate it plans
for. The simulated cluster runs the new plan's pods from then on, never fewer at first
than ran before."""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path

import pytest
from tests.unit.control.test_control import DECLARED
from tests.unit.control.test_respeculation import NOW, Drafting, steady

from rooftop_api.spec import ServingTargetSpec
from rooftop_control import control, traffic
from rooftop_control.readings import Observation
from rooftop_control.traffic import Lengths, Traffic
from rooftop_sim import policies, simulate

ROOT = Path(__file__).resolve().parents[3]
WORKLOAD = traffic.measured_workload(Traffic(DECLARED.prompt, DECLARED.output, observed=True))
EXCERPT = ROOT / "examples" / "traces" / "azure_conv_excerpt.csv"


def scaled(lengths: Lengths, by: float) -> Lengths:
    return Lengths(lengths.mean * by, tuple(q * by for q in lengths.quantiles))


def serving(
    prompt_by: float, healthy_for_s: float = 600.0
) -> tuple[control.ControllerState, Observation, control.ControllerConfig]:
    """``test_respeculation``'s two pods serving 4 req/s, without drafts, prompts
    ``prompt_by`` times the declared ones, their readings OK for ``healthy_for_s``."""
    state, obs, cfg = steady(Drafting(None, []), None)
    served = Traffic(scaled(DECLARED.prompt, prompt_by), DECLARED.output, observed=True)
    state = replace(
        state,
        traffic=served,
        healthy_since_s=NOW - healthy_for_s,
        history=tuple((NOW - t, 2) for t in range(int(healthy_for_s), 0, -15)),
    )
    return state, obs, cfg


def test_served_prompts_a_tenth_of_the_declared_plan_the_target_again() -> None:
    state, obs, cfg = serving(0.1)
    d = control.decide(state, obs, NOW, cfg)
    assert d.replan_workload is not None and d.cause is control.Cause.WORKLOAD
    replan = d.replan_workload
    assert replan.workload.prompt_tokens.mean == 100
    assert replan.workload.output_tokens.mean == 200
    assert replan.requests_per_second == pytest.approx(4.0)  # the loop's rate, not the spec's
    # the fake planner's 2 req/s a pod at $1/h: the running shape costs $2/h at 4 req/s,
    # and the load needs both ready pods
    assert (replan.running_usd_per_hour, replan.running_pods) == (2.0, 2)
    assert "the served prompts (100 tokens on average" in d.reason
    assert d.state.last_cap_change_s == NOW  # the cooldown covers the rollout


def test_it_is_asked_once_and_again_only_when_the_lengths_move_on() -> None:
    state, obs, cfg = serving(0.1)
    first = control.decide(state, obs, NOW, cfg)
    again = control.decide(first.state, obs, NOW + 15.0, cfg)
    assert again.replan_workload is None, "the plan was made with these lengths"
    longer = replace(first.state.traffic, prompt=scaled(DECLARED.prompt, 0.3))
    moved = control.decide(replace(again.state, traffic=longer), obs, NOW + 30.0, cfg)
    assert moved.replan_workload is not None
    assert moved.replan_workload.workload.prompt_tokens.mean == 300


def test_the_plans_own_measured_lengths_are_what_the_served_ones_are_compared_with() -> None:
    # After an operator restart the controller's memory is gone; status.plan says what
    # the running plan was made with.
    state, obs, cfg = serving(0.1)
    made_with = traffic.measured_workload(state.traffic)
    cfg = replace(cfg, planned_workload=made_with)
    assert control.decide(state, obs, NOW, cfg).replan_workload is None


@pytest.mark.parametrize(
    ("prompt_by", "healthy_for_s", "why"),
    [
        (1.2, 600.0, "a mean 20 % off is within the noise of a few hundred requests"),
        (0.1, 120.0, "two minutes of readings: less than a scale-down window"),
    ],
)
def test_what_plans_nothing_again(prompt_by: float, healthy_for_s: float, why: str) -> None:
    state, obs, cfg = serving(prompt_by, healthy_for_s)
    assert control.decide(state, obs, NOW, cfg).replan_workload is None, why


@pytest.mark.parametrize(
    ("usd_per_hour", "pays"), [(14.0, True), (15.0, False), (19.0, False), (25.0, False)]
)
def test_another_shape_must_cost_a_reshapes_gain_less(usd_per_hour: float, pays: bool) -> None:
    # $20/h for the running shape at this rate: a new one pays at 30 % less ($14/h)
    replan = control.WorkloadReplan(WORKLOAD, 4.0, running_usd_per_hour=20.0)
    assert replan.pays(usd_per_hour) is pays


@pytest.mark.parametrize(
    ("running_pods", "replicas", "pods"),
    [
        (3, 1, 3),  # three old pods carry the load: the rollout keeps three serving
        (1, 3, 3),  # the plan's own count where it needs more
    ],
)
def test_a_new_shape_starts_with_the_old_pods_the_load_needs(
    running_pods: int, replicas: int, pods: int
) -> None:
    replan = control.WorkloadReplan(WORKLOAD, 4.0, 20.0, running_pods)
    assert replan.pods(replicas) == pods


def test_not_while_a_pod_starts() -> None:
    state, obs, cfg = serving(0.1)
    d = control.decide(state, replace(obs, pending_replicas=1), NOW, cfg)
    assert d.replan_workload is None


# ---------------------------------------------------------------- the simulated cluster

LONG_DECLARED = {
    "model": "llama-3.1-70b",
    "mode": "simulated",
    "slo": {"tpotMs": 50, "tpotPercentile": "p90", "ttftMs": 2000, "ttftPercentile": "p90"},
    "workload": {
        "requestsPerSecond": 2,
        "promptTokens": {"mean": 24000, "p90": 32000},
        "outputTokens": {"mean": 260, "p90": 432},
    },
    "budget": {"usdPerHour": 200},
}


def test_a_70b_declared_with_24k_prompts_moves_to_the_shape_its_1k_prompts_need() -> None:
    """Declared 24k-token prompts plan 4-GPU B200 pods; the chat excerpt serves 1,147.
    The loop plans the target again with the served lengths and the pods run 2-GPU ones
    from then on, within the SLO, at less than the declared plan's pods cost."""
    spec = ServingTargetSpec.model_validate(LONG_DECLARED)
    scn = simulate.scenario(spec, simulate.workload_from_trace(str(EXCERPT)), seed=0)
    assert (scn.plan.gpu, scn.plan.tp) == ("b200", 4)
    result, summary = simulate.run(scn, "rooftop")
    notes = " ".join(result.notes)
    assert "the loop planned the target again: the served prompts" in notes
    assert "its pods then ran b200 at TP2" in notes
    assert summary["slo_attainment_tpot"] >= 0.9
    assert summary["slo_attainment_ttft"] >= 0.9


def test_a_kept_replan_gives_back_the_cooldown_it_started() -> None:
    """The ask restarts the batch-cap cooldown for the rollout a new shape brings; where
    the running engine is kept, ``plan_kept`` puts it back and keeps the lengths asked
    with, so the next tick neither waits 15 minutes for a cap nor asks again."""
    state, obs, cfg = serving(0.1)
    before = replace(state, last_cap_change_s=NOW - 3600.0)
    d = control.decide(before, obs, NOW, cfg)
    assert d.replan_workload is not None and d.state.last_cap_change_s == NOW
    kept = control.plan_kept(d.state, before)
    assert kept.last_cap_change_s == NOW - 3600.0
    assert kept.replanned_workload == d.replan_workload.workload
    again = control.decide(kept, obs, NOW + 15.0, cfg)
    assert again.replan_workload is None


def test_the_simulated_cluster_gives_the_cooldown_back_when_the_plan_is_kept(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The rooftop policy asks its replanner, as the operator's loop asks reconcile: a
    plan that does not pay (here: none found) keeps the pods and the cooldown as they
    were; one of another shape starts its own."""
    spec = ServingTargetSpec.model_validate(LONG_DECLARED)
    scn = simulate.scenario(spec, simulate.workload_from_trace(str(EXCERPT)), seed=0)
    policy, _ = simulate.make_policy(scn, "rooftop")
    assert isinstance(policy, policies.RooftopPolicy)
    before = replace(policy.state, last_cap_change_s=NOW - 3600.0)
    policy.state = before
    state, obs, _ = serving(0.1)

    def asks(state_: control.ControllerState, *_: object) -> control.Decision:
        d = control.decide(state, obs, NOW, serving(0.1)[2])
        assert d.replan_workload is not None
        return replace(d, state=replace(state_, last_cap_change_s=NOW))

    monkeypatch.setattr(policies, "decide", asks)
    policy.replanner = lambda *_: None
    policy.decide(NOW, obs)
    assert policy.state.last_cap_change_s == NOW - 3600.0
    assert policy.reshape is None, "the pods run as they did"

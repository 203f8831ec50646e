"""The loop re-plans speculative decoding from the acceptance it measures: a new
draft-length schedule where it pays at the running batch, none where drafting pays at
no batch size, nothing where the change gains too little for a rollout; the decision
rolls it out like a new batch cap, and the simulated cluster replaces its pods."""

from __future__ import annotations

import json
from dataclasses import dataclass, replace
from pathlib import Path

import pytest
import yaml
from tests.unit.control.test_control import DECLARED as CONTROL_DECLARED
from tests.unit.control.test_control import FakePlanner
from tests.unit.control.test_traffic import OUTPUT, PROMPT, served

from rooftop_api.spec import ServingTargetSpec
from rooftop_control import control, traffic
from rooftop_control.calibration import Calibration
from rooftop_control.readings import MetricState, Observation, Reading
from rooftop_control.sizing import (
    FleetPlanner,
    PlanTargetPlanner,
    Respeculation,
    drafts_by_lookup,
    pinned_spec,
)
from rooftop_control.traffic import Traffic
from rooftop_planner import speculative
from rooftop_planner.pricing import ReplicaPrice
from rooftop_planner.search import plan_target, prepare_search
from rooftop_sim import policies, simulate
from rooftop_sim.cluster import Cluster

ROOT = Path(__file__).resolve().parents[3]
EXAMPLE = ROOT / "examples" / "speculative-70b.yaml"
EXCERPT = ROOT / "examples" / "traces" / "azure_conv_excerpt.csv"
SPEC = ServingTargetSpec.model_validate(yaml.safe_load(EXAMPLE.read_text())["spec"])
DECLARED = traffic.declared(SPEC.workload)


@pytest.fixture(scope="module")
def planner() -> PlanTargetPlanner:
    plan = plan_target(SPEC).plan
    assert plan is not None and plan.speculative_config, "the example speculates"
    return PlanTargetPlanner(SPEC, plan)


def test_at_the_planned_acceptance_the_running_schedule_stays(planner: PlanTargetPlanner) -> None:
    assert planner.respeculate(0.7, 4.0, DECLARED) is None


def test_drafts_accepted_far_more_than_planned_draft_longer(planner: PlanTargetPlanner) -> None:
    """At 0.99 a draft of 5 makes a step at batch 3 about 18 % faster per token than
    the running 2: more than the 15 % a rollout must gain."""
    found = planner.respeculate(0.99, 3.0, DECLARED)
    assert found is not None and found.config
    running = planner.plan.speculative_config
    assert speculative.draft_length(found.config, 3) > speculative.draft_length(running, 3)
    assert json.loads(found.config)["model"] == json.loads(running)["model"]
    assert "accepted at 0.99 per token" in found.why and "ms per output token" in found.why


def test_a_gain_under_the_rollouts_margin_keeps_the_running_drafts(
    planner: PlanTargetPlanner,
) -> None:
    """At 0.9 the longer draft gains about 8 % at batch 3: a rollout of every pod is
    not worth it (the speculative example's loop paid more for one than it saved)."""
    assert planner.respeculate(0.9, 3.0, DECLARED) is None


def test_drafts_that_pay_at_no_batch_turn_speculation_off(planner: PlanTargetPlanner) -> None:
    found = planner.respeculate(0.05, 4.0, DECLARED)
    assert found is not None and found.config == ""
    assert "speculative decoding off" in found.why and "edit the target" in found.why


def test_a_small_gain_is_not_worth_a_rollout(planner: PlanTargetPlanner) -> None:
    """Near the planned acceptance the schedule may differ somewhere, but at the running
    batch no draft length is 15 % faster than the running one: every acceptance on the
    loop's grid within 0.04 of the plan's keeps it."""
    for acceptance in (0.66, 0.68, 0.72, 0.74):
        assert planner.respeculate(acceptance, 8.0, DECLARED) is None, acceptance


def test_a_plan_without_speculation_is_never_respeculated(planner: PlanTargetPlanner) -> None:
    plain = planner.respeculated("")
    assert plain.speculation is None and not plain.plan.speculative_config
    assert plain.respeculate(0.05, 4.0, DECLARED) is None
    # its steps are plain ones, its KV cache without the drafter's share
    k = speculative.draft_length(planner.plan.speculative_config, 8)
    assert k > 0 and plain.step_ms(8, 1147, 260) < planner.step_ms(8, 1147, 260)


# ---------------------------------------------------------------- the decision


@dataclass
class Drafting(FakePlanner):
    """``test_control``'s planner (one replica per 2 req/s, 20 ms steps) whose drafts
    the loop may re-plan: ``answer`` at any measured acceptance (those asked at kept)."""

    answer: Respeculation | None
    asked: list[float]

    def respeculate(
        self, acceptance: float, batch: float, traffic: Traffic
    ) -> Respeculation | None:
        self.asked.append(acceptance)
        return self.answer


def ok(value: float) -> Reading:
    return Reading(value, MetricState.OK)


NOW = 10_000.0
OFF = Respeculation("", "drafts are accepted at 0.20 per token: off")


def steady(
    planner: Drafting, acceptance: float | None = 0.2
) -> tuple[control.ControllerState, Observation, control.ControllerConfig]:
    """Two pods serving 4 req/s for ten minutes, drafts measured at ``acceptance``."""
    cfg = control.ControllerConfig(
        planner=planner, tpot_slo_ms=40.0, ttft_slo_ms=None, min_replicas=1,
        max_replicas=8, budget_usd_per_hour=100.0, price=ReplicaPrice.flat(1.0),
        declared=CONTROL_DECLARED,
    )  # fmt: skip
    measured = replace(CONTROL_DECLARED, observed=True, acceptance=acceptance)
    state = replace(
        control.initial_state(2, 64),
        calibration=Calibration(1.0, 20),
        traffic=measured,
        ready_seen=2,
        started_s=NOW - 600.0,
    )
    obs = Observation(
        tpot_ms=ok(25.0), ttft_ms=ok(300.0), requests_per_second=ok(4.0), running=ok(16.0),
        waiting=ok(0.0), kv_usage_ratio=ok(0.3), step_ms=ok(20.0), ready_replicas=2,
    )  # fmt: skip
    return state, obs, cfg


def test_a_steady_fleet_rolls_out_the_new_drafts() -> None:
    planner = Drafting(OFF, [])
    state, obs, cfg = steady(planner)
    d = control.decide(state, obs, NOW, cfg)
    assert d.speculative_config == "" and d.changed and d.replicas == 2
    assert d.cause is control.Cause.ACCEPTANCE and d.speculation_why == OFF.why
    assert OFF.why in d.reason and d.state.last_cap_change_s == NOW
    assert planner.asked[-1] == pytest.approx(0.2)
    # the cooldown a batch-cap rollout has covers the drafts too
    again = control.decide(d.state, obs, NOW + 60.0, cfg)
    assert again.speculative_config is None and not again.changed


@pytest.mark.parametrize(
    "unsteady",
    [
        "starting pod",
        "no acceptance measured",
        "rollout cooldown",
        "rollout running",
        "first windows",
        "sole pod",
        "no batch",
    ],
)
def test_the_drafts_wait_for_a_steady_fleet(unsteady: str) -> None:
    """A rollout restarts every pod: not while one starts, not without a measured
    acceptance, not within the cooldown of the last rollout, never one that would stop
    the only pod with no room for its replacement, nor without a batch to judge at."""
    planner = Drafting(OFF, [])
    state, obs, cfg = steady(planner, None if unsteady == "no acceptance measured" else 0.2)
    if unsteady == "starting pod":
        obs = replace(obs, pending_replicas=1)
    if unsteady == "rollout cooldown":
        state = replace(state, last_cap_change_s=NOW - 60.0)
    if unsteady == "rollout running":
        obs = replace(obs, outdated_replicas=1)
    if unsteady == "first windows":  # the step-time factor not settled yet
        state = replace(state, calibration=Calibration(1.0, 2))
    if unsteady == "sole pod":
        cfg = replace(cfg, max_replicas=1, min_replicas=1)
        state = replace(state, replicas=1, ready_seen=1)
        obs = replace(obs, ready_replicas=1, requests_per_second=ok(1.0), running=ok(8.0))
    if unsteady == "no batch":
        obs = replace(obs, running=ok(0.0), requests_per_second=ok(0.0))
    d = control.decide(state, obs, NOW, cfg)
    assert d.speculative_config is None and d.cause is not control.Cause.ACCEPTANCE


def test_an_acceptance_far_from_the_plans_plans_the_target_again() -> None:
    """Planned at 0.7, measured at 0.9: more than 0.1 apart, the whole target is planned
    again with it (GPUs, TP, drafts), in place of re-planning the drafts alone; asked
    once, not again while the acceptance stays there (the drafts alone are weighed
    then), and again once it moves on."""
    planner = Drafting(None, [])
    state, obs, cfg = steady(planner, 0.9)
    cfg = replace(cfg, planned_acceptance=0.7)
    d = control.decide(state, obs, NOW, cfg)
    assert d.replan_acceptance == pytest.approx(0.9) and d.speculative_config is None
    assert d.cause is control.Cause.ACCEPTANCE and planner.asked == []
    assert "accepted at 0.90 per token" in d.reason and d.state.last_cap_change_s == NOW
    later = NOW + cfg.cap_cooldown_s + 60.0
    again = control.decide(d.state, obs, later, cfg)
    assert again.replan_acceptance is None  # the re-plan kept the plan: not asked again
    assert planner.asked == [pytest.approx(0.9)]
    moved = replace(again.state, traffic=replace(again.state.traffic, acceptance=0.4))
    assert control.decide(moved, obs, later + 60.0, cfg).replan_acceptance == pytest.approx(0.4)


def test_a_replan_waits_for_a_steady_fleet_only() -> None:
    """A batch-cap rollout a minute ago, its pods all replaced: the re-plan need not
    wait 15 minutes (its acceptance moves on by a tenth each time), nor for a settled
    factor, but it waits while the rollout still replaces pods."""
    state, obs, cfg = steady(Drafting(None, []), 0.9)
    cfg = replace(cfg, planned_acceptance=0.7)
    state = replace(state, last_cap_change_s=NOW - 60.0)
    assert control.decide(state, obs, NOW, cfg).replan_acceptance == pytest.approx(0.9)
    running = replace(obs, outdated_replicas=1)
    assert control.decide(state, running, NOW, cfg).replan_acceptance is None
    # the acceptance is read from thousands of drafts: no settled step-time factor needed
    first = replace(state, calibration=Calibration(1.0, 2))
    assert control.decide(first, obs, NOW, cfg).replan_acceptance == pytest.approx(0.9)


def test_within_a_tenth_of_the_plans_acceptance_only_the_drafts_are_weighed() -> None:
    planner = Drafting(None, [])
    state, obs, cfg = steady(planner, 0.78)
    d = control.decide(state, obs, NOW, replace(cfg, planned_acceptance=0.7))
    assert d.replan_acceptance is None and planner.asked == [pytest.approx(0.78)]


def test_what_the_loop_learned_is_carried_over_to_the_new_drafts() -> None:
    state, obs, cfg = steady(Drafting(OFF, []))
    state = replace(state, trim=1.3, calibration=Calibration(1.2, 40), last_cap_change_s=NOW)
    kept = control.carried_over(state)
    assert (kept.trim, kept.calibration, kept.last_cap_change_s) == (1.3, state.calibration, NOW)
    assert kept.history == () and (kept.replicas, kept.max_num_seqs) == (2, 64)


# ---------------------------------------------------------------- the simulated cluster


def test_the_simulated_loop_replans_drafts_that_no_longer_pay() -> None:
    """Drafts truly accepted at 0.3, planned at 0.7: the loop measures it and plans the
    target again with it, which no longer speculates; the pods started from then on run
    the new plan, the earlier ones roll over, and the SLO's p90 holds."""
    workload = simulate.workload_from_trace(str(EXCERPT))
    scn = simulate.scenario(SPEC, workload, acceptance=0.3, seed=0)
    policy, _ = simulate.make_policy(scn, "rooftop")
    cluster = Cluster(scn.workload, simulate.cluster_config(scn, "rooftop"))
    result = cluster.run(policy)
    asked = [d for d in policy.decisions if d.replan_acceptance is not None]
    assert [d.replan_acceptance for d in asked] == [pytest.approx(0.3)]
    assert policy.reshape is not None and policy.reshape.plan.measured_acceptance == 0.3
    assert scn.plan.speculative_config and not cluster.replica.speculative_config
    assert len(cluster.templates) == 2
    when = asked[0].state.last_cap_change_s
    assert when is not None
    started_after = [p for p in cluster.pods if p.created_s > when]
    assert started_after and all(p.template == 1 for p in started_after)
    assert not any(p.template == 0 and p.gone_s is None for p in cluster.pods)  # rolled over
    within = simulate.summary(result, scn.slo, 1.0)["slo_attainment_tpot"]
    assert within >= 0.9


def test_the_simulated_loop_rolls_its_pods_onto_new_drafts(
    monkeypatch: pytest.MonkeyPatch, planner: PlanTargetPlanner
) -> None:
    """A decision with new drafts: the policy's pods run its plan with them from then
    on, at the same price, with a planner for that engine."""
    workload = simulate.workload_from_trace(str(EXCERPT))
    scn = simulate.scenario(SPEC, workload, acceptance=0.7, seed=0)
    policy, _ = simulate.make_policy(scn, "rooftop")
    assert isinstance(policy, policies.RooftopPolicy)
    decide = policies.decide

    def drafts_off(*args: object, **kwargs: object) -> control.Decision:
        d = decide(*args, **kwargs)  # type: ignore[arg-type]
        return replace(d, speculative_config="", speculation_why="off")

    monkeypatch.setattr(policies, "decide", drafts_off)
    price = policy.config.price
    policy.decide(60.0, Observation(ready_replicas=1))
    assert policy.reshape is not None and policy.reshape.price is price
    assert policy.reshape.plan.speculative_config == ""
    assert policy.reshape.plan.shape[:2] == scn.plan.shape[:2]  # the same GPU and TP
    new_planner = policy.config.planner
    assert isinstance(new_planner, PlanTargetPlanner) and new_planner.speculation is None
    assert policy.state.engines_mixed


STEADY_FIELDS = ("tpot_ms", "ttft_ms", "requests_per_second", "running", "waiting",
                 "kv_usage_ratio", "step_ms", "ready_replicas")  # fmt: skip


def test_a_prompt_lookups_acceptance_is_read_per_decode_step() -> None:
    """The same counters (1.4 of 3 drafts accepted, on 40 % of decode steps) read as a
    model drafter's acceptance and as a prompt lookup's: the lookup's counts the steps
    that found no match, as the planner prices ngram."""
    state, steady_obs, cfg = steady(Drafting(None, []), None)
    obs = replace(
        served(500, PROMPT, OUTPUT),
        served_accepted_per_draft=ok(1.4),
        served_draft_length=ok(3.0),
        served_drafted_share=ok(0.4),
        **{name: getattr(steady_obs, name) for name in STEADY_FIELDS},
    )
    by_model = control.decide(state, obs, NOW, cfg).state.traffic
    by_lookup = control.decide(
        state, obs, NOW, replace(cfg, acceptance_per_decode_step=True)
    ).state.traffic
    assert by_model is not None and by_lookup is not None
    assert by_model.acceptance == traffic.measured_acceptance(obs)
    assert by_lookup.acceptance == traffic.measured_acceptance(obs, per_decode_step=True)
    assert by_lookup.acceptance is not None and by_model.acceptance is not None
    assert by_lookup.acceptance < by_model.acceptance - 0.2


def test_a_prompt_lookup_plan_is_run_and_respeculated_without_a_drafter() -> None:
    """The speculative example with ngram at 0.7: the loop's planner knows its drafts
    are lookups; measured at 0.05 they stop at the running batch of 16 (a lookup costs
    no GPU time, so a batch of one still drafts), with no model to name."""
    data = yaml.safe_load(EXAMPLE.read_text())["spec"]
    data["constraints"]["speculative"] = ["ngram"]
    spec = ServingTargetSpec.model_validate(data)
    plan = plan_target(spec).plan
    assert plan is not None and '"method":"ngram"' in plan.speculative_config
    lookup = PlanTargetPlanner(spec, plan)
    assert lookup.drafts_by_lookup and lookup.planned_acceptance == 0.7
    off = lookup.respeculate(0.05, 16.0, DECLARED)
    assert off is not None and "speculation off at this batch" in off.why
    config = json.loads(off.config)
    assert config["method"] == "ngram" and "model" not in config
    assert speculative.draft_length(off.config, 16) == 0
    assert not PlanTargetPlanner(SPEC, plan_target(SPEC).plan).drafts_by_lookup  # type: ignore[arg-type]


@pytest.mark.parametrize(
    ("config", "lookup"),
    [
        ('{"method": "ngram", "num_speculative_tokens": 3}', True),
        ('{"model": "[ngram]", "num_speculative_tokens": 3}', True),
        ('{"method": "eagle3", "model": "some/head", "num_speculative_tokens": 3}', False),
    ],
)
def test_a_lookup_given_in_extra_args_is_read_per_decode_step(config: str, lookup: bool) -> None:
    """A target that speculates by its own --speculative-config (no method planned):
    the loop still reads a lookup's acceptance per decode step, vLLM's way of naming
    it by its model included."""
    data = yaml.safe_load(EXAMPLE.read_text())["spec"]
    del data["constraints"]["speculative"]
    data["engine"] = {"extraArgs": ["--speculative-config", config]}
    spec = ServingTargetSpec.model_validate(data)
    plan = plan_target(spec).plan
    assert plan is not None and not plan.speculative_config
    assert drafts_by_lookup(spec, plan) is lookup


def test_a_speculating_mix_prices_each_pools_steps_with_its_own_drafts() -> None:
    """Owned A100s beside a GH200 (examples/owned-a100s.yaml) drafting by prompt
    lookup: each pool's step is the verification of its own schedule's drafts, so the
    fleet's step-time factor compares like with like; the drafts alone are not
    re-planned on a mix (the whole target is, beyond 0.1)."""
    data = yaml.safe_load((ROOT / "examples" / "owned-a100s.yaml").read_text())["spec"]
    data["constraints"]["speculative"] = ["ngram"]
    data["workload"]["acceptanceRate"] = 0.7
    spec = ServingTargetSpec.model_validate(data)
    plan = plan_target(spec).deployed
    assert plan is not None and len(plan.pools) == 2
    fleet = FleetPlanner(spec, plan)
    for gpu, pool in fleet.pools.items():
        assert pool.speculation is not None and pool.drafts_by_lookup, gpu
        k = speculative.draft_length(pool.plan.speculative_config, 4.0)
        ratio = speculative.step_ratio(pool.deployment, pool.speculation, 4.0, 1155 + 211 / 2, k)
        plain = PlanTargetPlanner(spec, replace(pool.plan, speculative_config=""))
        assert k > 0 and pool.step_ms(4.0, 1155.0, 211.0) == pytest.approx(
            ratio * plain.step_ms(4.0, 1155.0, 211.0), rel=1e-9
        )
    assert fleet.drafts_by_lookup and fleet.planned_acceptance == 0.7
    assert fleet.respeculate(0.05, 16.0, DECLARED) is None


def test_a_suffix_plan_runs_its_own_length_and_is_respeculated_as_one_length() -> None:
    """The speculative example with suffix at 0.7: the loop prices the length the pods
    run (5); measured at 0.2 at a running batch of 16 a shorter one for every batch
    pays (vLLM's suffix proposer takes one); at 0.05 no length pays there, so drafting
    stops."""
    data = yaml.safe_load(EXAMPLE.read_text())["spec"]
    data["constraints"]["speculative"] = ["suffix"]
    spec = ServingTargetSpec.model_validate(data)
    plan = plan_target(spec).plan
    assert plan is not None and '"method":"suffix"' in plan.speculative_config
    running = json.loads(plan.speculative_config)["num_speculative_tokens"]
    suffix = PlanTargetPlanner(spec, plan)
    assert suffix.drafts_by_lookup and suffix.speculation is not None
    assert suffix.speculation.fixed and suffix.speculation.max_draft_tokens == running == 5
    shorter = suffix.respeculate(0.2, 16.0, DECLARED)
    assert shorter is not None and "draft length 5 -> 2" in shorter.why
    assert json.loads(shorter.config) == {"method": "suffix", "num_speculative_tokens": 2}
    off = suffix.respeculate(0.05, 16.0, DECLARED)
    assert off is not None and off.config == ""
    assert "pays at no draft length at the running batch of 16" in off.why


def test_the_loop_sizes_a_suffix_plan_at_the_length_its_pods_run() -> None:
    """The loop's search prices the running draft length only: priced at another one
    it would size replicas for steps the pods do not take. The whole search weighs
    every length."""
    data = yaml.safe_load(EXAMPLE.read_text())["spec"]
    data["constraints"]["speculative"] = ["suffix"]
    spec = ServingTargetSpec.model_validate(data)
    plan = plan_target(spec).plan
    assert plan is not None

    def lengths(draft_tokens: int | None) -> set[int]:
        search = prepare_search(
            pinned_spec(spec, plan), tp=plan.tp, speculating=True, draft_tokens=draft_tokens
        )
        plans = search.plans(spec.workload.requests_per_second)
        return {json.loads(p.speculative_config)["num_speculative_tokens"] for p in plans}

    assert len(lengths(None)) > 1
    for k in (1, 3):
        assert lengths(k) == {k}
        config = json.dumps({"method": "suffix", "num_speculative_tokens": k})
        running = PlanTargetPlanner(spec, replace(plan, speculative_config=config))
        assert running._running_draft_tokens() == k

"""The operator applies the drafts its loop re-planned from the measured acceptance:
the Deployment's --speculative-config, status.plan, an event saying why; the loop keeps
what it learned; and a resume of the same spec keeps the loop's drafts."""

from __future__ import annotations

import json
from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest
import yaml
from operator_fakes import NS, Events, FakeKube, FakePlanner, FakeResult, target_body

from rooftop_api.spec import ServingTargetStatus
from rooftop_control import control
from rooftop_control.calibration import Calibration
from rooftop_control.readings import MetricState, Observation
from rooftop_control.sizing import PlanTargetPlanner
from rooftop_operator import loop
from rooftop_operator.reconcile import keep_loop_scale, reconcile
from rooftop_operator.runtime import Runtime
from rooftop_operator.specs import TargetRef, parse_spec
from rooftop_planner.catalog import load_catalog
from rooftop_planner.plan import Plan
from rooftop_planner.search import plan_target

EXAMPLE = Path(__file__).resolve().parents[3] / "examples" / "speculative-70b.yaml"
DOC: dict[str, Any] = yaml.safe_load(EXAMPLE.read_text())
WHY = "drafts are accepted at 0.20 per token, where drafting pays at no batch size"


@pytest.fixture(scope="module")
def plan() -> Plan:
    found = plan_target(parse_spec(DOC["spec"])).plan
    assert found is not None and found.speculative_config, "the example speculates"
    return found


def respeculated(config: str, replicas: int = 1) -> control.Decision:
    state = replace(control.initial_state(replicas, 32), calibration=Calibration(1.2, 30))
    return control.Decision(
        replicas, 32, f"hold {replicas}; {WHY}", (), state, MetricState.OK, replicas,
        replicas, 32, cause=control.Cause.ACCEPTANCE, speculative_config=config,
        speculation_why=WHY,
    )  # fmt: skip


def engine_args(kube: FakeKube) -> list[str]:
    deployment = next(o for o in kube.applied if o["kind"] == "Deployment")
    engine = deployment["spec"]["template"]["spec"]["containers"][0]
    # engine-sim's flags (the example is simulated) are its command's, vLLM's its args
    return [*engine.get("command", []), *engine.get("args", [])]


def applied(rt: Runtime, kube: FakeKube, plan: Plan, config: str) -> dict[str, Any]:
    """The loop's decision to run ``config`` applied to the deployed example; its status."""
    stored = ServingTargetStatus(plan=plan.to_status()).stored()["plan"]
    body = target_body("fast-70b", DOC["spec"], plan=stored)
    kube.add(body)
    d = respeculated(config)
    assert d.changed
    ref, spec = TargetRef.from_body(body), parse_spec(DOC["spec"])
    loop._apply(rt, body, ref, spec, plan, d, Observation(ready_replicas=1))
    found = kube.get_target(NS, "fast-70b")
    assert found is not None
    status: dict[str, Any] = found["status"]
    return status


def test_speculation_off_rolls_out_and_says_why(
    rt: Runtime, kube: FakeKube, events: Events, plan: Plan
) -> None:
    status = applied(rt, kube, plan, "")
    assert "--speculative-config" not in " ".join(engine_args(kube))
    assert ("Normal", "SpeculationOff", WHY) in events.items
    assert "speculativeConfig" not in status["plan"]
    assert Plan.from_status(status["plan"]).speculative_config == ""


def test_a_new_schedule_is_the_pods_flag_and_the_plans(
    rt: Runtime, kube: FakeKube, events: Events, plan: Plan
) -> None:
    longer = json.loads(plan.speculative_config)
    longer["num_speculative_tokens"] = 4
    longer.pop("num_speculative_tokens_per_batch_size", None)
    config = json.dumps(longer, separators=(",", ":"))
    status = applied(rt, kube, plan, config)
    args = engine_args(kube)
    assert json.loads(args[args.index("--speculative-config") + 1]) == longer
    assert events.reasons[-1] == "DraftLengthsChanged"
    assert status["plan"]["speculativeConfig"] == config


def test_the_loop_keeps_what_it_learned_across_its_own_drafts(plan: Plan) -> None:
    """The next tick reads status.plan with the new drafts: the same memory, a planner
    for the new engine, the factor and trim carried over (``control.carried_over``)."""
    spec = parse_spec(DOC["spec"])
    body = target_body("fast-70b", DOC["spec"])
    ref = TargetRef.from_body(body)
    targets: dict[str, Any] = {}
    status = ServingTargetStatus()
    mem = loop._memory(targets, ref, spec, plan, status, 1, load_catalog())
    mem.state = replace(mem.state, trim=1.4, calibration=Calibration(1.2, 30))
    off = replace(plan, speculative_config="")
    again = loop._memory(targets, ref, spec, off, status, 1, load_catalog())
    assert again is mem and (again.state.trim, again.state.calibration.factor) == (1.4, 1.2)
    assert isinstance(again.planner, PlanTargetPlanner) and again.planner.speculation is None
    # another engine (a spec edit, a new GPU) starts over
    other = loop._memory(targets, ref, spec, replace(off, gpu="h200"), status, 1, load_catalog())
    assert other is not mem and other.state.trim == 1.0


def test_a_resume_keeps_the_loops_drafts(plan: Plan) -> None:
    """Re-planned from the same spec (an operator restart), the declared acceptance
    gives the planned drafts again; the loop's, from the measured one, stay."""
    off = replace(plan, speculative_config="", replicas=2)
    kept = keep_loop_scale(plan, off)
    assert kept.speculative_config == "" and kept.replicas == 2
    other = json.loads(plan.speculative_config)
    other["num_speculative_tokens"] = 1
    other.pop("num_speculative_tokens_per_batch_size", None)
    shorter = json.dumps(other, separators=(",", ":"))
    assert keep_loop_scale(plan, replace(plan, speculative_config=shorter)).speculative_config == (
        shorter
    )
    # another drafter or another engine is no choice of the loop's: the plan wins
    other["model"] = "someone/another-drafter"
    foreign = replace(plan, speculative_config=json.dumps(other))
    assert keep_loop_scale(plan, foreign).speculative_config == plan.speculative_config
    assert (
        keep_loop_scale(plan, replace(off, gpu="h200")).speculative_config
        == plan.speculative_config
    )
    # a plan without speculation gains none from an old one
    plain = replace(plan, speculative_config="")
    assert keep_loop_scale(plain, plan).speculative_config == ""


# ---------------------------------------------------------------- the target re-planned


class RecordingPlanner(FakePlanner):
    """``FakePlanner``, keeping the acceptance each spec it planned said."""

    def __init__(self, plan: Plan) -> None:
        super().__init__(FakeResult(True, plan))
        self.acceptances: list[float | None] = []

    def __call__(self, spec: Any, **kwargs: Any) -> FakeResult:
        self.acceptances.append(spec.workload.acceptance_rate)
        return super().__call__(spec, **kwargs)


def test_the_loop_replans_with_the_measured_acceptance_and_a_restart_keeps_it(
    rt: Runtime, kube: FakeKube, events: Events, plan: Plan
) -> None:
    """The declared 0.7 deploys TP8; drafts measured at 0.9 plan a cheaper TP2 shape:
    it rolls out, status.plan keeps 0.9, and an operator restart (the same spec
    generation planned again) plans with 0.9 too; a spec edit starts from the spec."""
    planner = RecordingPlanner(plan)
    rt.plan = planner
    body = target_body("fast-70b", DOC["spec"])
    kube.add(body)
    assert reconcile(rt, body) == "success"
    smaller = replace(plan, tp=2, replicas=3, usd_per_hour=plan.usd_per_hour * 3 / 4)
    planner.result = FakeResult(True, smaller)
    d = replace(respeculated(""), speculative_config=None, replan_acceptance=0.9)
    loop.replan(rt, latest(kube), d)
    assert planner.acceptances == [0.7, 0.9]  # as declared, then as measured
    assert events.reasons[-2:] == ["Replanned", "PlanChanged"]
    stored = latest(kube)["status"]["plan"]
    assert (stored["tp"], stored["measuredAcceptance"]) == (2, 0.9)
    deployment = kube.get("apps/v1", "Deployment", NS, "fast-70b-engine")
    assert deployment is not None and deployment["spec"]["replicas"] == 3
    reconcile(rt, latest(kube))  # an operator restart
    assert planner.acceptances[-1] == 0.9
    assert latest(kube)["status"]["plan"]["measuredAcceptance"] == 0.9
    edited = latest(kube)
    edited["metadata"]["generation"] = 2
    reconcile(rt, edited)
    assert planner.acceptances[-1] == 0.7


def latest(kube: FakeKube) -> dict[str, Any]:
    found = kube.get_target(NS, "fast-70b")
    assert found is not None
    return found


def test_a_replan_that_finds_no_plan_keeps_the_running_one_and_its_conditions(
    rt: Runtime, kube: FakeKube, events: Events, plan: Plan
) -> None:
    """Drafts measured at 0.2 where nothing meets the SLO within the budget: the
    Deployment and status.plan stay, a Warning says why, and Feasible stays as the spec's
    plan set it (an operator restart, which plans the spec as written, would flip it
    back otherwise)."""
    planner = RecordingPlanner(plan)
    rt.plan = planner
    kube.add(target_body("fast-70b", DOC["spec"]))
    assert reconcile(rt, latest(kube)) == "success"
    before = latest(kube)["status"]
    deployment = kube.get("apps/v1", "Deployment", NS, "fast-70b-engine")
    planner.result = FakeResult(False, None, ["TPOT over SLO at every batch"])
    d = replace(respeculated(""), speculative_config=None, replan_acceptance=0.2)
    loop.replan(rt, latest(kube), d)
    assert planner.acceptances[-1] == 0.2
    assert events.reasons[-2:] == ["Replanned", "ReplanInfeasible"]
    kind, _, message = events.items[-1]
    assert kind == "Warning" and "accepted at 0.20 per token, no plan fits" in message
    assert "TPOT over SLO at every batch" in message
    after = latest(kube)["status"]
    assert after["plan"] == before["plan"] and after["conditions"] == before["conditions"]
    assert kube.get("apps/v1", "Deployment", NS, "fast-70b-engine") == deployment

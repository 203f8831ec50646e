"""The operator plans the target again with the lengths its loop measured: the planner
sees them in place of spec.workload's and the loop's rate, status.plan keeps them (an
operator restart plans with them again, an edit starts from the spec), and a plan of
another shape starts with no fewer pods than ran, within the budget."""

from __future__ import annotations

import json
from dataclasses import replace
from pathlib import Path
from typing import Any

import yaml
from operator_fakes import (
    NS,
    SPEC,
    Events,
    FakeKube,
    FakePlanner,
    FakeResult,
    make_plan,
    target_body,
)

from rooftop_api.spec import MeasuredLengths, MeasuredWorkload, ServingTargetSpec
from rooftop_control import control
from rooftop_control.readings import MetricState
from rooftop_operator import loop
from rooftop_operator.reconcile import reconcile, transition_pods
from rooftop_operator.runtime import Runtime
from rooftop_operator.specs import parse_spec
from rooftop_planner.plan import Plan
from rooftop_planner.pricing import ReplicaPrice
from rooftop_planner.search import plan_target

SPECULATIVE = Path(__file__).resolve().parents[3] / "examples" / "speculative-70b.yaml"
SERVED = MeasuredWorkload(
    prompt_tokens=MeasuredLengths(mean=4100, p10=600, p50=3000, p90=9000, p99=20000),
    output_tokens=MeasuredLengths(mean=130, p10=20, p50=100, p90=260, p99=600),
)


class LengthsPlanner(FakePlanner):
    """``FakePlanner``, keeping the mean prompt of each spec it planned."""

    def __init__(self, plan: Plan) -> None:
        super().__init__(FakeResult(True, plan))
        self.prompts: list[float] = []

    def __call__(self, spec: Any, **kwargs: Any) -> FakeResult:
        tokens = spec.workload.prompt_tokens
        mean = tokens.mean
        if mean is None:  # a histogram: its weighted mean
            bins = tokens.histogram
            mean = sum(b.tokens * b.weight for b in bins) / sum(b.weight for b in bins)
        self.prompts.append(mean)
        return super().__call__(spec, **kwargs)


def replanned(replicas: int, running_usd: float = 13.96) -> control.Decision:
    """The loop's decision to plan again with ``SERVED`` at 6.5 req/s, where the running
    shape would cost ``running_usd`` and the load needs both its pods."""
    state = control.initial_state(replicas, 64)
    replan = control.WorkloadReplan(SERVED, 6.5, running_usd, running_pods=2)
    return control.Decision(
        replicas, 64, f"hold {replicas}; the served prompts", (), state, MetricState.OK,
        replicas, replicas, 64, cause=control.Cause.WORKLOAD, replan_workload=replan,
        speculation_why="the served prompts differ",
    )  # fmt: skip


def deployed_then_tp2(rt: Runtime, kube: FakeKube) -> LengthsPlanner:
    """The target deployed as declared (2 TP1 pods, $13.96/h), with a planner that
    answers one TP2 pod at $6.98/h from then on."""
    planner = LengthsPlanner(make_plan())
    rt.plan = planner
    body = target_body("chat", SPEC)
    kube.add(body)
    assert reconcile(rt, body) == "success"
    planner.result = FakeResult(True, make_plan(tp=2, replicas=1, usd_per_hour=6.98))
    return planner


def latest(kube: FakeKube) -> dict[str, Any]:
    found = kube.get_target(NS, "chat")
    assert found is not None
    return found


def test_the_loop_replans_with_the_served_lengths_and_a_restart_keeps_them(
    rt: Runtime, kube: FakeKube, events: Events
) -> None:
    """Declared 512-token prompts deploy 2 TP1 pods ($13.96/h); prompts served at 4,100
    tokens plan one TP2 pod at the loop's 6.5 req/s for $6.98/h, half: it rolls out at 2
    pods, as the load needs both old ones (at one, the rollout would leave one old pod
    with the whole load while the new one starts), status.plan keeps the lengths, a
    restart plans with them again and an edit starts from the spec."""
    planner = deployed_then_tp2(rt, kube)
    assert not loop.replan(rt, latest(kube), replanned(2)), "another engine runs"
    assert planner.prompts[0] == 512 and abs(planner.prompts[1] - 4100) < 41
    assert planner.calls[-1]["requests_per_second"] == 6.5
    assert events.reasons[-2:] == ["Replanned", "PlanChanged"]
    stored = latest(kube)["status"]["plan"]
    assert (stored["tp"], stored["replicas"]) == (2, 2)
    assert stored["measuredWorkload"]["promptTokens"]["mean"] == 4100
    deployment = kube.get("apps/v1", "Deployment", NS, "chat-engine")
    assert deployment is not None and deployment["spec"]["replicas"] == 2
    reconcile(rt, latest(kube))  # an operator restart
    assert abs(planner.prompts[-1] - 4100) < 41
    assert latest(kube)["status"]["plan"]["measuredWorkload"]["promptTokens"]["mean"] == 4100
    edited = latest(kube)
    edited["metadata"]["generation"] = 2
    reconcile(rt, edited)
    assert planner.prompts[-1] == 512


def test_a_new_shape_that_does_not_pay_keeps_the_running_plan_with_the_lengths(
    rt: Runtime, kube: FakeKube, events: Events
) -> None:
    """The TP2 pod at $6.98/h against a running shape the planner puts at $9/h at the
    loop's rate saves 22 %, less than a reshape must: the TP1 pods stay, and status.plan
    keeps the lengths, so neither the loop nor a restart asks again."""
    deployed_then_tp2(rt, kube)
    assert loop.replan(rt, latest(kube), replanned(2, running_usd=9.0)), "the engine is kept"
    stored = latest(kube)["status"]["plan"]
    assert (stored["tp"], stored["replicas"]) == (1, 2)
    assert stored["measuredWorkload"]["promptTokens"]["mean"] == 4100
    assert "PlanChanged" not in events.reasons
    (why,) = [m for _, reason, m in events.items if reason == "PlanKept"]
    assert "(TP2)" in why and "6.50 req/s, 22% under the $9.00/h" in why
    assert "must save 30%; the running plan is kept" in why
    deployment = kube.get("apps/v1", "Deployment", NS, "chat-engine")
    assert deployment is not None and deployment["spec"]["replicas"] == 2


def test_a_new_shapes_first_pods_stay_within_the_budget_and_limits() -> None:
    spec = ServingTargetSpec.model_validate({**SPEC, "budget": {"usdPerHour": 20}})
    new = make_plan(tp=2, replicas=1, usd_per_hour=7.0)
    price = ReplicaPrice.flat(7.0)
    kept = transition_pods(new, 7, price, spec, None)
    assert (kept.replicas, kept.usd_per_hour) == (2, 14.0), "$20/h holds 2 pods at $7/h"
    roomy = spec.model_copy(update={"budget": spec.budget.model_copy(update={"usd_per_hour": 100})})
    assert transition_pods(new, 7, price, roomy, None).replicas == 7
    limited = roomy.model_copy(
        update={"constraints": roomy.constraints.model_copy(update={"max_replicas": 4})}
    )
    assert transition_pods(new, 7, price, limited, None).replicas == 4
    assert transition_pods(replace(new, replicas=9), 7, price, roomy, None).replicas == 9


def test_a_replan_onto_the_running_shape_keeps_the_engine_and_says_so(
    rt: Runtime, kube: FakeKube, events: Events
) -> None:
    """The served lengths plan the shape that runs: no rollout, the loop keeps its scale
    and is told the engine was kept (it gives back the cap cooldown the ask started)."""
    planner = deployed_then_tp2(rt, kube)
    planner.result = FakeResult(True, make_plan(replicas=5))
    assert loop.replan(rt, latest(kube), replanned(2))
    assert events.reasons[-2:] == ["Replanned", "PlanKept"]
    assert "still the cheapest that meets the SLO" in events.items[-1][2]
    stored = latest(kube)["status"]["plan"]
    assert (stored["tp"], stored["replicas"]) == (1, 2), "the loop's scale stays"


def test_a_replan_that_differs_only_in_the_loops_drafts_keeps_the_engine(
    rt: Runtime, kube: FakeKube, events: Events
) -> None:
    """A speculating target runs the drafts its loop chose (one fewer than planned); the
    served lengths plan the same engine at half the price with the declared drafts. The
    operator puts the loop's drafts back (``keep_loop_scale``), so the engine that runs
    is the one that ran: the re-plan reports it kept, and the loop gets its cooldown
    back, where judging the plan before the drafts went back said a new engine ran."""
    doc = yaml.safe_load(SPECULATIVE.read_text())["spec"]
    declared = plan_target(parse_spec(doc)).plan
    assert declared is not None and declared.speculative_config, "the example speculates"
    drafts = json.loads(declared.speculative_config)
    drafts["num_speculative_tokens"] -= 1
    running = replace(declared, speculative_config=json.dumps(drafts))
    rt.plan = FakePlanner(FakeResult(True, running))
    kube.add(target_body("chat", doc))
    assert reconcile(rt, latest(kube)) == "success"
    cheaper = replace(declared, usd_per_hour=declared.usd_per_hour / 2)
    rt.plan = FakePlanner(FakeResult(True, cheaper))
    decision = replanned(declared.replicas, running_usd=declared.usd_per_hour)
    assert loop.replan(rt, latest(kube), decision), "the engine that ran runs on"
    assert events.reasons[-2:] == ["Replanned", "PlanKept"]
    stored = Plan.from_status(latest(kube)["status"]["plan"])
    assert json.loads(stored.speculative_config) == drafts

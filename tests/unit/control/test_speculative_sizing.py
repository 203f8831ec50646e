"""The loop on a speculating engine: its step-time factor compares whole steps (drafts
and drafter included), and it sizes replicas with the acceptance it measures."""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path

import pytest
import yaml

from rooftop_api.spec import ServingTargetSpec
from rooftop_control import traffic
from rooftop_control.sizing import PlanTargetPlanner
from rooftop_planner import speculative
from rooftop_planner.search import plan_target

EXAMPLE = Path(__file__).resolve().parents[3] / "examples" / "speculative-70b.yaml"
SPEC = ServingTargetSpec.model_validate(yaml.safe_load(EXAMPLE.read_text())["spec"])


@pytest.fixture(scope="module")
def planner() -> PlanTargetPlanner:
    plan = plan_target(SPEC).plan
    assert plan is not None and plan.speculative_config, "the example speculates"
    return PlanTargetPlanner(SPEC, plan)


def test_a_speculating_engines_step_is_predicted_with_its_drafts(
    planner: PlanTargetPlanner,
) -> None:
    """vLLM's inter-token latency times whole steps: at batch 8 the schedule drafts,
    so the predicted step is the plain one times the verified step's ratio."""
    plain = PlanTargetPlanner(SPEC, replace(planner.plan, speculative_config=""))
    k = speculative.draft_length(planner.plan.speculative_config, 8)
    assert k >= 1 and planner.speculation is not None
    ratio = speculative.step_ratio(planner.deployment, planner.speculation, 8, 1277.0, k)
    assert ratio > 1.1
    assert planner.step_ms(8, 1147, 260) == pytest.approx(plain.step_ms(8, 1147, 260) * ratio)


def test_a_lower_measured_acceptance_sizes_more_replicas(planner: PlanTargetPlanner) -> None:
    """At 12 req/s the replicas the loop asks for follow the acceptance it measured:
    fewer tokens per verified step, more replicas; and the running drafter stays."""
    declared = replace(traffic.declared(SPEC.workload), observed=True)
    low = planner.size(12.0, 1.0, traffic=replace(declared, acceptance=0.4))
    high = planner.size(12.0, 1.0, traffic=replace(declared, acceptance=0.9))
    assert low.feasible and high.feasible
    assert low.replicas > high.replicas

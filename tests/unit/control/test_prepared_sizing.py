"""The loop's sizing reuses a search prepared once per factor and traffic
(``PreparedSearch``): at every rate it gives exactly what a full search at that rate
gives, and a new rate at a known factor and traffic computes no step-time curves."""

from __future__ import annotations

from dataclasses import replace
from typing import Any

import pytest

from rooftop_api.spec import ServingTargetSpec
from rooftop_control import sizing
from rooftop_control.sizing import PlanTargetPlanner, Sizing
from rooftop_control.traffic import Bursts, Lengths, PrefixHits, Traffic, fitted_prefix
from rooftop_planner import search
from rooftop_planner.bursts import burst_rate
from rooftop_planner.plan import Plan
from rooftop_planner.search import plan_target, prepare_search

CHAT = ServingTargetSpec.model_validate(
    {
        "model": "llama-3.1-8b",
        "slo": {"tpotMs": 40, "tpotPercentile": "p90", "ttftMs": 1500},
        "workload": {
            "requestsPerSecond": 3.0,
            "promptTokens": {"mean": 1100, "p90": 2200},
            "outputTokens": {"mean": 250, "p90": 430},
            "arrivalDispersion": 4.0,
            "prefix": {"sharedTokens": 300, "sessionShare": 0.4},
        },
        "budget": {"usdPerHour": 200},
        "constraints": {"gpuTypes": ["l4", "a100-80gb"], "maxReplicas": 40},
    }
)
SERVED = Traffic(
    prompt=Lengths(mean=1480.0, quantiles=(400.0, 1300.0, 2600.0, 4100.0)),
    output=Lengths(mean=190.0, quantiles=(60.0, 170.0, 330.0, 520.0)),
    observed=True,
    hits=PrefixHits(ratio=0.35, replicas=2),
    stated=CHAT.workload.prefix,
    bursts=Bursts(6.0, 2.5),
)
RATES = (0.2, 1.0, 3.7, 12.0, 31.0)


def _plans(result_plans: list[Plan], exact: bool = False) -> list[object]:
    if exact:
        return list(result_plans)
    return [
        (p.gpu, p.tp, p.kv_dtype, p.max_num_seqs, p.replicas, p.session_affinity,
         round(p.tpot_ms, 9), round(p.ttft_ms, 9), round(p.capacity_rps, 9))
        for p in result_plans
    ]  # fmt: skip


@pytest.mark.parametrize("factor", [0.8, 1.0, 1.6])
def test_a_prepared_search_plans_what_a_full_search_plans_at_every_rate(factor: float) -> None:
    prepared = prepare_search(CHAT, step_time_scale=factor)
    for rate in RATES:
        full = plan_target(CHAT, step_time_scale=factor, requests_per_second=rate)
        assert _plans(prepared.plans(rate)) == _plans(full.candidates), rate


@pytest.mark.parametrize("factor", [0.7, 1.0, 1.37, 2.5])
def test_a_search_rescaled_to_a_factor_plans_as_one_prepared_at_it(factor: float) -> None:
    """Reused kernel sums give the same plans, to the last bit, as a fresh preparation
    (the floor binds at some factors and not at others)."""
    rescaled = prepare_search(CHAT, step_time_scale=1.13).rescaled(factor)
    fresh = prepare_search(CHAT, step_time_scale=factor)
    for rate in RATES:
        assert _plans(rescaled.plans(rate), exact=True) == _plans(fresh.plans(rate), exact=True)


def test_bursts_are_sized_at_the_burst_rate_given() -> None:
    """Capacity is held for the spec's bursts at the spec's rate unless a burst rate is
    given, as ``plan_target`` holds it for the spec's ``requestsPerSecond``."""
    prepared = prepare_search(CHAT)
    at_spec_rate = CHAT.model_copy(
        update={"workload": CHAT.workload.model_copy(update={"requests_per_second": 9.0})}
    )
    full = plan_target(at_spec_rate, requests_per_second=1.0)
    burst = burst_rate(9.0, 4.0, CHAT.slo.burst_aim)
    assert _plans(prepared.plans(1.0, burst_rps=burst)) == _plans(full.candidates)
    assert _plans(prepared.plans(1.0)) != _plans(full.candidates)


def test_a_workload_too_long_for_the_model_has_no_plan_at_any_rate() -> None:
    doc = CHAT.model_dump(by_alias=True, exclude_none=True)
    doc["workload"]["promptTokens"] = {"mean": 200_000, "p90": 400_000}
    spec = ServingTargetSpec.model_validate(doc)
    assert prepare_search(spec).plans(1.0) == []
    assert plan_target(spec, requests_per_second=1.0).candidates == []


def _running() -> PlanTargetPlanner:
    plan = plan_target(CHAT).plan
    assert plan is not None
    return PlanTargetPlanner(CHAT, plan)


def _full_search_sizings(
    planner: PlanTargetPlanner, rate: float, factor: float, traffic: Traffic
) -> set[Sizing]:
    """What the loop sized with a full search per rate: the served workload at this rate
    (the bursts at their reference rate), on the running shape and routing."""
    plan = planner.plan
    prefix = fitted_prefix(planner.spec.workload.prefix, traffic, bool(plan.session_affinity))
    spec = planner.spec.model_copy(update={"workload": traffic.workload(rate, prefix)})
    res = plan_target(spec, step_time_scale=factor, requests_per_second=rate)
    return {sizing._sizing(p) for p in res.candidates if _running_shape(p) == _running_shape(plan)}


def _running_shape(plan: Plan) -> tuple[int, str, int]:
    """What the loop keeps of the running plan: TP, routing and prefill chunk."""
    return (plan.tp, plan.session_affinity, plan.max_num_batched_tokens)


@pytest.mark.parametrize("traffic", [None, SERVED, SERVED.trimmed(1.3)])
def test_the_loop_sizes_as_a_full_search_at_that_rate(traffic: Traffic | None) -> None:
    planner = _running()
    for rate in RATES:
        factor = 1.2
        key_rate = sizing.quantize_rate(rate)
        lengths = traffic.rounded(sizing.LENGTH_GRID) if traffic is not None else None
        got = set(planner._options(key_rate, factor, lengths))
        if lengths is None:
            full = plan_target(planner.spec, step_time_scale=factor, requests_per_second=key_rate)
            plan = planner.plan
            want = {
                sizing._sizing(p)
                for p in full.candidates
                if _running_shape(p) == _running_shape(plan)
            }
        else:
            want = _full_search_sizings(planner, key_rate, factor, lengths)
        assert got == want, rate


def counted(into: list[int], real: Any) -> Any:
    """``real``, appending to ``into`` at each call."""

    def call(*args: Any, **kwargs: Any) -> Any:
        into.append(1)
        return real(*args, **kwargs)

    return call


def test_a_new_rate_at_a_known_factor_and_traffic_computes_no_curves(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    planner = _running()
    planner.size(2.0, 1.1, traffic=SERVED)
    kernel_sums: list[int] = []
    curves: list[int] = []
    monkeypatch.setattr(search, "_raw_curves", counted(kernel_sums, search._raw_curves))
    monkeypatch.setattr(search, "_curves", counted(curves, search._curves))
    for rate in (2.3, 2.9, 4.4, 0.7):
        planner.size(rate, 1.1, traffic=SERVED)
    for bursts in (Bursts(9.0, 2.5), Bursts(2.0, 4.0), None):  # bursts: no new curves
        planner.size(2.3, 1.1, traffic=replace(SERVED, bursts=bursts))
    assert kernel_sums == [] and curves == []
    planner.size(2.3, 1.3, traffic=SERVED)  # a new factor: new steps, the same kernel sums
    assert kernel_sums == [] and curves == [1]
    longer = replace(SERVED, prompt=replace(SERVED.prompt, mean=2200.0))
    planner.size(2.3, 1.3, traffic=longer)  # new lengths: new kernel sums
    assert kernel_sums == [1] and curves == [1, 1]


def test_lengths_drifting_within_a_grid_step_keep_their_curves(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The served lengths are a dozen figures drifting within their noise, and one of
    them crosses a grid line on most ticks: the curves are computed again only when a
    figure moves more than a grid step from the lengths they were computed for."""
    planner = _running()
    planner.size(2.0, 1.1, traffic=SERVED)
    planned = SERVED.rounded(sizing.LENGTH_GRID).prompt.mean
    drift = [planned * (1 + d) for d in (0.045, -0.02, 0.03, -0.045, 0.0)]
    lengths = [replace(SERVED.prompt, mean=m) for m in drift]
    assert len({x.rounded(sizing.LENGTH_GRID) for x in lengths}) >= 3  # across grid lines
    kernel_sums: list[int] = []
    monkeypatch.setattr(search, "_raw_curves", counted(kernel_sums, search._raw_curves))
    for prompt in lengths:
        planner.size(2.0, 1.1, traffic=replace(SERVED, prompt=prompt))
    assert kernel_sums == []
    moved = replace(SERVED.prompt, mean=planned * 1.08)
    planner.size(2.0, 1.1, traffic=replace(SERVED, prompt=moved))
    assert kernel_sums == [1]
    assert planner.size(2.0, 1.1, traffic=replace(SERVED, prompt=lengths[0])).feasible
    assert kernel_sums == [1]  # the earlier lengths' curves are still kept


def test_the_loop_computes_curves_for_the_running_tensor_parallel_degree_only() -> None:
    """Plans at other degrees would need new nodes, which the loop never asks for."""
    plan = plan_target(CHAT).plan
    assert plan is not None
    planner = PlanTargetPlanner(CHAT, replace(plan, tp=4))
    prepared = planner._search(1.0, SERVED)
    shapes = [item.shape.dep.tp for item in prepared.items if isinstance(item, search._Pending)]
    assert shapes == [4]

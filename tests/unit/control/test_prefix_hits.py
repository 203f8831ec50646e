"""The loop plans with the prefix cache's observed hits: vLLM's hit counters over the
served range refit the prompt reuse the planner sizes with, at the replicas they were
read on."""

from __future__ import annotations

import math
from dataclasses import replace
from statistics import NormalDist
from typing import Any

import pytest

from rooftop_api.spec import PrefixReuse, ServingTargetSpec
from rooftop_control import traffic
from rooftop_control.readings import MetricState, Observation, Reading
from rooftop_control.sizing import PlanTargetPlanner
from rooftop_control.traffic import Lengths, PrefixHits, Traffic
from rooftop_planner.search import plan_target

Z = NormalDist()


def lognormal(median: float, sigma: float) -> Lengths:
    knots = tuple(median * math.exp(sigma * Z.inv_cdf(q)) for q in traffic.QUANTILES)
    return Lengths(mean=median * math.exp(sigma**2 / 2), quantiles=knots)


PROMPT, OUTPUT = lognormal(9000.0, 0.6), lognormal(300.0, 0.6)


def ok(value: float) -> Reading:
    return Reading(value, MetricState.OK)


def observed(hit_ratio: Reading, ready: int) -> Observation:
    figures: dict[str, Any] = {"served_requests": ok(1000), "ready_replicas": ready}
    for name, lengths in (("prompt", PROMPT), ("output", OUTPUT)):
        figures[f"served_{name}_tokens"] = ok(lengths.mean)
        for q, value in zip((10, 50, 90, 99), lengths.quantiles, strict=True):
            figures[f"served_{name}_tokens_p{q}"] = ok(value)
    return Observation(served_prefix_hit_ratio=hit_ratio, **figures)


def spec(prefix: dict[str, Any] | None = None) -> ServingTargetSpec:
    workload: dict[str, Any] = {
        "requestsPerSecond": 12,
        "promptTokens": {"mean": 9000},
        "outputTokens": {"mean": 300},
    }
    if prefix is not None:
        workload["prefix"] = prefix
    return ServingTargetSpec.model_validate(
        {
            "model": "llama-3.1-8b",
            "slo": {"tpotMs": 40, "ttftMs": 2000},
            "workload": workload,
            "budget": {"usdPerHour": 500},
            "constraints": {"gpuTypes": ["h100-sxm"], "maxTensorParallel": 1, "maxReplicas": 64},
        }
    )


def test_the_hit_ratio_is_read_with_the_replicas_it_was_seen_on() -> None:
    seen = traffic.served_traffic(observed(ok(0.413), ready=3))
    assert seen is not None and seen.hits == PrefixHits(pytest.approx(0.42), 3)  # type: ignore[arg-type]
    missing = traffic.served_traffic(observed(Reading(), ready=3))
    assert missing is not None and missing.hits is None


def test_unstated_reuse_is_read_as_session_reuse_that_thins_out_with_replicas() -> None:
    """No spec.workload.prefix, yet vLLM hit 30 % on 2 replicas: the reading that
    predicts the fewest hits on more replicas is all of it session reuse (f = 0.6)."""
    seen = Traffic(PROMPT, OUTPUT, observed=True, hits=PrefixHits(0.3, 2))
    prefix = traffic.fitted_prefix(None, seen, affinity=False)
    assert prefix is not None and prefix.shared_tokens == 0
    assert prefix.session_share == pytest.approx(0.6, abs=0.01)


def test_stated_shared_tokens_are_kept_and_the_session_share_refitted() -> None:
    stated = PrefixReuse(shared_tokens=1024, session_share=0.9)
    seen = Traffic(PROMPT, OUTPUT, observed=True, hits=PrefixHits(0.2, 4))
    prefix = traffic.fitted_prefix(stated, seen, affinity=False)
    assert prefix is not None and prefix.shared_tokens == 1024
    assert 0.0 < prefix.session_share < 0.9
    assert traffic.fitted_prefix(stated, replace(seen, hits=None), affinity=False) == stated


def test_observed_hits_let_the_loop_size_fewer_replicas() -> None:
    """Today's loop sizes as if every prompt token were prefilled: on the same served
    lengths and rate, the hits vLLM reports must lower the replicas it asks for."""
    target = spec()
    plan = plan_target(target).plan
    assert plan is not None
    planner = PlanTargetPlanner(target, plan)
    blind = Traffic(PROMPT, OUTPUT, observed=True)
    hits = replace(blind, hits=PrefixHits(0.5, plan.replicas))
    assert (
        planner.size(12.0, 1.0, traffic=hits).replicas
        < planner.size(12.0, 1.0, traffic=blind).replicas
    )


def test_the_loop_sizes_with_the_services_affinity_as_deployed() -> None:
    """The Service's affinity is part of the running shape: a fleet deployed without it
    is sized with random spreading, one with it with every session on its replica."""
    target = spec({"sessionShare": 0.6, "clientIPSessions": True})
    result = plan_target(target)
    pinned = result.plan
    assert pinned is not None and pinned.session_affinity == "ClientIP"
    spread = next(p for p in result.candidates if not p.session_affinity and p.tp == pinned.tp)
    rate = target.workload.requests_per_second
    assert (
        PlanTargetPlanner(target, spread).size(rate, 1.0).replicas
        > PlanTargetPlanner(target, pinned).size(rate, 1.0).replicas
    )


def test_hits_the_spec_does_not_state_are_named_with_the_fields_to_set() -> None:
    prior = traffic.declared(spec().workload)
    seen = Traffic(PROMPT, OUTPUT, observed=True, hits=PrefixHits(0.34, 2))
    (line,) = [d for d in traffic.differences(seen, prior) if "prefix" in d]
    assert "hits 34% of prompt tokens" in line and "sessionShare" in line
    quiet = replace(seen, hits=PrefixHits(0.04, 2))
    assert not [d for d in traffic.differences(quiet, prior) if "prefix" in d]


def test_stated_reuse_the_cache_does_not_bear_out_is_named() -> None:
    """A stated 6,000-token system prompt predicts most of a 9k prompt hits; 5 % did."""
    prior = traffic.declared(spec({"sharedTokens": 6000}).workload)
    seen = Traffic(PROMPT, OUTPUT, observed=True, hits=PrefixHits(0.05, 3))
    (line,) = [d for d in traffic.differences(seen, prior) if "prefix" in d]
    assert "but vLLM's cache hits 5%" in line and "sharedTokens" in line

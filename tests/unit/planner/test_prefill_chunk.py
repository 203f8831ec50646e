"""The prefill chunk (vLLM --max-num-batched-tokens) as a planned choice: searched where
the target lists chunks (``spec.constraints.prefillChunkTokens``), chosen only where it
is cheaper, said in the plan's words, stored in status and kept by the loop."""

from __future__ import annotations

import copy
from dataclasses import replace
from typing import Any

import pytest
from pydantic import ValidationError

from rooftop_api.spec import ServingTargetSpec
from rooftop_control.sizing import PlanTargetPlanner
from rooftop_planner.choice import rank
from rooftop_planner.plan import Plan
from rooftop_planner.search import plan_target

# Llama-3.1-8B answering briefly from long prompts (extraction) with a p99 TPOT SLO on
# H100s: at 8,192-token chunks the planner needs TP8; at 2,048-token chunks, TP4.
EXTRACTION: dict[str, Any] = {
    "model": "meta-llama/Llama-3.1-8B-Instruct",
    "slo": {"tpotMs": 25, "tpotPercentile": "p99"},
    "workload": {
        "requestsPerSecond": 2,
        "promptTokens": {"mean": 4000, "p90": 12000},
        "outputTokens": {"mean": 40, "p90": 100},
    },
    "budget": {"usdPerHour": 500},
    "constraints": {"gpuTypes": ["h100-sxm"], "maxReplicas": 64},
}


def spec(**constraints: Any) -> ServingTargetSpec:
    raw = copy.deepcopy(EXTRACTION)
    raw["constraints"].update(constraints)
    return ServingTargetSpec.model_validate(raw)


def test_without_a_list_every_plan_prefills_in_8192_token_chunks() -> None:
    result = plan_target(spec())
    assert result.candidates
    assert {p.max_num_batched_tokens for p in result.candidates} == {8192}


def test_a_listed_smaller_chunk_is_chosen_where_it_is_cheaper_and_says_so() -> None:
    default = plan_target(spec()).plan
    result = plan_target(spec(prefillChunkTokens=[2048, 8192]))
    plan = result.plan
    assert default is not None and plan is not None
    assert plan.max_num_batched_tokens == 2048
    assert plan.usd_per_hour < default.usd_per_hour
    # its TTFT pays: the long prompt's own prefill takes more full steps
    assert plan.ttft_ms > default.ttft_ms
    assert "prefill chunks of 2048" in plan.summary
    assert f"the cheapest plan is {default.summary.split(':')[0]}" in plan.summary


def test_a_shape_is_rejected_once_for_its_largest_listed_chunk() -> None:
    def said(s: ServingTargetSpec) -> list[tuple[str, int, str, str, str, str]]:
        rejections = plan_target(s).rejections
        return [(r.gpu, r.tp, r.weight_dtype, r.kv_dtype, r.category, r.detail) for r in rejections]

    assert said(spec(prefillChunkTokens=[2048, 4096, 8192])) == said(spec())


def test_at_equal_cost_the_larger_chunk_wins() -> None:
    plan = plan_target(spec()).plan
    assert plan is not None
    smaller = replace(plan, max_num_batched_tokens=2048, tpot_ms=plan.tpot_ms - 1.0)
    assert min([smaller, plan], key=rank) is plan


def test_the_chunk_survives_status_and_an_older_status_reads_as_8192() -> None:
    plan = plan_target(spec(prefillChunkTokens=[2048])).plan
    assert plan is not None and plan.max_num_batched_tokens == 2048
    stored = plan.to_status().model_dump(by_alias=True, exclude_none=True)
    assert Plan.from_status(stored).max_num_batched_tokens == 2048
    del stored["maxNumBatchedTokens"]
    assert Plan.from_status(stored).max_num_batched_tokens == 8192


def test_the_loop_sizes_the_running_chunk_only() -> None:
    """A chunk change is a rollout of every pod: the loop rescales, the planner re-plans."""
    target = spec(prefillChunkTokens=[2048, 8192])
    plan = plan_target(target).plan
    assert plan is not None and plan.max_num_batched_tokens == 2048
    loop = PlanTargetPlanner(target, plan)
    assert loop._search(1.0, None).ctx.chunks == (2048,)
    sizing = loop.size(2.0, 1.0)
    assert sizing.feasible and sizing.replicas == plan.replicas


@pytest.mark.parametrize("chunks", [[256], [70000], [2048] * 9])
def test_chunks_vllm_or_the_search_cannot_take_are_refused(chunks: list[int]) -> None:
    with pytest.raises(ValidationError, match="prefillChunkTokens"):
        spec(prefillChunkTokens=chunks)

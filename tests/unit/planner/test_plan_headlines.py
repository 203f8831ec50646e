"""The planner's first line names the real cause; its choices hold no needless surprise.

Planner-level companions of tests/unit/cli/test_plan_cli_causes.py: headlines for each
kind of infeasibility, the tie rule on quantization, the folding of KV-only variants, and
the words for a cluster without GPU nodes.
"""

from __future__ import annotations

from dataclasses import replace
from typing import Any

from rooftop_api.spec import ServingTargetSpec
from rooftop_planner.catalog import load_catalog
from rooftop_planner.choice import fold_kv, rank
from rooftop_planner.inventory import GpuInventory, inventory_from_nodes
from rooftop_planner.plan import Plan
from rooftop_planner.search import plan_target


def spec(**overrides: Any) -> ServingTargetSpec:
    base: dict[str, Any] = {
        "model": "llama-3.1-8b",
        "slo": {"tpotMs": 30},
        "workload": {
            "requestsPerSecond": 2,
            "promptTokens": {"mean": 1000, "p90": 2000},
            "outputTokens": {"mean": 200, "p90": 400},
        },
        "budget": {"usdPerHour": 100},
    }
    return ServingTargetSpec.model_validate({**base, **overrides})


def plan(kv: str, weights: str = "bf16", usd: float = 2.0, tpot: float = 10.0) -> Plan:
    return Plan(gpu="l4", tp=1, replicas=1, max_num_seqs=8, weight_dtype=weights, kv_dtype=kv,
                max_model_len=4096, gpu_memory_utilization=0.9, tpot_ms=tpot, ttft_ms=50.0,
                output_tok_s=100.0, usd_per_hour=usd)  # fmt: skip


# ---------------------------------------------------------------- headlines


def test_a_histogram_of_prompts_beyond_the_context_is_the_headline() -> None:
    prompts = {"histogram": [{"tokens": 1000, "weight": 1}, {"tokens": 200_000, "weight": 9}]}
    workload = {"requestsPerSecond": 1, "promptTokens": prompts, "outputTokens": {"mean": 10}}
    result = plan_target(spec(workload=workload))
    assert not result.feasible and result.rejections == []
    assert result.reasons == [
        "prompts at the 90th percentile of the workload's lengths (200,000 tokens) exceed "
        "llama-3.1-8b's 131,072-token context; vLLM refuses such requests, so no GPU serves "
        "this workload: serve a model with a longer context, or shorten them"
    ]


def test_prompts_within_the_context_plan_as_before() -> None:
    workload = {"requestsPerSecond": 0.1, "promptTokens": {"mean": 100_000},
                "outputTokens": {"mean": 1000}}  # fmt: skip
    assert plan_target(spec(workload=workload, slo={"tpotMs": 500})).feasible


def test_nothing_fits_names_the_widest_shape_tried_and_the_fix() -> None:
    constraints = {"gpuTypes": ["l4"], "maxTensorParallel": 2}
    result = plan_target(spec(model="llama-3.1-405b", constraints=constraints))
    first = result.reasons[0]
    assert first.startswith("no candidate can run: all ")
    assert "rejected as does not fit, e.g. l4 TP2 bf16/KV" in first
    assert first.endswith("quantized weights (constraints.weightDtypes)")


def test_an_engine_missing_for_some_gpus_is_not_the_cause_for_the_others() -> None:
    """kv bf16 with fp16 weights is invalid everywhere; mi300x also lacks an engine image.
    The headline is the shared dtype problem, not a list of categories."""
    constraints = {"gpuTypes": ["h100-sxm", "mi300x"], "weightDtypes": ["fp16"],
                   "kvDtypes": ["bf16"]}  # fmt: skip
    result = plan_target(spec(constraints=constraints))
    assert result.reasons[0].startswith("no candidate can run: vLLM keeps a 16-bit KV cache")


def test_only_a_missing_engine_is_the_headline_when_it_is_all_there_is() -> None:
    result = plan_target(spec(constraints={"gpuTypes": ["mi300x"]}))
    assert result.reasons[0] == (
        "no candidate can run: mi300x needs vLLM's ROCm build and no image for it is "
        "configured (chart value operator.rocmImage)"
    )


def test_on_a_cluster_without_gpu_nodes_the_cluster_leads() -> None:
    nodes = [{"metadata": {"name": f"n{i}"}, "status": {"allocatable": {"cpu": "4"}}}
             for i in range(2)]  # fmt: skip
    inventory = inventory_from_nodes(nodes, load_catalog())
    assert inventory.describe() == "no GPU nodes (2 schedulable nodes, none with a GPU resource)"
    result = plan_target(spec(), gpu_inventory=inventory)
    assert result.reasons[0].startswith("the cluster has no GPU nodes (2 schedulable nodes, ")
    assert result.beyond_inventory is not None


def test_when_no_gpu_would_do_the_targets_own_problem_leads() -> None:
    constraints = {"weightDtypes": ["fp16"], "kvDtypes": ["bf16"]}
    result = plan_target(spec(constraints=constraints), gpu_inventory=GpuInventory({"l4": 1}))
    assert result.reasons[0].startswith("no candidate can run: vLLM keeps a 16-bit KV cache")
    assert "no GPU in the catalog meets this target either" in result.reasons[1]


def test_gpus_without_a_product_label_are_named() -> None:
    bare = {"metadata": {"name": "g", "labels": {}},
            "status": {"allocatable": {"nvidia.com/gpu": "8"}}}  # fmt: skip
    inventory = inventory_from_nodes([bare], load_catalog())
    assert inventory.gpus_per_node == {}
    assert "1 node(s) with allocatable nvidia.com/gpu but no GPU product label" in (
        inventory.describe()
    )


# ---------------------------------------------------------------- choices


def test_at_equal_cost_the_less_quantized_plan_ranks_first() -> None:
    exact, kv8, w8 = plan("auto", tpot=10), plan("fp8", tpot=9), plan("fp8", "fp8", tpot=6)
    assert sorted([w8, kv8, exact], key=rank) == [exact, kv8, w8]
    assert sorted([plan("auto", usd=3.0), kv8], key=rank)[0] is kv8  # cheaper still wins


def test_kv_only_variants_at_the_same_cost_fold_into_one_line() -> None:
    auto, fp8 = plan("auto"), plan("fp8", tpot=9)
    dearer = replace(plan("fp8"), replicas=2, usd_per_hour=4.0)
    folded = fold_kv([auto, fp8, dearer])
    assert folded == [(auto, ("auto", "fp8")), (dearer, ("fp8",))]


def test_the_default_plans_16_bit_weights_and_fp8_only_where_listed() -> None:
    default = plan_target(spec())
    listed = plan_target(spec(constraints={"weightDtypes": ["fp8"]}))
    assert {p.weight_dtype for p in default.candidates} == {"bf16"}
    assert listed.plan is not None and listed.plan.weight_dtype == "fp8"
    assert "weights fp8" in listed.plan.summary and "outputs differ from bf16" in (
        listed.plan.summary
    )

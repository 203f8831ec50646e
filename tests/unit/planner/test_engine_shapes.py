"""What the planner offers must be what vLLM can run: checkpoints for quantized weights,
KV dtypes vLLM stores, a context length the KV cache holds, an engine image per family."""

from __future__ import annotations

from typing import Any

import pytest

from rooftop_api.spec import ServingTargetSpec
from rooftop_planner.catalog import CatalogError, load_catalog
from rooftop_planner.plan import Plan
from rooftop_planner.result import SearchResult
from rooftop_planner.search import KV_FIT_MARGIN, plan_target
from rooftop_planner.weights import ONLINE_FP8, Weights, resolve_weights

AWQ_8B = "hugging-quants/Meta-Llama-3.1-8B-Instruct-AWQ-INT4"


def spec(**overrides: Any) -> ServingTargetSpec:
    base: dict[str, Any] = {
        "model": "llama-3.1-8b",
        "slo": {"tpotMs": 100},
        "workload": {
            "requestsPerSecond": 2,
            "promptTokens": {"mean": 1000, "p90": 2000},
            "outputTokens": {"mean": 200, "p90": 400},
        },
        "budget": {"usdPerHour": 100},
    }
    for key, value in overrides.items():
        base[key] = {**base.get(key, {}), **value} if isinstance(value, dict) else value
    return ServingTargetSpec.model_validate(base)


def only(gpu: str, weights: str, kv: str = "auto", tp: int = 8, **overrides: Any) -> SearchResult:
    constraints = {
        "gpuTypes": [gpu], "weightDtypes": [weights], "kvDtypes": [kv], "maxTensorParallel": tp
    }  # fmt: skip
    return plan_target(spec(constraints=constraints, **overrides))


def chosen(result: SearchResult) -> Plan:
    assert result.plan is not None, result.explain()
    return result.plan


def rejected(result: SearchResult, category: str) -> list[str]:
    return [r.detail for r in result.rejections if r.category == category]


# ---------------------------------------------------------------- checkpoints


@pytest.mark.parametrize("dtype", ["int8", "int4"])
def test_quantized_weights_are_planned_with_their_published_checkpoint(dtype: str) -> None:
    plan = chosen(only("h100-sxm", dtype))
    listed = load_catalog().model("llama-3.1-8b").checkpoints[dtype]
    assert plan.checkpoint == listed.repo
    assert "different weights" in plan.weights_note and listed.repo in plan.summary


def test_no_checkpoint_no_plan_and_the_reason_names_the_fix() -> None:
    # Mistral 7B lists no AWQ checkpoint: vLLM cannot make int4 weights at load time
    result = only("h100-sxm", "int4", model="mistral-7b")
    assert not result.feasible
    (why, *_) = rejected(result, "no checkpoint")
    assert "spec.engine.checkpoints.int4" in why


def test_a_checkpoint_named_in_the_spec_is_used() -> None:
    engine = {"checkpoints": {"int4": {"model": "me/mistral-awq", "format": "awq"}}}
    plan = chosen(only("h100-sxm", "int4", model="mistral-7b", engine=engine))
    assert plan.checkpoint == "me/mistral-awq"
    assert "awq int4 checkpoint" in plan.weights_note


def test_fp8_is_quantized_online_from_the_models_own_weights() -> None:
    weights = resolve_weights(spec(), load_catalog().model("llama-3.1-8b"), "fp8")
    assert weights == Weights("meta-llama/Llama-3.1-8B-Instruct", "fp8", ONLINE_FP8, weights.note)
    assert "quantized by vLLM at load" in weights.note


def test_a_published_fp8_checkpoint_wins_over_online_quantization() -> None:
    weights = resolve_weights(spec(), load_catalog().model("qwen3-32b"), "fp8")
    assert isinstance(weights, Weights)
    assert (weights.model, weights.quantization) == ("Qwen/Qwen3-32B-FP8", None)


def test_a_16_bit_checkpoint_entry_is_refused() -> None:
    with pytest.raises(ValueError, match="checkpoints.bf16: name checkpoints for fp8"):
        spec(engine={"checkpoints": {"bf16": {"model": "x/y"}}})


def test_model_volume_path_is_what_vllm_loads() -> None:
    engine = {"modelVolume": {"claimName": "models", "path": "llama-8b/"}}
    plan = chosen(only("h100-sxm", "bf16", engine=engine))
    assert plan.checkpoint == "/models/llama-8b"


@pytest.mark.parametrize("path", ["/abs/path", "a/../../etc", ".."])
def test_model_volume_path_stays_inside_the_claim(path: str) -> None:
    with pytest.raises(ValueError, match="path"):
        spec(engine={"modelVolume": {"claimName": "models", "path": path}})


# ---------------------------------------------------------------- KV dtypes


def test_bf16_kv_is_offered_only_with_bf16_weights() -> None:
    # Llama-2 ships fp16 weights: vLLM refuses --kv-cache-dtype bfloat16 for it
    result = only("h100-sxm", "fp16", kv="bf16", model="llama-2-7b")
    assert not result.feasible
    assert any("kv bf16 needs weight dtype bf16" in d for d in rejected(result, "invalid"))
    # every candidate fails for that one reason, so the headline is that reason and its fix
    assert result.reasons[0] == (
        "no candidate can run: vLLM keeps a 16-bit KV cache in the model's dtype: kv bf16 "
        "needs weight dtype bf16 (use kvDtype auto)"
    )
    assert chosen(only("h100-sxm", "bf16", kv="bf16", model="llama-2-7b")).kv_dtype == "bf16"


@pytest.mark.parametrize("kv", ["int8", "int4"])
def test_kv_dtypes_vllm_lacks_are_refused_by_the_schema(kv: str) -> None:
    """vLLM has no int8 or int4 KV cache: the spec (and the CRD generated from it) refuses
    them with the fix, rather than every candidate being rejected as invalid."""
    with pytest.raises(ValueError, match=rf"kvDtypes \[{kv}\]: vLLM has no {kv} KV cache; use"):
        only("h100-sxm", "bf16", kv=kv)


# ---------------------------------------------------------------- context length


def test_the_default_context_is_the_models_full_context_where_it_fits() -> None:
    plan = chosen(only("h100-sxm", "bf16"))
    assert plan.max_model_len == 131072
    assert "full context" in plan.context_note and "131072" in plan.summary


def test_where_the_full_context_does_not_fit_the_most_that_does_is_planned() -> None:
    # 16 GB of bf16 weights on a 24 GB L4 leave KV for far less than 128k tokens
    result = only("l4", "bf16", tp=1)
    plan = chosen(result)
    assert 4096 <= plan.max_model_len < 131072
    assert "the model allows 131072" in plan.context_note
    from rooftop_planner import perf
    from rooftop_planner.perf import EngineShape

    model, gpu = load_catalog().model("llama-3.1-8b"), load_catalog().gpu("l4")
    kv = perf.kv_capacity_tokens(EngineShape(model, gpu, plan.tp, "bf16", "auto"))
    assert plan.max_model_len <= kv * KV_FIT_MARGIN  # vLLM starts only if one fits


def test_a_context_set_in_the_spec_is_kept_or_the_shape_does_not_fit() -> None:
    plan = chosen(only("h100-sxm", "bf16", engine={"maxModelLen": 32768}))
    assert (plan.max_model_len, plan.context_note) == (32768, "spec.engine.maxModelLen")
    too_long = only("l4", "bf16", tp=1, engine={"maxModelLen": 131072})
    assert any("< spec.engine.maxModelLen 131072" in d for d in rejected(too_long, "does not fit"))


def test_a_context_beyond_the_models_is_an_error_naming_the_field() -> None:
    with pytest.raises(CatalogError, match=r"spec.engine.maxModelLen: 200000 exceeds"):
        plan_target(spec(engine={"maxModelLen": 200000}))


# ---------------------------------------------------------------- accelerator families


@pytest.mark.parametrize(("gpu", "family"), [("mi300x", "rocm"), ("tpu-v5e", "tpu")])
def test_a_family_without_an_engine_image_is_not_planned(gpu: str, family: str) -> None:
    result = only(gpu, "bf16")
    assert not result.feasible
    (why, *_) = rejected(result, "no engine")
    assert f"operator.{family}Image" in why


def test_a_family_with_an_engine_image_is_planned() -> None:
    constraints = {"gpuTypes": ["mi300x"], "weightDtypes": ["bf16"], "kvDtypes": ["auto"]}
    result = plan_target(spec(constraints=constraints), engine_families=["cuda", "rocm"])
    assert chosen(result).gpu == "mi300x"

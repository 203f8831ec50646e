"""The model's own multi-token-prediction layers (vLLM's ``mtp``) as a planned
speculative method, where its config.json has them (DeepSeek-V3)."""

from __future__ import annotations

import json
from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest

from rooftop_api.spec import ServingTargetSpec
from rooftop_planner import drafters, speculative
from rooftop_planner.catalog import load_catalog, simulated_model_problem
from rooftop_planner.efficiency import load_efficiency
from rooftop_planner.hf_config import model_from_hf_config
from rooftop_planner.perf import EngineShape
from rooftop_planner.search import plan_target

CONFIG: dict[str, Any] = json.loads(
    (Path(__file__).parent / "hf_configs" / "deepseek-v3.json").read_text()
)
CATALOG = load_catalog()


def target(tpot_ms: float, methods: list[str] | None = None) -> ServingTargetSpec:
    """DeepSeek-V3 in fp8 on H200s, 2 req/s of 1,000/300 tokens."""
    constraints: dict[str, Any] = {"gpuTypes": ["h200-sxm"], "weightDtypes": ["fp8"]}
    if methods:
        constraints["speculative"] = methods
    return ServingTargetSpec.model_validate(
        {"model": "deepseek-ai/DeepSeek-V3", "modelConfig": CONFIG,
         "slo": {"tpotMs": tpot_ms, "tpotPercentile": "p90"},
         "workload": {"requestsPerSecond": 2, "promptTokens": {"mean": 1000},
                      "outputTokens": {"mean": 300}},
         "budget": {"usdPerHour": 1000}, "constraints": constraints}
    )  # fmt: skip


def test_config_json_gives_the_mtp_layers_beside_the_model_s_own() -> None:
    model = model_from_hf_config(CONFIG)
    assert (model.num_layers, model.mtp_layers) == (61, 1)
    assert model_from_hf_config({**CONFIG, "num_nextn_predict_layers": 0}).mtp_layers == 0
    qwen_spelling = {**CONFIG, "mtp_num_hidden_layers": 2}
    del qwen_spelling["num_nextn_predict_layers"]
    assert model_from_hf_config(qwen_spelling).mtp_layers == 2


def test_the_mtp_layer_is_one_expert_layer_with_its_projection_and_head() -> None:
    """DeepSeek-V3's report counts its MTP module at 14B parameters, the embedding it
    shares included (0.9B): one MoE layer of 256 experts, its 2·hidden² projection and
    an LM head come to 12.5B here."""
    head = drafters.mtp_head(model_from_hf_config(CONFIG))
    assert head.num_layers == 1 and head.is_moe and head.is_mla and head.dense_layers == 0
    assert 12.0e9 < head.param_count < 13.5e9


def test_the_published_acceptance_is_deepseeks_and_drafts_stop_at_its_layers() -> None:
    model = model_from_hf_config(CONFIG)
    (spec,), problems = speculative.options(model, ["mtp"], None, CATALOG)
    assert not problems and spec.acceptance == 0.85
    assert "arXiv:2412.19437" in spec.acceptance_source
    assert spec.max_draft_tokens == 1  # the one layer; vLLM's reuse of it is unpublished


def test_a_model_without_mtp_layers_is_told_so() -> None:
    found, problems = speculative.options(CATALOG.model("llama-3.1-8b"), ["mtp"], 0.8, CATALOG)
    assert not found and "has no multi-token-prediction layers" in problems[0]
    plain = {**CONFIG, "num_nextn_predict_layers": 0}
    _, problems = speculative.options(model_from_hf_config(plain), ["mtp"], None, CATALOG)
    assert "num_nextn_predict_layers is 0 or absent" in problems[0]


def test_vllm_loads_the_layers_from_the_model_itself_in_its_weight_dtype() -> None:
    model = model_from_hf_config(CONFIG)
    (spec,), _ = speculative.options(model, ["mtp"], None, CATALOG)
    gpu = CATALOG.gpu("h200-sxm")
    dep = EngineShape(model, gpu, 8, "fp8", "auto", load_efficiency().lookup(gpu, "vllm"))
    planned = speculative.planned(dep, spec, 1150.0, 2.0)
    assert planned is not None
    assert json.loads(planned.config) == {"method": "mtp", "num_speculative_tokens": 1}
    fp8 = speculative.drafter_bytes_per_gpu(dep, spec)
    bf16 = speculative.drafter_bytes_per_gpu(replace(dep, weight_dtype="bf16"), spec)
    assert 0.45 < fp8 / bf16 < 0.6  # vLLM quantizes the MTP layer as the model's


def test_deepseek_v3_meets_a_tpot_only_its_mtp_layer_reaches() -> None:
    """20 ms at p90 on H200s: no plan without drafting; with the MTP layer one is.
    At 30 ms both are, the drafting one cheaper."""
    assert plan_target(target(20)).plan is None
    fast = plan_target(target(20, ["mtp"])).plan
    assert (
        fast is not None
        and fast.speculative_config == '{"method":"mtp","num_speculative_tokens":1}'
    )
    plain, drafting = plan_target(target(30)).plan, plan_target(target(30, ["mtp"])).plan
    assert plain is not None and drafting is not None
    assert drafting.usd_per_hour < plain.usd_per_hour
    assert drafters.planned_acceptance(target(30, ["mtp"]), "mtp") == 0.85


def test_the_simulated_engine_refuses_a_model_only_config_json_describes() -> None:
    problem = simulated_model_problem("deepseek-ai/DeepSeek-V3")
    assert problem is not None and "mode: vllm" in problem
    assert simulated_model_problem("llama-3.1-8b") is None


def test_mtp_names_no_drafter() -> None:
    with pytest.raises(ValueError, match="mtp drafts with the model's own layers"):
        ServingTargetSpec.model_validate(
            {**target(30, ["mtp"]).model_dump(by_alias=True, exclude_none=True),
             "engine": {"drafter": {"method": "mtp", "model": "x"}}}
        )  # fmt: skip

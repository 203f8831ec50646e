"""Contract: vLLM accepts every engine command line Rooftop can deploy from the catalog.

Every plan shape the planner can emit for a catalog model (weight dtype x KV dtype x
tensor parallelism, over the CUDA GPUs the engine image serves) is rendered with the
operator's real ``builders.vllm_args`` and handed to the real vLLM (CPU build) with a
config.json synthesized from the catalog entry, or from the quantized checkpoint the
plan loads (its ``quantization_config``). vLLM parses it and builds its model, parallel
and engine configs (tests/engine/vllm_contract.py says what that covers and what needs a
GPU). Shapes the planner itself refuses (its own ``tp_problem``, dtype and checkpoint
rules) are skipped, as the planner never emits them. The arguments do not depend on the
GPU beyond which shapes it allows, so each shape is asked once.

The refusal cases are what the builder emitted before vLLM 0.32's rules were applied:
vLLM must refuse them, which shows the harness can fail.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import pytest

from rooftop_api.spec import KvDtype, ServingTargetSpec, WeightDtype
from rooftop_operator import builders
from rooftop_operator.specs import TargetRef
from rooftop_planner.catalog import Catalog, ModelSpec, load_catalog
from rooftop_planner.lifecycle import Lifecycle
from rooftop_planner.parallelism import TP_DEGREES, tp_problem
from rooftop_planner.search import _dtype_problem, engine_problem
from rooftop_planner.weights import Weights, resolve_weights
from tests.engine.conftest import Result, RunCases

pytestmark = pytest.mark.vllm

# Hugging Face model_type and architecture per catalog family (the id's prefix).
FAMILIES = {
    "llama": ("llama", "LlamaForCausalLM"),
    "mistral": ("mistral", "MistralForCausalLM"),
    "mixtral": ("mixtral", "MixtralForCausalLM"),
    "qwen2": ("qwen2", "Qwen2ForCausalLM"),
    "qwen3": ("qwen3", "Qwen3ForCausalLM"),
}
# Checkpoints published in float16 (the rest of the catalog is bfloat16).
FP16_MODELS = ("llama-2-",)
# Each checkpoint format as its config.json declares it, and the dtype it is stored in.
QUANTIZATION_CONFIGS: dict[str, tuple[dict[str, Any], str]] = {
    "awq": ({"quant_method": "awq", "bits": 4, "group_size": 128, "zero_point": True,
             "version": "gemm"}, "float16"),
    "compressed-tensors": ({
        "quant_method": "compressed-tensors", "format": "int-quantized",
        "quantization_status": "compressed", "ignore": ["lm_head"],
        "config_groups": {"group_0": {
            "targets": ["Linear"],
            "weights": {"num_bits": 8, "type": "int", "symmetric": True,
                        "strategy": "channel", "dynamic": False},
            "input_activations": {"num_bits": 8, "type": "int", "symmetric": True,
                                  "strategy": "token", "dynamic": True},
        }},
    }, "bfloat16"),
    "modelopt_fp4": ({"quant_method": "modelopt", "quant_algo": "NVFP4", "group_size": 16,
                      "exclude_modules": ["lm_head"]}, "bfloat16"),
    "fp8": ({"quant_method": "fp8", "activation_scheme": "dynamic", "fmt": "e4m3",
             "weight_block_size": [128, 128]}, "bfloat16"),
}  # fmt: skip
REF = TargetRef(name="contract", namespace="default", uid="u-1", generation=1)
IMAGE = "vllm/vllm-openai:v0.32.0"


@dataclass(frozen=True)
class Shape:
    """A plan as the builders read it (builders.PlanLike)."""

    model: str
    weight_dtype: str
    kv_dtype: str
    tp: int
    max_model_len: int
    gpu: str = "h100-sxm"
    replicas: int = 1
    max_num_seqs: int = 256
    gpu_memory_utilization: float = 0.9
    usd_per_hour: float = 1.0
    checkpoint: str = ""
    max_num_batched_tokens: int = 8192
    speculative_config: str = ""  # test_speculative_contract: the drafters' plans

    @property
    def id(self) -> str:
        chunk = (
            "" if self.max_num_batched_tokens == 8192 else f"/chunk{self.max_num_batched_tokens}"
        )
        return f"{self.model}/{self.weight_dtype}/kv-{self.kv_dtype}/tp{self.tp}{chunk}"


def target(model: ModelSpec) -> ServingTargetSpec:
    return ServingTargetSpec.model_validate({
        "model": model.id, "slo": {"tpotMs": 50}, "budget": {"usdPerHour": 100},
        "workload": {"requestsPerSecond": 1, "promptTokens": {"mean": 100},
                     "outputTokens": {"mean": 100}},
    })  # fmt: skip


def family(model: ModelSpec) -> tuple[str, str]:
    found = [v for k, v in FAMILIES.items() if model.id.startswith(k)]
    assert found, f"{model.id}: add its Hugging Face model_type to FAMILIES"
    return found[0]


def hf_config(model: ModelSpec, weights: Weights, fmt: str) -> dict[str, Any]:
    """The config.json of the checkpoint the plan loads, from the catalog's figures."""
    model_type, architecture = family(model)
    dtype = "float16" if model.id.startswith(FP16_MODELS) else "bfloat16"
    config: dict[str, Any] = {
        "architectures": [architecture], "model_type": model_type,
        "hidden_size": model.hidden_size, "intermediate_size": model.intermediate_size,
        "num_attention_heads": model.num_heads, "num_key_value_heads": model.num_kv_heads,
        "num_hidden_layers": model.num_layers, "head_dim": model.head_dim,
        "vocab_size": model.vocab_size, "max_position_embeddings": model.max_context,
        "sliding_window": model.sliding_window, "rms_norm_eps": 1e-5, "hidden_act": "silu",
    }  # fmt: skip
    if model.is_moe:
        config |= {"num_local_experts": model.num_experts,
                   "num_experts_per_tok": model.experts_per_token}  # fmt: skip
    if fmt:  # a pre-quantized checkpoint: its own format and storage dtype
        quantization, dtype = QUANTIZATION_CONFIGS[fmt]
        config["quantization_config"] = quantization
    return config | {"torch_dtype": dtype}


def shapes(catalog: Catalog, model: ModelSpec) -> Iterator[Shape]:
    """Every (weights, KV, TP) the planner could choose for ``model`` on some CUDA GPU."""
    spec = target(model)
    for gpu in catalog.gpus.values():
        if engine_problem(gpu, {"cuda"}):
            continue  # the ROCm/TPU builds are other images
        for wd in WeightDtype:
            if isinstance(resolve_weights(spec, model, wd.value), str):
                continue  # no checkpoint in that format: the planner offers none
            for kv in KvDtype:
                if _dtype_problem(gpu, wd.value, kv.value):
                    continue
                for tp in TP_DEGREES:
                    if tp <= gpu.gpus_per_node and not tp_problem(model, tp):
                        yield Shape(model.id, wd.value, kv.value, tp, model.max_context)
    # the smallest prefill chunk a target may list (prefillChunkTokens), with the largest
    # batch cap: vLLM refuses a token budget under --max-num-seqs, and a context above it
    # without chunked prefill
    sixteen = "fp16" if model.id.startswith(FP16_MODELS) else "bf16"
    if not isinstance(resolve_weights(spec, model, sixteen), str):
        yield Shape(model.id, sixteen, "auto", 1, model.max_context, max_num_seqs=512,
                    max_num_batched_tokens=512)  # fmt: skip


# The drain flag's value does not matter to the parser; the figures are the planner's
# for a short chat request.
LIFECYCLE = Lifecycle(
    checkpoint_bytes=16e9, downloads=True, startup_s=200.0, progress_deadline_s=600,
    request_p99_s=10.0, shutdown_timeout_s=30, prestop_s=10, grace_s=85,
    ephemeral_bytes=20 * 2**30,
)  # fmt: skip


def engine_argv(catalog: Catalog, shape: Shape) -> tuple[list[str], dict[str, Any]]:
    """(``vllm serve`` arguments from the real builder, config.json of what it loads)."""
    model = catalog.model(shape.model)
    spec = target(model)
    weights = resolve_weights(spec, model, shape.weight_dtype)
    assert isinstance(weights, Weights)
    listed = model.checkpoints.get(shape.weight_dtype)
    fmt = listed.format if listed is not None and weights.model == listed.repo else ""
    inputs = builders.EngineInputs(
        ref=REF, spec=spec, plan=shape, served_model=model.hf_repo or model.id,
        node_label=("gpu", shape.gpu), image=IMAGE, weights=weights,
        lifecycle=LIFECYCLE,
    )  # fmt: skip
    argv = builders.vllm_args(inputs)
    assert argv[0] == weights.model, argv  # the model positional the contract replaces
    return argv, hf_config(model, weights, fmt)


def replaced(argv: list[str], old: str, new: list[str]) -> list[str]:
    """``argv`` with flag ``old`` and its value swapped for ``new``."""
    if old in argv:
        i = argv.index(old)
        argv = argv[:i] + argv[i + 2 :]
    return argv + new


def old_builder_cases(catalog: Catalog) -> dict[str, tuple[dict[str, Any], str, str]]:
    """id -> (case, stage, message part): what the pre-0.32 builder rendered, on the
    16-bit checkpoint it pointed every dtype at."""
    llama2 = engine_argv(catalog, Shape("llama-2-7b", "fp16", "auto", 1, 4096))
    llama3 = engine_argv(catalog, Shape("llama-3.1-8b", "bf16", "auto", 1, 131072))
    argv2, config2 = llama2
    argv3, config3 = llama3
    old = {
        "int8 as bitsandbytes": (argv2, "--quantization", ["--quantization", "bitsandbytes"],
                                 config2, "model", "Unknown quantization method: bitsandbytes"),
        # vLLM looks for the method's quantization config in the checkpoint and finds none
        "int4 as awq on 16-bit weights": (argv3, "--dtype", ["--quantization", "awq"],
                                          config3, "engine", "Cannot find the config file for awq"),
        "fp4 as modelopt_fp4 on 16-bit weights": (argv3, "--dtype",
                                                  ["--quantization", "modelopt_fp4"],
                                                  config3, "engine", "Cannot find the config file"),
        "context past the model's": (argv2, "--max-model-len", ["--max-model-len", "8192"],
                                     config2, "model", "max_model_len"),
        "TP that does not divide the heads": (argv3, "--tensor-parallel-size",
                                              ["--tensor-parallel-size", "3"], config3,
                                              "parallel", "divisible by tensor parallel"),
    }  # fmt: skip
    return {
        name: ({"id": name, "argv": replaced(argv, flag, new), "config": cfg}, stage, part)
        for name, (argv, flag, new, cfg, stage, part) in old.items()
    }


@pytest.fixture(scope="module")
def catalog() -> Catalog:
    return load_catalog()


@pytest.fixture(scope="module")
def plan_shapes(catalog: Catalog) -> list[Shape]:
    found = {s for model in catalog.models.values() for s in shapes(catalog, model)}
    return sorted(found, key=lambda s: s.id)


@pytest.fixture(scope="module")
def verdicts(catalog: Catalog, plan_shapes: list[Shape], run_cases: RunCases) -> dict[str, Result]:
    """vLLM's verdict on every plan shape and every old-builder case: one vLLM process."""
    cases = []
    for shape in plan_shapes:
        argv, config = engine_argv(catalog, shape)
        cases.append({"id": shape.id, "argv": argv, "config": config})
    cases += [case for case, _, _ in old_builder_cases(catalog).values()]
    return run_cases(cases)


def test_every_catalog_model_and_weight_dtype_is_asked(
    catalog: Catalog, plan_shapes: list[Shape]
) -> None:
    """The enumeration cannot shrink to nothing unnoticed."""
    assert {s.model for s in plan_shapes} == set(catalog.models)
    assert {s.weight_dtype for s in plan_shapes} == {d.value for d in WeightDtype}
    assert {s.tp for s in plan_shapes} == set(TP_DEGREES)
    assert {s.max_num_batched_tokens for s in plan_shapes} == {512, 8192}


def test_vllm_accepts_every_plan_shape(
    plan_shapes: list[Shape], verdicts: dict[str, Result]
) -> None:
    refused = [
        f"{s.id}: {verdicts[s.id]['stage']}: {verdicts[s.id].get('message')}"
        for s in plan_shapes
        if verdicts[s.id]["verdict"] != "ok"
    ]
    assert not refused, f"{len(refused)} of {len(plan_shapes)} refused:\n" + "\n".join(refused)


@pytest.mark.parametrize(
    "name",
    [
        "int8 as bitsandbytes",
        "int4 as awq on 16-bit weights",
        "fp4 as modelopt_fp4 on 16-bit weights",
        "context past the model's",
        "TP that does not divide the heads",
    ],
)
def test_vllm_refuses_what_the_old_builder_emitted(
    catalog: Catalog, verdicts: dict[str, Result], name: str
) -> None:
    _, stage, part = old_builder_cases(catalog)[name]
    result = verdicts[name]
    assert result["verdict"] == "refused", result
    assert (result["stage"], part in result["message"]) == (stage, True), result

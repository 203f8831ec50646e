"""Contract: what vLLM makes of ``--speculative-config``, offline, on its CPU build.

Hand-built command lines for the speculative methods Rooftop can deploy (a smaller
model of the same family as draft, an EAGLE-3 head, n-gram lookup, suffix decoding), each with the
config.json of its target and of its draft (the case's ``drafts``, which
tests/engine/vllm_contract.py puts in temporary directories in place of the names the
``--speculative-config`` JSON gives). vLLM builds its SpeculativeConfig, with the draft's
ModelConfig, and checks the batch-size schedule as its scheduler does at start-up; the
harness's docstring says what that covers and what is left to the weights and the GPU.

None of these depend on the platform: the CPU build runs the same speculative checks as
CUDA's (its platform hooks do not look at speculation), so every case expects "ok" or
"refused", never "unchecked".
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from rooftop_planner import drafters, speculative
from rooftop_planner.catalog import Catalog, ModelSpec, load_catalog
from rooftop_planner.efficiency import load_efficiency
from rooftop_planner.parallelism import tp_problem
from rooftop_planner.perf import EngineShape
from rooftop_planner.weights import Weights, resolve_weights
from tests.engine.conftest import Result, RunCases
from tests.engine.test_vllm_contract import Shape, engine_argv, hf_config, target

pytestmark = pytest.mark.vllm

# --max-num-batched-tokens as the builder emits it: the CPU platform's default (2048)
# is not CUDA's.
SERVE = ["--max-model-len", "8192", "--max-num-seqs", "256", "--max-num-batched-tokens", "8192"]
SCHEDULE = [[1, 16, 3], [17, 64, 1], [65, 256, 0]]  # batch sizes 1-16: K=3, ... 65-256: 0


def llama31(hidden: int, layers: int, heads: int, intermediate: int) -> dict[str, Any]:
    """A Llama-3.1 config.json (8 KV heads, 128k context, the llama3 RoPE scaling)."""
    return {
        "architectures": ["LlamaForCausalLM"],
        "model_type": "llama",
        "hidden_size": hidden,
        "intermediate_size": intermediate,
        "num_attention_heads": heads,
        "num_key_value_heads": 8,
        "num_hidden_layers": layers,
        "head_dim": hidden // heads,
        "vocab_size": 128256,
        "max_position_embeddings": 131072,
        "rms_norm_eps": 1e-5,
        "hidden_act": "silu",
        "torch_dtype": "bfloat16",
        "rope_theta": 500000.0,
        "bos_token_id": 128000,
        "eos_token_id": 128001,
        "rope_scaling": {
            "rope_type": "llama3",
            "factor": 8.0,
            "low_freq_factor": 1.0,
            "high_freq_factor": 4.0,
            "original_max_position_embeddings": 8192,
        },
    }


LLAMA_70B = llama31(8192, 80, 64, 28672)
# DeepSeek-V3's config.json as published (the keys that shape it), one MTP layer
DEEPSEEK_V3: dict[str, Any] = json.loads(
    (Path(__file__).parents[1] / "unit" / "planner" / "hf_configs" / "deepseek-v3.json").read_text()
)
LLAMA_8B = llama31(4096, 32, 32, 14336)
DRAFT = "meta-llama/Llama-3.1-8B-Instruct"
EAGLE3 = "yuhuili/EAGLE3-LLaMA3.1-Instruct-8B"
# That head's config.json as published: one decoder layer over the target's hidden size,
# the target's vocabulary in, a 32k draft vocabulary out. vLLM needs model_type (to load
# it) and an architecture it registers (LlamaForCausalLMEagle3; a plain
# LlamaForCausalLM becomes Eagle3LlamaForCausalLM); the rest is read with the weights.
EAGLE3_HEAD = {
    "architectures": ["LlamaForCausalLMEagle3"],
    "model_type": "llama",
    "hidden_size": 4096,
    "intermediate_size": 14336,
    "num_attention_heads": 32,
    "num_key_value_heads": 8,
    "num_hidden_layers": 1,
    "vocab_size": 128256,
    "draft_vocab_size": 32000,
    "max_position_embeddings": 2048,
    "rms_norm_eps": 1e-5,
    "hidden_act": "silu",
    "initializer_range": 0.02,
    "tie_word_embeddings": False,
    "torch_dtype": "float16",
    "use_cache": True,
    "bos_token_id": 128000,
    "eos_token_id": 128001,
    "pad_token_id": 0,
    "transformers_version": "4.28.1",
}


def case(
    config: dict[str, Any],
    tp: int,
    spec: dict[str, Any],
    drafts: dict[str, dict[str, Any]] | None = None,
    joined: bool = False,
) -> dict[str, Any]:
    """A `vllm serve` case, less its id; ``joined`` writes ``--speculative-config=JSON``."""
    value = json.dumps(spec)
    flag = [f"--speculative-config={value}"] if joined else ["--speculative-config", value]
    argv = ["target", "--tensor-parallel-size", str(tp), *SERVE, *flag]
    return {"argv": argv, "config": config, "drafts": drafts or {}}


def draft_model(**spec: Any) -> dict[str, Any]:
    return {"method": "draft_model", "model": DRAFT, "num_speculative_tokens": 3} | spec


def ngram(**spec: Any) -> dict[str, Any]:
    return {"method": "ngram", "num_speculative_tokens": 3, "prompt_lookup_max": 4} | spec


# id -> (case, what vLLM must have built: a subset of the result's "speculative")
ACCEPTED: dict[str, tuple[dict[str, Any], dict[str, Any]]] = {
    "draft_model 8B for 70B at TP 4, with a schedule": (
        case(
            LLAMA_70B,
            4,
            draft_model(
                draft_tensor_parallel_size=4, num_speculative_tokens_per_batch_size=SCHEDULE
            ),
            {DRAFT: LLAMA_8B},
        ),
        {
            "method": "draft_model",
            "num_speculative_tokens": 3,
            "schedule": SCHEDULE,
            "draft_architecture": "LlamaForCausalLM",
            "draft_tensor_parallel_size": 4,
        },
    ),
    "eagle3 head for 8B at TP 1, with a schedule": (
        case(
            LLAMA_8B,
            1,
            {
                "method": "eagle3",
                "model": EAGLE3,
                "num_speculative_tokens": 5,
                "num_speculative_tokens_per_batch_size": [[1, 32, 5], [33, 128, 2], [129, 256, 1]],
            },
            {EAGLE3: EAGLE3_HEAD},
            joined=True,
        ),
        {
            "method": "eagle3",
            "num_speculative_tokens": 5,
            "schedule": [[1, 32, 5], [33, 128, 2], [129, 256, 1]],
            "draft_architecture": "LlamaForCausalLMEagle3",
            "draft_tensor_parallel_size": 1,
        },
    ),
    # no method: vLLM takes "eagle3" from the head's name
    "eagle3 head guessed from its name": (
        case(LLAMA_8B, 1, {"model": EAGLE3, "num_speculative_tokens": 5}, {EAGLE3: EAGLE3_HEAD}),
        {"method": "eagle3", "draft_architecture": "LlamaForCausalLMEagle3"},
    ),
    "ngram, window up to 4": (
        case(LLAMA_8B, 1, ngram()),
        {"method": "ngram", "num_speculative_tokens": 3, "schedule": []},
    ),
    # suffix decoding: one draft length at every batch (the planner emits no schedule
    # for it); vLLM refuses the method unless Arctic Inference is installed
    # (tests/engine/install-vllm.sh builds it into the engine's venv)
    "suffix, one draft length": (
        case(LLAMA_8B, 1, {"method": "suffix", "num_speculative_tokens": 4}),
        {"method": "suffix", "num_speculative_tokens": 4, "schedule": []},
    ),
    # what the planner emits for DeepSeek-V3 (tests/unit/planner/test_mtp.py): the
    # model's own MTP layer, from its own checkpoint
    "mtp for DeepSeek-V3 at TP 8": (
        case(DEEPSEEK_V3, 8, {"method": "mtp", "num_speculative_tokens": 1}),
        {"method": "mtp", "num_speculative_tokens": 1, "draft_architecture": "DeepSeekMTPModel"},
    ),
}

# id -> (case, parts of vLLM's message); all refused at the engine stage
REFUSED: dict[str, tuple[dict[str, Any], tuple[str, ...]]] = {
    "draft TP 2 under target TP 4": (
        case(LLAMA_70B, 4, draft_model(draft_tensor_parallel_size=2), {DRAFT: LLAMA_8B}),
        (
            "speculative_draft_tensor_parallel_size=2 cannot be other value than 1 or "
            "target model tensor_parallel_size",
        ),
    ),
    "schedule starting at batch size 2": (
        case(
            LLAMA_70B,
            4,
            draft_model(num_speculative_tokens_per_batch_size=[[2, 16, 3], [17, 256, 1]]),
            {DRAFT: LLAMA_8B},
        ),
        ("The first batch-size range must start at 1",),
    ),
    "schedule with overlapping ranges": (
        case(LLAMA_8B, 1, ngram(num_speculative_tokens_per_batch_size=[[1, 16, 3], [10, 256, 1]])),
        ("Batch-size ranges must be non-overlapping and sorted",),
    ),
    "schedule entry without its K": (
        case(LLAMA_8B, 1, ngram(num_speculative_tokens_per_batch_size=[[1, 256]])),
        ("num_speculative_tokens_per_batch_size.0.2", "Field required"),
    ),
    "zero speculative tokens": (
        case(LLAMA_8B, 1, ngram(num_speculative_tokens=0)),
        ("num_speculative_tokens", "greater than 0"),
    ),
    # the planner offers mtp only where config.json has MTP layers (test_mtp.py)
    "mtp for a model without MTP layers": (
        case(LLAMA_8B, 1, {"method": "mtp", "num_speculative_tokens": 1}),
        ("Unsupported speculative method: 'mtp'",),
    ),
    "draft with another vocabulary": (
        case(LLAMA_70B, 4, draft_model(), {DRAFT: LLAMA_8B | {"vocab_size": 32000}}),
        (
            "Target and draft model should have the same vocabulary size",
            "Draft model vocab_size=32000",
        ),
    ),
}


@pytest.fixture(scope="module")
def verdicts(run_cases: RunCases) -> dict[str, Result]:
    """vLLM's verdict on every case: one vLLM process."""
    cases = {name: c for name, (c, _) in ACCEPTED.items()}
    cases |= {name: c for name, (c, _) in REFUSED.items()}
    return run_cases([{"id": name, **c} for name, c in cases.items()])


@pytest.mark.parametrize("name", list(ACCEPTED))
def test_vllm_accepts(verdicts: dict[str, Result], name: str) -> None:
    _, expected = ACCEPTED[name]
    result = verdicts[name]
    assert result["verdict"] == "ok", result
    built = result["speculative"]
    assert {k: built.get(k) for k in expected} == expected, built


@pytest.mark.parametrize("name", list(REFUSED))
def test_vllm_refuses(verdicts: dict[str, Result], name: str) -> None:
    _, parts = REFUSED[name]
    result = verdicts[name]
    assert (result["verdict"], result["stage"]) == ("refused", "engine"), result
    missing = [part for part in parts if part not in result["message"]]
    assert not missing, result


# ---------------------------------------------------------------- the planner's drafters


def eagle3_head(model: ModelSpec, drafter: drafters.Drafter) -> dict[str, Any]:
    """An EAGLE-3 head's config.json from the catalog's figures: ``layers`` decoder
    layers of the model's width, its vocabulary in, ``draft_vocab`` out (as published)."""
    return EAGLE3_HEAD | {
        "hidden_size": model.hidden_size,
        "intermediate_size": model.intermediate_size,
        "num_attention_heads": model.num_heads,
        "num_key_value_heads": model.num_kv_heads,
        "num_hidden_layers": drafter.layers,
        "vocab_size": model.vocab_size,
        "draft_vocab_size": drafter.draft_vocab or model.vocab_size,
    }


def drafter_cases(catalog: Catalog) -> Iterator[tuple[str, dict[str, Any], list[list[int]]]]:
    """Per drafter in the catalog and weight dtype (16-bit, fp8), the command line the
    builder renders for the plan that speculates with it (the schedule the planner
    computes for an H100 at the largest TP the model allows on one node), the target's
    and the drafter's config.json: (id, case, the schedule planned)."""
    gpu = catalog.gpus["h100-sxm"]
    eff = load_efficiency().lookup(gpu, "vllm")
    for model_id, methods in drafters.packaged_drafters().items():
        model = catalog.model(model_id)
        (tp,) = [t for t in (8, 4, 2, 1) if not tp_problem(model, t)][:1]
        # prompt lookup and suffix decoding need no drafter, so every model has them
        for method, drafter in {**methods, **drafters.HOST_DRAFTERS}.items():
            # suffix: one option per draft length; the longest
            spec = speculative.options(model, [method], 0.75, catalog)[0][-1]
            for dtype in ("bf16", "fp8"):
                dep = EngineShape(model, gpu, tp, dtype, "auto", eff)
                planned = speculative.planned(dep, spec, 1500.0, 4.0)
                assert planned is not None, f"{model_id} {method}: speculation never pays"
                shape = Shape(model_id, dtype, "auto", tp, 8192, speculative_config=planned.config)
                argv, config = engine_argv(catalog, shape)
                schedule = json.loads(planned.config).get("num_speculative_tokens_per_batch_size")
                case = {"argv": argv, "config": config, "drafts": drafts(catalog, model, drafter)}
                yield f"{model_id}/{method}/{dtype}/tp{tp}", case, schedule


def drafts(
    catalog: Catalog, model: ModelSpec, drafter: drafters.Drafter
) -> dict[str, dict[str, Any]]:
    """The drafter's config.json by the name the JSON gives it (none for ngram and
    suffix)."""
    if drafter.method in drafters.HOST_METHODS:
        return {}
    if drafter.method == "eagle3":
        return {drafter.repo: eagle3_head(model, drafter)}
    target_weights = resolved(catalog, model.id)
    return {drafter.repo: hf_config(catalog.model(drafter.model), target_weights, "")}


def resolved(catalog: Catalog, model_id: str) -> Weights:
    weights = resolve_weights(target(catalog.model(model_id)), catalog.model(model_id), "bf16")
    assert isinstance(weights, Weights)
    return weights


def test_vllm_accepts_every_speculative_config_the_planner_can_deploy(
    run_cases: RunCases,
) -> None:
    """What the operator would run for each catalog drafter: vLLM builds the drafter
    (its config, tensor parallelism, vocabulary) and takes the planner's schedule as its
    scheduler would."""
    catalog = load_catalog()
    cases = list(drafter_cases(catalog))
    # ngram, suffix and one drafter each, in two dtypes
    assert len(cases) >= 6 * len(drafters.packaged_drafters())
    results = run_cases([{"id": name, **case} for name, case, _ in cases])
    for name, _, schedule in cases:
        result = results[name]
        assert result["verdict"] == "ok", (name, result["stage"], result["message"])
        if schedule is not None:
            assert result["speculative"]["schedule"] == schedule, name

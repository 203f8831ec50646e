"""Benchmark rows are predicted with the scheduler caps their engine ran with.

A published vLLM run sets no ``--max-num-seqs`` or ``--max-num-batched-tokens`` as a rule,
so it ran with vLLM's defaults, which depend on the GPU (``EngineArgs.get_batch_defaults``).
"""

from __future__ import annotations

import pytest

from rooftop_planner.catalog import load_catalog
from rooftop_planner.efficiency import load_efficiency
from rooftop_planner.scenarios import (
    ScenarioError,
    checkpoint_dtype,
    default_limits,
    normalize_engine,
    scenario_from_row,
)

CATALOG = load_catalog()


@pytest.mark.parametrize(
    ("gpu", "seqs", "tokens"),
    [
        ("h100-sxm", 1024, 8192),  # 79.6 GiB
        ("h200", 1024, 8192),  # 140 GiB: below vLLM's 160 GiB step
        ("gh200", 1024, 8192),
        ("b200", 1024, 16384),  # 179 GiB
        ("a100-80gb", 256, 2048),  # A100s keep the small defaults at any size
        ("l40s", 256, 2048),
        ("a10g", 256, 2048),
    ],
)
def test_vllm_defaults_follow_the_gpu(gpu: str, seqs: int, tokens: int) -> None:
    limits = default_limits("vllm", CATALOG.gpu(gpu), 64)
    assert (limits.max_num_seqs, limits.max_num_batched_tokens) == (seqs, tokens)


def test_other_engines_run_every_client_the_kv_cache_holds() -> None:
    assert default_limits("sglang", CATALOG.gpu("a100-80gb"), 512).max_num_seqs == 512
    assert default_limits("trtllm", CATALOG.gpu("h100-sxm"), 2000).max_num_seqs == 2000


def row(gpu: str, concurrency: int, engine: str) -> dict[str, str]:
    return {"model": "llama-3.1-70b", "gpu": gpu, "tp": "8", "weight_dtype": "bf16",
            "kv_dtype": "", "isl": "1000", "osl": "1000", "concurrency": str(concurrency),
            "batch": "", "engine": engine}  # fmt: skip


def test_512_vllm_clients_on_a100s_decode_256_at_a_time_and_the_rest_queue() -> None:
    """70B on 8 A100-80GB holds ~900 sequences of 1,500 tokens, so only vLLM's default
    cap of 256 stops 512 clients from running at once."""
    table = load_efficiency()
    vllm = scenario_from_row(row("a100-80gb", 512, "vllm"), CATALOG, table).predict()
    at_cap = scenario_from_row(row("a100-80gb", 256, "vllm"), CATALOG, table).predict()
    sglang = scenario_from_row(row("a100-80gb", 512, "sglang"), CATALOG, table).predict()
    assert vllm.tpot_s == pytest.approx(at_cap.tpot_s, rel=1e-9)
    assert vllm.ttft_s > 2 * at_cap.ttft_s  # the other 256 wait for a seat
    assert sglang.tpot_s > 1.2 * vllm.tpot_s  # runs all 512


@pytest.mark.parametrize(
    ("text", "engine"),
    [
        ("vLLM 0.8.5", "vllm"),
        ("", "vllm"),
        ("SGLang v0.4.6", "sglang"),
        ("TensorRT-LLM 0.9.0 (static batch)", "trtllm"),
        ("trtllm-serve", "trtllm"),
        ("NIM", "nim"),
        ("nvidia-nim", "nim"),
        ("NIM for LLMs 1.8 (TRT-LLM backend)", "nim"),
    ],
)
def test_engines_as_benchmarks_spell_them(text: str, engine: str) -> None:
    assert normalize_engine(text) == engine


def test_an_unknown_engine_names_the_column_and_the_choices() -> None:
    with pytest.raises(ScenarioError, match="engine: unknown engine 'lmdeploy'; use vllm"):
        normalize_engine("lmdeploy")


@pytest.mark.parametrize(
    ("model", "stated", "planned"),
    [
        ("nvidia/Llama-3.3-70B-Instruct-FP8", "", "fp8"),
        ("nvidia/Llama-3.3-70B-Instruct-FP4", "auto", "fp4"),
        ("RedHatAI/Llama-3.3-70B-Instruct-FP8-dynamic", "not stated", "fp8"),
        ("Qwen/Qwen3-32B-AWQ", "", "int4"),
        ("neuralmagic/Meta-Llama-3.1-8B-Instruct-quantized.w8a8", "", "int8"),
        ("RedHatAI/Meta-Llama-3.1-8B-Instruct-quantized.w4a16", "", "int4"),
        ("meta-llama/Llama-3.1-8B-Instruct", "", "bf16"),
        ("Mixtral-8x7B-Instruct-v0.1", "", "bf16"),  # a size or version is no format
        ("nvidia/Llama-3.1-8B-Instruct-FP8", "bf16", "bf16"),  # a stated dtype wins
    ],
)
def test_an_unstated_weight_dtype_is_the_checkpoints(model: str, stated: str, planned: str) -> None:
    """A run of ``nvidia/...-FP8`` that leaves the dtype column empty served fp8 weights
    (the engine loads the checkpoint as it is), not bf16."""
    r = {**row("h100-sxm", 8, "vllm"), "model": model, "weight_dtype": stated, "tp": "4"}
    assert scenario_from_row(r, CATALOG, load_efficiency()).deployment.weight_dtype == planned


def test_a_checkpoint_name_without_a_format_states_none() -> None:
    assert checkpoint_dtype("meta-llama/Llama-3.1-8B-Instruct") is None
    assert checkpoint_dtype("nvidia/Llama-3.1-8B-Instruct-NVFP4") == "fp4"

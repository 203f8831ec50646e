"""How much KV cache an engine keeps, and how much of it a request holds.

vLLM (and SGLang) budget a share of all GPU memory and give a running request its blocks
as its tokens come; TensorRT-LLM (and NIM on it) gives the KV cache 90 % of what the
loaded model leaves (``free_gpu_memory_fraction``) and admits a request only when its
prompt and whole answer fit (``GUARANTEED_NO_EVICT``)."""

from __future__ import annotations

import pytest

from rooftop_planner import perf
from rooftop_planner.batching import EngineLimits, running_batch
from rooftop_planner.catalog import load_catalog
from rooftop_planner.scenarios import default_limits

CATALOG = load_catalog()


def deployment(gpu: str = "a10g") -> perf.EngineShape:
    return perf.EngineShape(CATALOG.model("llama-3.1-8b"), CATALOG.gpu(gpu))


def test_tensorrt_llm_keeps_a_share_of_what_the_model_leaves() -> None:
    dep = deployment()
    loaded = perf.weight_bytes_per_gpu(dep) + perf.activation_reserve_bytes(dep, 8192)
    per_token = perf.kv_bytes_per_token_per_gpu(dep.model, dep.kv_dtype, dep.tp)
    expected = int((dep.gpu.hbm_bytes - loaded) * 0.9 / per_token)
    assert perf.kv_capacity_tokens(dep, free_memory_fraction=0.9) == expected
    # on a 24 GB card with 16 GB of weights that is more than vLLM's 90 % of everything
    assert expected > perf.kv_capacity_tokens(dep, gpu_memory_utilization=0.9)


def test_reserving_the_whole_answer_runs_fewer_requests_when_the_cache_binds() -> None:
    """1,000-token prompts and answers on an A10G: the cache holds about 20 requests at
    1,500 tokens each (half the answer on average), fewer at 2,000 (all of it)."""
    dep = deployment()
    grow = EngineLimits(max_num_seqs=256, free_memory_fraction=0.9)
    reserve = EngineLimits(max_num_seqs=256, free_memory_fraction=0.9, reserve_whole_request=True)
    grown, reserved = (running_batch(dep, 64, 1000, 1000, lim) for lim in (grow, reserve))
    assert reserved < grown < 64
    assert reserved / grown == pytest.approx(1500 / 2000, rel=0.02)


@pytest.mark.parametrize("engine", ["trtllm", "nim"])
def test_tensorrt_llm_defaults(engine: str) -> None:
    limits = default_limits(engine, CATALOG.gpu("h100-sxm"), 64)
    assert limits.free_memory_fraction == 0.9
    assert limits.reserve_whole_request


@pytest.mark.parametrize("engine", ["vllm", "sglang"])
def test_vllm_and_sglang_take_blocks_as_tokens_come(engine: str) -> None:
    limits = default_limits(engine, CATALOG.gpu("h100-sxm"), 64)
    assert limits.free_memory_fraction is None
    assert not limits.reserve_whole_request

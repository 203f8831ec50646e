"""Continuous batching's serving model: admissions carry whole prompt chunks."""

from __future__ import annotations

from collections.abc import Callable
from types import ModuleType

import pytest

from rooftop_planner import perf
from rooftop_planner.batching import EngineLimits, admission_bound, predict_continuous
from rooftop_planner.catalog import load_catalog
from rooftop_planner.efficiency import load_efficiency
from rooftop_planner.scenarios import default_limits
from rooftop_sim.engine.truth import TruthModel


def deployment(model: str = "llama-3.1-8b", gpu: str = "h100-sxm") -> perf.EngineShape:
    catalog = load_catalog()
    eff = load_efficiency().lookup(catalog.gpu(gpu), "vllm")
    return perf.EngineShape(catalog.model(model), catalog.gpu(gpu), efficiency=eff)


def test_a_lone_long_answer_pays_its_prompt_once() -> None:
    """One client, 1,000 output tokens: one prompt chunk per 1,001.5 steps. Spreading that
    chunk over every step as a trickle of prefill tokens would charge the prefill kernels'
    fixed latency on every step (about 10 % here)."""
    dep = deployment()
    decode = perf.forward_time_s(dep, 1.0, 1500.0)
    chunk = perf.forward_time_s(dep, 1.0, 1500.0, 1000.0, 1000.0 * 1000.0 / 2.0)
    predicted = predict_continuous(dep, 1, 1000, 1000).tpot_s
    assert predicted == pytest.approx(decode + (chunk - decode) / 1001.5, rel=1e-9)
    assert predicted < 1.01 * decode


@pytest.mark.parametrize("concurrency", [16, 64, 256])
def test_prefill_admissions_scale_with_the_batch_over_the_answer(concurrency: int) -> None:
    """B / (osl + 1.5) admissions per step: a 5x shorter answer carries ~5x the prefill."""
    dep = deployment()
    long, short = (predict_continuous(dep, concurrency, 1000, osl) for osl in (1000, 200))
    decode = perf.forward_time_s(dep, long.batch, long.batch * 1500.0)
    decode_short = perf.forward_time_s(dep, short.batch, short.batch * 1100.0)
    ratio = (short.tpot_s - decode_short) / (long.tpot_s - decode)
    assert ratio == pytest.approx(1001.5 / 201.5, rel=0.1)


def test_explanation_adds_up_to_the_prediction() -> None:
    pred = predict_continuous(deployment(), 64, 2000, 300)
    assert pred.step is not None
    assert pred.step.total_s == pytest.approx(pred.tpot_s, rel=1e-6)


def test_the_token_budget_bounds_how_many_sequences_decode() -> None:
    """B decodes and B / (osl + 1.5) prompts of isl tokens per step must fit the step's
    token budget P: B <= P / (1 + isl / (osl + 1.5))."""
    limits = EngineLimits(max_num_seqs=256, max_num_batched_tokens=2048)
    assert admission_bound(2048, 128, limits) == pytest.approx(2048 / (1 + 2048 / 129.5))
    dep = deployment("llama-3.1-8b", "a100-80gb")
    bound = predict_continuous(dep, 256, 2048, 128, limits)
    assert bound.batch == pytest.approx(admission_bound(2048, 128, limits))
    # short prompts, long answers: the budget is no bound, the batch cap is
    assert predict_continuous(dep, 256, 128, 1024, limits).batch == 256


def test_a_budget_bound_engine_runs_full_steps_as_the_simulator_does(
    load_benchmark: Callable[[str], ModuleType],
) -> None:
    """Llama-3.1-8B on an A100 at vLLM's caps (256 sequences, 2,048 tokens a step), 256
    clients of 2,048/128 tokens: only ~122 decode at once, every step full. Priced with
    all 256 decoding and every prompt's chunk added on top, TPOT came out 88 % slow."""
    bench = load_benchmark("bench_continuous")
    limits = default_limits("vllm", load_catalog().gpu("a100-80gb"), 256)
    truth = TruthModel.for_deployment("llama-3.1-8b", "a100-80gb", 1, "bf16", "auto")
    simulated = bench.simulated_tpot_s(truth, 256, 2048, 128, limits)
    predicted = predict_continuous(deployment("llama-3.1-8b", "a100-80gb"), 256, 2048, 128, limits)
    assert abs(predicted.tpot_s / simulated - 1) < 0.10

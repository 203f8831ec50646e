"""The benchmark-run TTFT models' own arithmetic (``closed_loop``, ``open_loop``)."""

from __future__ import annotations

import math

import pytest

from rooftop_planner import perf
from rooftop_planner.batching import EngineLimits, predict_continuous
from rooftop_planner.catalog import load_catalog
from rooftop_planner.closed_loop import (
    first_wave_ttft_s,
    later_wave_ttft_s,
    predict_closed_loop,
)
from rooftop_planner.efficiency import load_efficiency
from rooftop_planner.open_loop import predict_open_loop, served_rate
from rooftop_planner.perf import EngineShape

LIMITS = EngineLimits(max_num_seqs=256, max_num_batched_tokens=8192)


def shape() -> EngineShape:
    gpu = load_catalog().gpu("h100-sxm")
    model = load_catalog().model("llama-3.1-8b")
    return EngineShape(model, gpu, 1, "bf16", "auto", load_efficiency().lookup(gpu, "vllm"))


def test_one_client_waits_for_its_own_prefill_only() -> None:
    dep = shape()
    alone = perf.forward_time_s(dep, 0.0, 0.0, 1000.0, 1000.0 * 1000 / 2.0)
    assert first_wave_ttft_s(dep, 1, 1000, LIMITS) == pytest.approx(alone)
    assert later_wave_ttft_s(dep, 1, 1000, LIMITS) == pytest.approx(alone)


def test_a_wave_queues_for_the_budget() -> None:
    """64 prompts of 1,000 tokens through 8,192-token steps: the i-th waits ⌈i · 1000 /
    P'⌉ steps, 4.5 on average, and every later prompt waits one full step."""
    dep = shape()
    first, later = (
        first_wave_ttft_s(dep, 64, 1000, LIMITS),
        later_wave_ttft_s(dep, 64, 1000, LIMITS),
    )
    assert 4.0 < first / later < 5.0


def test_a_prompt_beyond_the_budget_waits_its_chunks() -> None:
    dep, small = shape(), EngineLimits(max_num_seqs=256, max_num_batched_tokens=2048)
    one_chunk = later_wave_ttft_s(dep, 32, 2000, small)
    two_chunks = later_wave_ttft_s(dep, 32, 2048, small)  # 2048 > 2048 − 31 decodes
    assert two_chunks > 1.8 * one_chunk


def test_the_run_averages_the_first_wave_in() -> None:
    dep = shape()
    short = predict_closed_loop(dep, 64, 1000, 200, LIMITS, num_prompts=64).ttft_s
    long = predict_closed_loop(dep, 64, 1000, 200, LIMITS, num_prompts=6400).ttft_s
    assert short == pytest.approx(first_wave_ttft_s(dep, 64, 1000, LIMITS))
    assert long < 0.6 * short


def test_varied_answers_fall_back_to_the_steady_state() -> None:
    dep = shape()
    steady = predict_continuous(dep, 64, 1000, 200, LIMITS)
    varied = predict_closed_loop(dep, 64, 1000, 200, LIMITS, 10**6, fixed_lengths=False)
    assert varied.ttft_s == pytest.approx(steady.ttft_s - steady.tpot_s / 2.0, rel=0.01)


def test_an_open_loop_beyond_what_the_engine_serves_is_unbounded() -> None:
    dep = shape()
    top = predict_continuous(dep, 256.0, 1000, 200, LIMITS)
    most = served_rate(top, 200)
    over = predict_open_loop(dep, 1.1 * most, 1000, 200, LIMITS)
    assert over.ttft_s == float("inf") and over.reason.startswith("overloaded: ")
    under = predict_open_loop(dep, 0.5 * most, 1000, 200, LIMITS)
    assert under.ttft_s < 1.0 and under.batch < top.batch
    assert served_rate(under, 200) == pytest.approx(0.5 * most, rel=1e-6)


def test_a_prefill_first_engine_runs_the_wave_without_decodes() -> None:
    """SGLang's default: a wave's prompts go as prefill batches of up to the chunk size,
    back to back, nothing decoding beside them."""
    dep = shape()
    sglang = EngineLimits(max_num_seqs=256, max_num_batched_tokens=8192, mixed_prefill=False)
    alone = perf.forward_time_s(dep, 0.0, 0.0, 8192.0, 8192.0 * 1000 / 2.0)
    steps = sum(math.ceil(i * 1000 / 8192) for i in range(1, 65)) / 64
    assert first_wave_ttft_s(dep, 64, 1000, sglang) == pytest.approx(steps * alone)
    assert later_wave_ttft_s(dep, 64, 1000, sglang) == pytest.approx(alone)
    assert later_wave_ttft_s(dep, 64, 1000, LIMITS) > alone  # vLLM: decodes ride along

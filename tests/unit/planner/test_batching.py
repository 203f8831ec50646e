"""Continuous batching's serving model: admissions carry whole prompt chunks."""

from __future__ import annotations

import pytest

from rooftop_planner import perf
from rooftop_planner.batching import predict_continuous
from rooftop_planner.catalog import load_catalog
from rooftop_planner.efficiency import load_efficiency


def deployment(model: str = "llama-3.1-8b", gpu: str = "h100-sxm") -> perf.Deployment:
    catalog = load_catalog()
    eff = load_efficiency().lookup(gpu, "vllm")
    return perf.Deployment(catalog.model(model), catalog.gpu(gpu), efficiency=eff)


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

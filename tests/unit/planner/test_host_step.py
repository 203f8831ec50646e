"""vLLM's own host work per step (scheduling, inputs, sampling bookkeeping, update), from
the measured table: hidden behind the GPU's step with async scheduling, so a step takes
the longer of the two; waited for with a host-side drafter, which turns async scheduling
off."""

from __future__ import annotations

import statistics

import numpy as np
import pytest

from rooftop_planner import host_time, perf, speculative
from rooftop_planner.catalog import load_catalog
from rooftop_planner.efficiency import load_efficiency
from rooftop_planner.explain import explain_step
from rooftop_planner.perf import EngineShape
from rooftop_sim.engine.truth import ENGINE_STEP_OVERHEAD_S, TruthModel

CATALOG = load_catalog()
TABLE = load_efficiency()


def engine(name: str = "vllm", model: str = "llama-3.1-8b", gpu: str = "h100-sxm") -> EngineShape:
    spec = CATALOG.gpus[gpu]
    return EngineShape(CATALOG.model(model), spec, 1, "fp8", "fp8", TABLE.lookup(spec, name))


def test_the_fit_follows_the_measured_host_steps() -> None:
    cost = host_time.vllm_step_cost()
    rows = host_time.measured_rows(host_time.ENGINE_TABLE)
    ratio = cost.seconds(rows.batch, rows.tokens) / rows.seconds
    assert statistics.median(abs(r - 1.0) for r in ratio) < 0.15
    assert ratio.min() > 0.6 and ratio.max() < 1.6
    assert "host work per decode step" in cost.measured_on and "CPU" in cost.measured_on
    # more running requests, more Python per step
    assert (
        cost.seconds(np.array([256.0]), np.array([256e3]))[0]
        > 4 * cost.seconds(np.array([1.0]), np.array([1e3]))[0]
    )


def test_a_vllm_step_takes_at_least_its_host_work() -> None:
    """With async scheduling the host's work for a step overlaps the GPU's: it bounds
    the step from below, like the HBM floor, and adds nothing when the GPU is slower."""
    dep = engine()
    for batch, context in ((1.0, 1e3), (256.0, 256e3)):
        step = perf.step_breakdown(dep, batch, context)
        host = host_time.vllm_step_host_s(np.array([batch]), np.array([context]))[0]
        assert step.host_s == pytest.approx(host)
        assert step.total_s == max(step.kernels_s, step.floor_s, host)
    _, floor = perf.forward_parts([dep], np.array([[512.0]]), np.array([[0.0]]),
                                  np.array([[0.0]]), np.array([[0.0]]))  # fmt: skip
    assert floor[0, 0] >= host_time.vllm_step_host_s(np.array([512.0]), np.array([0.0]))[0]


def test_only_vllms_host_work_is_measured() -> None:
    for name in ("sglang", "trtllm"):
        assert perf.step_breakdown(engine(name), 64.0, 64e3).host_s == 0.0


@pytest.mark.parametrize("method", ["ngram", "suffix"])
def test_a_host_drafter_waits_for_the_engines_host_work_at_every_length(
    method: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """vLLM turns async scheduling off beside ``ngram`` and ``suffix``: each of their
    steps, drafting or not, is the GPU's work plus the host's."""
    dep = engine(model="llama-3-70b")
    batch, context, k = 64.0, 1500.0, 3
    found, problems = speculative.options(dep.model, [method], 0.6, CATALOG)
    assert not problems
    # suffix offers one fixed draft length per option
    spec = next(s for s in found if s.max_draft_tokens >= k)
    with_host, _ = speculative._decode_steps(dep, spec, batch, context, k)
    monkeypatch.setattr(perf, "host_step_s", lambda deps, seqs, *_: np.zeros_like(seqs))
    without, _ = speculative._decode_steps(dep, spec, batch, context, k)
    tokens = batch * perf.cached_tokens(dep.model, context)
    host = host_time.vllm_step_host_s(np.array([batch]), np.array([tokens]))[0]
    for length in range(k + 1):
        assert with_host[length] - without[length] == pytest.approx(host, rel=1e-9)


def test_the_simulated_engine_overlaps_the_host_work_unless_it_looks_drafts_up() -> None:
    truth = TruthModel.for_deployment("llama-3.1-8b", "h100-sxm", 1, "fp8", "fp8")
    batch, context = 256, 256 * 1024
    host = host_time.vllm_step_host_s(np.array([float(batch)]), np.array([float(context)]))[0]
    overlapped = truth.decode_step_s(batch, context)
    assert overlapped >= host
    looked_up = TruthModel.for_deployment("llama-3.1-8b", "h100-sxm", 1, "fp8", "fp8")
    looked_up.with_lookup("ngram")
    # beyond the fixed per-step cost the simulated engine already pays
    extra = max(host - ENGINE_STEP_OVERHEAD_S, 0.0)
    assert looked_up.decode_step_s(batch, context) == pytest.approx(
        truth.kernels.step_ms(batch, context, 0, 0.0, batch) * 1e-3 + ENGINE_STEP_OVERHEAD_S + extra
    )


def test_an_explanation_says_when_the_host_sets_the_pace() -> None:
    step = perf.StepBreakdown(
        gemm_s=1e-3, attention_s=0.0, allreduce_s=0.0, overhead_s=0.0, floor_s=5e-4, host_s=3e-3
    )
    lines = explain_step(step, "curves")
    assert lines[0].startswith("mean decode step 3.00 ms")
    assert any("host work for the step (3.00 ms" in line for line in lines)
    fast_host = perf.StepBreakdown(1e-3, 0.0, 0.0, 0.0, 5e-4, host_s=1e-4)
    assert not any("host work" in line for line in explain_step(fast_host, "curves"))

"""A benchmark run's TTFT: the planner against the engine simulator's vLLM scheduler,
clients starting together and requests at Poisson times (``benchmarks/bench_ttft.py``).

The steady-state TTFT ``rooftop predict`` reported before was 80-90 % short of what
a closed-loop run measures from 8 clients up: the prompts of a wave queue for the
prefill.
"""

from __future__ import annotations

from collections.abc import Callable
from types import ModuleType

import pytest

from rooftop_planner.batching import predict_continuous
from rooftop_planner.catalog import load_catalog
from rooftop_planner.closed_loop import predict_closed_loop
from rooftop_planner.efficiency import load_efficiency
from rooftop_planner.open_loop import predict_open_loop, served_rate
from rooftop_planner.perf import EngineShape
from rooftop_planner.scenarios import default_limits
from rooftop_sim.engine.truth import TruthModel

MODEL, GPU = "llama-3.1-8b", "h100-sxm"


@pytest.fixture(scope="module")
def bench(load_benchmark: Callable[[str], ModuleType]) -> ModuleType:
    return load_benchmark("bench_ttft")


@pytest.mark.parametrize("clients", [8, 64])
@pytest.mark.parametrize("varied", [False, True])
def test_closed_loop_ttft_is_the_simulated_runs(
    bench: ModuleType, clients: int, varied: bool
) -> None:
    gpu = load_catalog().gpu(GPU)
    dep = EngineShape(load_catalog().model(MODEL), gpu, 1, "bf16", "auto",
                      load_efficiency().lookup(gpu, "vllm"))  # fmt: skip
    limits = default_limits("vllm", gpu, clients)
    truth = TruthModel.for_deployment(MODEL, GPU, 1, "bf16", "auto")
    simulated = bench.simulated_ttft_s(truth, clients, 1000, 200, limits, varied)
    run = bench.WAVES * clients
    predicted = predict_closed_loop(dep, clients, 1000, 200, limits, run, not varied)
    assert predicted.ttft_s == pytest.approx(simulated, rel=0.15)
    steady = predict_continuous(dep, clients, 1000, 200, limits)
    assert steady.ttft_s < 0.6 * simulated  # what it was: far short
    assert predicted.tpot_s == steady.tpot_s  # the same prefill work: the same TPOT


def test_the_table_has_a_row_per_regime(bench: ModuleType) -> None:
    rows = bench.rows(quick=True)
    assert len(rows) == 2 * len(bench.CONCURRENCY)
    assert all(sim > 0 and pred > 0 for _, sim, pred, _ in rows)


@pytest.mark.parametrize("share", [0.2, 0.5])
def test_open_loop_ttft_is_the_simulated_runs(bench: ModuleType, share: float) -> None:
    gpu = load_catalog().gpu(GPU)
    dep = EngineShape(load_catalog().model(MODEL), gpu, 1, "bf16", "auto",
                      load_efficiency().lookup(gpu, "vllm"))  # fmt: skip
    limits = default_limits("vllm", gpu, 0)
    top = predict_continuous(dep, float(limits.max_num_seqs), 1000, 200, limits)
    rate = share * served_rate(top, 200)
    truth = TruthModel.for_deployment(MODEL, GPU, 1, "bf16", "auto")
    ttft, tpot = bench.simulated_open_loop_s(truth, rate, 1000, 200, limits)
    predicted = predict_open_loop(dep, rate, 1000, 200, limits)
    assert predicted.ttft_s == pytest.approx(ttft, rel=0.15)
    assert predicted.tpot_s == pytest.approx(tpot, rel=0.15)
    assert predicted.output_tok_s == pytest.approx(rate * 200, rel=1e-6)

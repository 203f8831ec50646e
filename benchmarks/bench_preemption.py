"""Evictions from a full KV cache: the engine simulator's vLLM scheduler against the
planner's model of them (``batching.recompute_tokens`` and ``evicted_tpot_factor``).

    python benchmarks/bench_preemption.py      (about 25 s)

When more clients wait than the KV cache holds, vLLM admits a waiting prompt whenever
its tokens fit now (no watermark by default) and a running sequence that finds no free
block evicts the newest one, which is prefilled again later (recompute). The engine
simulator (``rooftop_sim.engine``) schedules exactly so. C closed-loop clients with
fixed prompt and answer lengths (as ``bench_continuous.py``) drive it; per deployment
this prints, measured in the simulator and as the planner models it:

- evictions per finished request (p) and tokens prefilled again per eviction (s);
- steps an evicted request spends out of the batch per eviction, as a share of osl;
- the mean step (ms) and the mean TPOT (ms): TPOT spans a request's whole answer, so
  the steps it waits after an eviction count in it.

Prints a markdown table and the median |error| of the planner's TPOT, with and without
the eviction model.
"""

from __future__ import annotations

import statistics
import sys
from dataclasses import dataclass
from pathlib import Path

from rooftop_planner.batching import (
    EVICTED_AT_ANSWER_SHARE,
    EngineLimits,
    evicted_tpot_factor,
    predict_continuous,
    recompute_tokens,
)
from rooftop_planner.catalog import load_catalog
from rooftop_planner.efficiency import load_efficiency
from rooftop_planner.perf import EngineShape
from rooftop_sim.engine.core import StepResult
from rooftop_sim.engine.truth import TruthModel

sys.path.insert(0, str(Path(__file__).resolve().parent))
import bench_continuous  # noqa: E402  (a sibling script, not a package)

# (model, GPU, TP, weights, KV, clients, isl, osl): KV-bound at these client counts
CASES = (
    ("qwen3-32b", "h100-sxm", 1, "bf16", "auto", 28, 1000, 1000),
    ("qwen3-32b", "h100-sxm", 1, "bf16", "auto", 64, 1000, 1000),
    ("qwen3-32b", "h100-sxm", 1, "bf16", "auto", 64, 500, 2000),
    ("qwen3-32b", "h100-sxm", 1, "bf16", "auto", 128, 2000, 200),
    ("qwen3-32b", "h100-sxm", 2, "bf16", "auto", 256, 1000, 1000),
    ("qwen3-32b", "h100-sxm", 2, "bf16", "auto", 400, 1000, 1000),
    ("llama-3.1-70b", "h100-sxm", 2, "bf16", "auto", 64, 1000, 1000),
    ("llama-3.1-8b", "l40s", 1, "bf16", "auto", 256, 1000, 1000),
    ("llama-3.1-8b", "a100-80gb", 1, "bf16", "auto", 256, 2000, 2000),
    ("llama-3.1-8b", "h100-sxm", 1, "bf16", "auto", 512, 1000, 1000),
    ("llama-3.1-70b", "h100-sxm", 4, "bf16", "auto", 512, 1000, 1000),
    ("llama-3.1-8b", "h100-sxm", 1, "bf16", "auto", 1024, 128, 1024),
    ("llama-3.1-8b", "b200", 1, "bf16", "auto", 1024, 1000, 1000),
)


@dataclass(frozen=True)
class Measured:
    """What one simulated run showed, over the requests after the first wave."""

    evictions: float  # per finished request
    tokens_per_eviction: float
    wait_share: float  # steps out of the batch per eviction / osl
    step_ms: float
    tpot_ms: float
    running: float


def simulate(truth: TruthModel, clients: int, isl: int, osl: int) -> Measured:
    """Run ``clients`` closed-loop clients (``bench_continuous.run_clients``)."""
    evicted: list[int] = []  # tokens an evicted request held, when it was evicted
    steps: list[float] = []
    running: list[int] = []

    def note(result: StepResult, now_running: int) -> None:
        steps.append(result.duration_s)
        running.append(now_running)
        evicted.extend(r.prompt_tokens + r.out for r in result.preempted)

    done = bench_continuous.run_clients(truth, clients, isl, osl, on_step=note)
    step = statistics.mean(steps)
    tpot = statistics.mean(r.tpot_s for r in done if r.tpot_s)
    p = len(evicted) / len(done)
    # TPOT / step - 1 = wait steps per request / (osl - 1)
    wait = (tpot / step - 1.0) * (osl - 1) / p / osl if p else 0.0
    tokens = statistics.mean(evicted) if evicted else 0.0
    return Measured(p, tokens, wait, step * 1e3, tpot * 1e3, statistics.mean(running))


def main() -> None:
    catalog, efficiency = load_catalog(), load_efficiency()
    print("| deployment | isl/osl | clients | running | evictions p: sim / planner | "
          "tokens per eviction | wait per eviction / osl | step ms | TPOT ms: sim / "
          "planner / without evictions |")  # fmt: skip
    print("|---|---|---|---|---|---|---|---|---|")
    with_model, without = [], []
    for model, gpu, tp, weights, kv, clients, isl, osl in CASES:
        dep = EngineShape(catalog.model(model), catalog.gpu(gpu), tp, weights, kv,
                         efficiency.lookup(catalog.gpu(gpu), "vllm"))  # fmt: skip
        sim = simulate(TruthModel.for_deployment(model, gpu, tp, weights, kv), clients, isl, osl)
        limits = EngineLimits(max_num_seqs=clients, preempts_when_full=True)
        pred = predict_continuous(dep, clients, isl, osl, limits)
        plain = predict_continuous(dep, clients, isl, osl, EngineLimits(max_num_seqs=clients))
        p, tokens = recompute_tokens(dep, clients, isl, osl, limits)
        factor = evicted_tpot_factor(p, osl, clients, pred.batch)
        wait = (factor - 1.0) * (osl - 1) / osl / p if p else 0.0
        step = pred.tpot_s / factor * 1e3
        with_model.append(pred.tpot_ms / sim.tpot_ms - 1)
        without.append(plain.tpot_ms / sim.tpot_ms - 1)
        print(f"| {model} {weights} on {tp}x {gpu} | {isl}/{osl} | {clients} | "
              f"{sim.running:.0f} / {pred.batch:.0f} | {sim.evictions:.2f} / {p:.2f} | "
              f"{sim.tokens_per_eviction:.0f} / {tokens:.0f} | "
              f"{sim.wait_share:.2f} / {wait:.2f} | {sim.step_ms:.1f} / {step:.1f} | "
              f"{sim.tpot_ms:.1f} / {pred.tpot_ms:.1f} ({with_model[-1]:+.0%}) / "
              f"{plain.tpot_ms:.1f} ({without[-1]:+.0%}) |", flush=True)  # fmt: skip
    print(
        f"\nplanner TPOT median |error|: {statistics.median(map(abs, with_model)):.1%} with "
        f"the eviction model, {statistics.median(map(abs, without)):.1%} without "
        f"(newest sequence evicted at {EVICTED_AT_ANSWER_SHARE:.0%} of its answer)"
    )


if __name__ == "__main__":
    main()

"""The planner's closed-loop TTFT against the simulated engine: clients that start together.

    python benchmarks/bench_ttft.py [--quick]

C clients start at once and each sends its next request the moment its answer ends,
as ``vllm bench serve --max-concurrency C`` does, until ``WAVES`` · C requests have
finished; the engine simulator (``rooftop_sim.engine``: vLLM's V1 scheduler with
chunked prefill, steps timed in the measured kernel tables) runs them at vLLM's own
caps for the GPU. Its mean TTFT over all requests is set against
``closed_loop.predict_closed_loop`` (the prefill queue per wave) and against the
steady-state TTFT of ``batching.predict_continuous``, which ``rooftop predict`` reported
before. Two answer-length regimes: fixed (every answer osl tokens, as benchmarks run)
and varied (each answer uniform in 0.5-1.5 · osl, seeded), where the waves spread out.
Prints a markdown table and each predictor's median |error|.
"""

from __future__ import annotations

import argparse
import random
import statistics

from rooftop_planner.batching import EngineLimits, predict_continuous
from rooftop_planner.catalog import load_catalog
from rooftop_planner.closed_loop import predict_closed_loop
from rooftop_planner.efficiency import load_efficiency
from rooftop_planner.perf import EngineShape
from rooftop_planner.scenarios import default_limits
from rooftop_sim.engine.core import EngineConfig, EngineCore, Request
from rooftop_sim.engine.truth import TruthModel

DEPLOYMENTS = (
    ("llama-3.1-8b", "h100-sxm", 1, "bf16", "auto"),
    ("llama-3.1-70b", "h100-sxm", 4, "fp8", "fp8"),
    ("llama-3.1-8b", "a100-80gb", 1, "bf16", "auto"),
)
SHAPES = ((1000, 200), (2000, 500), (500, 1000))
CONCURRENCY = (1, 8, 32, 64, 128)
WAVES = 5
SEED = 0


def simulated_ttft_s(
    truth: TruthModel, clients: int, isl: int, osl: int, limits: EngineLimits, varied: bool
) -> float:
    """Mean TTFT (s) of the first ``WAVES`` · ``clients`` requests that finish."""
    rng = random.Random(SEED)

    def answer() -> int:
        return max(1, round(rng.uniform(0.5, 1.5) * osl)) if varied else osl

    config = EngineConfig(
        kv_capacity_tokens=truth.kv_capacity_tokens(limits.gpu_memory_utilization),
        max_num_seqs=limits.max_num_seqs,
        max_num_batched_tokens=limits.max_num_batched_tokens,
        max_model_len=isl + 2 * osl + 16,
    )
    engine, now = EngineCore(config, truth), 0.0
    for i in range(clients):
        engine.add_request(Request(str(i), isl, answer(), now))
    issued, finished = clients, []
    while len(finished) < WAVES * clients:
        result = engine.step(now)
        if result is None:
            break
        now = result.end_s
        for req in result.finished:
            finished.append(req)
            engine.add_request(Request(str(issued), isl, answer(), now))
            issued += 1
    return statistics.mean(r.ttft_s for r in finished if r.ttft_s is not None)


def rows(quick: bool) -> list[tuple[str, float, float, float]]:
    """(label, simulated, closed-loop predicted, steady-state predicted) TTFT in s."""
    catalog, efficiency = load_catalog(), load_efficiency()
    out = []
    for model, gpu, tp, weights, kv in DEPLOYMENTS[:1] if quick else DEPLOYMENTS:
        dep = EngineShape(catalog.model(model), catalog.gpu(gpu), tp, weights, kv,
                          efficiency.lookup(catalog.gpu(gpu), "vllm"))  # fmt: skip
        truth = TruthModel.for_deployment(model, gpu, tp, weights, kv)
        for isl, osl in SHAPES[:1] if quick else SHAPES:
            for clients in CONCURRENCY:
                limits = default_limits("vllm", dep.gpu, clients)
                steady = predict_continuous(dep, clients, isl, osl, limits).ttft_s
                for varied in (False, True):
                    sim = simulated_ttft_s(truth, clients, isl, osl, limits, varied)
                    pred = predict_closed_loop(
                        dep, clients, isl, osl, limits, WAVES * clients, fixed_lengths=not varied
                    ).ttft_s
                    label = (f"{model} {weights} on {tp}x {gpu} | {isl}/{osl} | {clients} | "
                             f"{'varied' if varied else 'fixed'}")  # fmt: skip
                    out.append((label, sim, pred, steady))
    return out


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--quick", action="store_true", help="one deployment, one shape")
    args = ap.parse_args(argv)
    table = rows(args.quick)
    print("| deployment | isl/osl | clients | answers | simulated TTFT ms | closed-loop "
          "predicted ms | error | steady-state ms | error |")  # fmt: skip
    print("|---|---|---|---|---|---|---|---|---|")
    for label, sim, pred, steady in table:
        print(f"| {label} | {sim * 1e3:.0f} | {pred * 1e3:.0f} | {pred / sim - 1:+.0%} | "
              f"{steady * 1e3:.0f} | {steady / sim - 1:+.0%} |")  # fmt: skip
    closed = [abs(pred / sim - 1) for _, sim, pred, _ in table]
    steady_state = [abs(steady / sim - 1) for _, sim, _, steady in table]
    for name, errors in (("closed-loop", closed), ("steady-state", steady_state)):
        print(f"\n{name}: median |TTFT error| {statistics.median(errors):.0%} "
              f"over {len(errors)} rows")  # fmt: skip
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

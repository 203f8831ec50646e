"""The planner's continuous-batching TPOT against the simulated engine, client by client.

    python benchmarks/bench_continuous.py

C closed-loop clients (fixed prompt and answer lengths, a new request the moment one
finishes; the first wave's answers are staggered so that admissions are spread as in a
steady state) drive the engine simulator (``rooftop_sim.engine``: vLLM's V1
scheduler with chunked prefill, step times interpolated directly in the measured kernel
tables); the mean TPOT of the requests after the first wave is compared with
``rooftop predict``'s (``batching.predict_continuous``, the planner's fitted curves).
The two share the kernel tables and nothing else, so the gap is the planner's model
error against an engine that runs those kernels exactly (plus the simulator's assumed
0.4 ms per step for the engine's own work, where the planner fits its fixed costs).
Prints a markdown table.
"""

from __future__ import annotations

import statistics
from collections.abc import Callable

from rooftop_planner.batching import EngineLimits, predict_continuous
from rooftop_planner.catalog import load_catalog
from rooftop_planner.efficiency import load_efficiency
from rooftop_planner.perf import EngineShape
from rooftop_planner.scenarios import default_limits
from rooftop_sim.engine.core import EngineConfig, EngineCore, Request, StepResult
from rooftop_sim.engine.truth import TruthModel

DEPLOYMENTS = (
    ("llama-3.1-8b", "h100-sxm", 1, "bf16", "auto"),
    ("llama-3.1-70b", "h100-sxm", 4, "fp8", "fp8"),
    ("llama-3.1-8b", "a100-80gb", 1, "bf16", "auto"),
)
SHAPES = ((1000, 1000), (1000, 200), (4000, 500))
CONCURRENCY = (1, 8, 32, 64, 128, 256)
# (model, GPU, TP, clients, isl, osl) at vLLM's own caps for the GPU: long prompts with
# short answers, where the step's token budget (2,048 on an A100 or L40S, 8,192 on an
# H100) or the KV cache decides how many sequences decode
AT_VLLM_CAPS = (
    ("llama-3.1-8b", "a100-80gb", 1, 256, 2048, 128),
    ("llama-3.1-8b", "a100-80gb", 1, 256, 1024, 128),
    ("llama-3.1-8b", "l40s", 1, 256, 2048, 64),
    ("llama-3.1-8b", "h100-sxm", 1, 1024, 4096, 128),
    ("llama-3.1-70b", "h100-sxm", 4, 512, 2048, 128),
)


def run_clients(
    truth: TruthModel,
    clients: int,
    isl: int,
    osl: int,
    limits: EngineLimits | None = None,
    on_step: Callable[[StepResult, int], None] | None = None,
) -> list[Request]:
    """``clients`` closed-loop clients (a new request the moment one finishes) until five
    waves, and at least 40 requests, have finished; the requests that finished after the
    first wave. ``on_step`` sees each step after the first wave as it ends, with the
    requests running then. ``limits``: the engine's batch cap and token budget (default:
    every client, 8,192)."""
    config = EngineConfig(
        kv_capacity_tokens=truth.kv_capacity_tokens(0.9),
        max_num_seqs=limits.max_num_seqs if limits else max(clients, 1),
        max_num_batched_tokens=limits.max_num_batched_tokens if limits else 8192,
        max_model_len=isl + osl + 16,
    )
    engine, now, issued = EngineCore(config, truth), 0.0, 0
    for i in range(clients):
        # the first wave's answers are spread over 1..osl tokens, so requests finish and
        # admit one by one as in a steady state, not all in the same step
        engine.add_request(Request(str(issued), isl, max(osl * (i + 1) // clients, 1), now))
        issued += 1
    finished: list[Request] = []
    while len(finished) < max(5 * clients, 40):
        result = engine.step(now)
        if result is None:
            break
        now = result.end_s
        if on_step is not None and len(finished) >= clients:
            on_step(result, engine.num_running)
        for req in result.finished:
            finished.append(req)
            engine.add_request(Request(str(issued), isl, osl, now))
            issued += 1
    return finished[clients:]


def simulated_tpot_s(
    truth: TruthModel, clients: int, isl: int, osl: int, limits: EngineLimits | None = None
) -> float:
    """Mean TPOT (s) of the requests that finish after the first wave of ``clients``."""
    done = run_clients(truth, clients, isl, osl, limits)
    return statistics.mean(r.tpot_s for r in done if r.tpot_s)


def main() -> None:
    catalog, efficiency = load_catalog(), load_efficiency()
    print("| deployment | isl/osl | clients | simulated TPOT ms | predicted ms | error |")
    print("|---|---|---|---|---|---|")
    errors = []
    for model, gpu, tp, weights, kv in DEPLOYMENTS:
        dep = EngineShape(catalog.model(model), catalog.gpu(gpu), tp, weights, kv,
                         efficiency.lookup(catalog.gpu(gpu), "vllm"))  # fmt: skip
        truth = TruthModel.for_deployment(model, gpu, tp, weights, kv)
        name = f"{model} {weights} on {tp}x {gpu}"
        for isl, osl in SHAPES:
            for clients in CONCURRENCY:
                sim = simulated_tpot_s(truth, clients, isl, osl)
                pred = predict_continuous(dep, clients, isl, osl).tpot_s
                errors.append(pred / sim - 1)
                print(f"| {name} | {isl}/{osl} | {clients} | {sim * 1e3:.2f} | "
                      f"{pred * 1e3:.2f} | {pred / sim - 1:+.1%} |")  # fmt: skip
    median = statistics.median(abs(e) for e in errors)
    print(f"\nmedian |error| {median:.1%} over {len(errors)} rows")
    print("\nAt vLLM's default caps for the GPU (`rooftop predict`'s):\n")
    print("| deployment | isl/osl | clients | running | simulated TPOT ms | predicted ms | error |")
    print("|---|---|---|---|---|---|---|")
    for model, gpu, tp, clients, isl, osl in AT_VLLM_CAPS:
        dep = EngineShape(catalog.model(model), catalog.gpu(gpu), tp, "bf16", "auto",
                         efficiency.lookup(catalog.gpu(gpu), "vllm"))  # fmt: skip
        limits = default_limits("vllm", dep.gpu, clients)
        truth = TruthModel.for_deployment(model, gpu, tp, "bf16", "auto")
        sim = simulated_tpot_s(truth, clients, isl, osl, limits)
        pred = predict_continuous(dep, clients, isl, osl, limits)
        print(f"| {model} bf16 on {tp}x {gpu} | {isl}/{osl} | {clients} | {pred.batch:.0f} | "
              f"{sim * 1e3:.1f} | {pred.tpot_ms:.1f} | {pred.tpot_s / sim - 1:+.1%} |")  # fmt: skip


if __name__ == "__main__":
    main()

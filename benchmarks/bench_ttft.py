"""The planner's TTFT of a benchmark run against the simulated engine: closed-loop clients
that start together, and open-loop Poisson arrivals.

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

Then open loop: requests sent at random times at 20, 50 and 80 % of the rate the engine
serves at its running cap (``OPEN_REQUESTS`` of them, seeded; the first fifth left out
as warm-up), against ``open_loop.predict_open_loop``: mean TTFT and TPOT. Last,
closed-loop runs where more clients wait than run (``QUEUED``), whose TTFT is mostly
the queue's wait.
"""

from __future__ import annotations

import argparse
import random
import statistics
from collections.abc import Iterator, Sequence

from rooftop_planner.batching import EngineLimits, predict_continuous
from rooftop_planner.catalog import load_catalog
from rooftop_planner.closed_loop import predict_closed_loop
from rooftop_planner.efficiency import load_efficiency
from rooftop_planner.open_loop import predict_open_loop, served_rate
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
# (model, GPU, clients, isl, osl) where more clients wait than run: vLLM's batch cap, its
# token budget or the KV cache holds the rest in its queue (fixed lengths, bf16, TP 1)
QUEUED = (
    ("llama-3.1-8b", "a100-80gb", 256, 2048, 128),
    ("llama-3.1-8b", "a100-80gb", 256, 1024, 128),
    ("llama-3.1-8b", "l40s", 256, 2048, 64),
    ("llama-3.1-8b", "h100-sxm", 512, 4096, 128),
    ("qwen3-32b", "h100-sxm", 64, 1000, 1000),
    ("llama-3.1-8b", "l40s", 256, 1000, 1000),
)
OPEN_SHAPES = ((1000, 200), (2000, 500))
OPEN_SHARES = (0.2, 0.5, 0.8)
OPEN_REQUESTS = 1500


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


def simulated_open_loop_s(
    truth: TruthModel, rate: float, isl: int, osl: int, limits: EngineLimits
) -> tuple[float, float]:
    """Mean (TTFT, TPOT) in s of ``OPEN_REQUESTS`` requests at Poisson times of mean
    ``rate`` per second, the first fifth left out."""
    rng = random.Random(SEED)
    arrivals, t = [], 0.0
    for _ in range(OPEN_REQUESTS):
        t += rng.expovariate(rate)
        arrivals.append(t)
    config = EngineConfig(
        kv_capacity_tokens=truth.kv_capacity_tokens(limits.gpu_memory_utilization),
        max_num_seqs=limits.max_num_seqs,
        max_num_batched_tokens=limits.max_num_batched_tokens,
        max_model_len=isl + osl + 16,
    )
    requests = [Request(str(i), isl, osl, t) for i, t in enumerate(arrivals)]
    finished = serve_arrivals(EngineCore(config, truth), requests)
    kept = [r for r in finished if int(r.request_id) >= OPEN_REQUESTS // 5]
    ttft = statistics.mean(r.ttft_s for r in kept if r.ttft_s is not None)
    return ttft, statistics.mean(r.tpot_s for r in kept if r.tpot_s)


def print_markdown(headers: Sequence[str], rows: Sequence[Sequence[str]]) -> None:
    """A markdown table of ``rows`` under ``headers`` on standard output."""
    print("| " + " | ".join(headers) + " |")
    print("|" + "---|" * len(headers))
    for row in rows:
        print("| " + " | ".join(row) + " |")


def quick_flag(doc: str | None, argv: list[str] | None) -> bool:
    """A benchmark's command line: ``--quick`` (its first targets only) and ``--help``."""
    ap = argparse.ArgumentParser(description=(doc or "").split("\n")[0])
    ap.add_argument("--quick", action="store_true", help="the first three targets only")
    return bool(ap.parse_args(argv).quick)


def serve_arrivals(engine: EngineCore, requests: Sequence[Request]) -> list[Request]:
    """Every request through ``engine``, each added at its ``arrival_s`` (in order), the
    engine stepping from time 0 and idling until the next arrival when it has nothing to
    run; the requests as they finish."""
    now, sent, finished = 0.0, 0, []
    while len(finished) < len(requests):
        while sent < len(requests) and requests[sent].arrival_s <= now:
            engine.add_request(requests[sent])
            sent += 1
        result = engine.step(now)
        if result is None:  # idle until the next arrival
            now = requests[sent].arrival_s
            continue
        now = result.end_s
        finished += result.finished
    return finished


def deployments(quick: bool) -> Iterator[tuple[str, EngineShape, TruthModel]]:
    """(label, the planner's deployment, the simulator's) of ``DEPLOYMENTS`` (the first
    only with ``quick``)."""
    catalog, efficiency = load_catalog(), load_efficiency()
    for model, gpu, tp, weights, kv in DEPLOYMENTS[:1] if quick else DEPLOYMENTS:
        dep = EngineShape(catalog.model(model), catalog.gpu(gpu), tp, weights, kv,
                          efficiency.lookup(catalog.gpu(gpu), "vllm"))  # fmt: skip
        truth = TruthModel.for_deployment(model, gpu, tp, weights, kv)
        yield f"{model} {weights} on {tp}x {gpu}", dep, truth


def queued_rows() -> list[tuple[str, float, float, float, float]]:
    """(label, running predicted, simulated, closed-loop predicted, steady-state) TTFT
    in s, of the ``QUEUED`` runs."""
    catalog, efficiency = load_catalog(), load_efficiency()
    out = []
    for model, gpu, clients, isl, osl in QUEUED:
        dep = EngineShape(catalog.model(model), catalog.gpu(gpu), 1, "bf16", "auto",
                          efficiency.lookup(catalog.gpu(gpu), "vllm"))  # fmt: skip
        truth = TruthModel.for_deployment(model, gpu, 1, "bf16", "auto")
        limits = default_limits("vllm", dep.gpu, clients)
        sim = simulated_ttft_s(truth, clients, isl, osl, limits, varied=False)
        pred = predict_closed_loop(dep, clients, isl, osl, limits, WAVES * clients)
        steady = predict_continuous(dep, clients, isl, osl, limits).ttft_s
        label = f"{model} bf16 on 1x {gpu} | {isl}/{osl} | {clients}"
        out.append((label, pred.batch, sim, pred.ttft_s, steady))
    return out


def open_rows(quick: bool) -> list[tuple[str, float, float, float, float]]:
    """(label, simulated TTFT, predicted TTFT, simulated TPOT, predicted TPOT) in s."""
    out = []
    for name, dep, truth in deployments(quick):
        limits = default_limits("vllm", dep.gpu, 0)
        for isl, osl in OPEN_SHAPES[:1] if quick else OPEN_SHAPES:
            top = predict_continuous(dep, float(limits.max_num_seqs), isl, osl, limits)
            for share in OPEN_SHARES:
                rate = share * served_rate(top, osl)
                pred = predict_open_loop(dep, rate, isl, osl, limits)
                ttft, tpot = simulated_open_loop_s(truth, rate, isl, osl, limits)
                label = f"{name} | {isl}/{osl} | {rate:.3g} ({share:.0%})"
                out.append((label, ttft, pred.ttft_s, tpot, pred.tpot_s))
    return out


def rows(quick: bool) -> list[tuple[str, float, float, float]]:
    """(label, simulated, closed-loop predicted, steady-state predicted) TTFT in s."""
    out = []
    for name, dep, truth in deployments(quick):
        for isl, osl in SHAPES[:1] if quick else SHAPES:
            for clients in CONCURRENCY:
                limits = default_limits("vllm", dep.gpu, clients)
                steady = predict_continuous(dep, clients, isl, osl, limits).ttft_s
                for varied in (False, True):
                    sim = simulated_ttft_s(truth, clients, isl, osl, limits, varied)
                    pred = predict_closed_loop(
                        dep, clients, isl, osl, limits, WAVES * clients, fixed_lengths=not varied
                    ).ttft_s
                    answers = "varied" if varied else "fixed"
                    label = f"{name} | {isl}/{osl} | {clients} | {answers}"
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
    print("\n| deployment | isl/osl | requests/s (of the most served) | simulated TTFT ms | "
          "predicted ms | error | simulated TPOT ms | predicted ms | error |")  # fmt: skip
    print("|---|---|---|---|---|---|---|---|---|")
    opened = open_rows(args.quick)
    for label, ttft, pred_ttft, tpot, pred_tpot in opened:
        print(f"| {label} | {ttft * 1e3:.0f} | {pred_ttft * 1e3:.0f} | "
              f"{pred_ttft / ttft - 1:+.0%} | {tpot * 1e3:.1f} | {pred_tpot * 1e3:.1f} | "
              f"{pred_tpot / tpot - 1:+.0%} |")  # fmt: skip
    ttft_errors = [abs(p / s - 1) for _, s, p, _, _ in opened]
    print(f"\nopen loop: median |TTFT error| {statistics.median(ttft_errors):.0%} "
          f"over {len(ttft_errors)} rows")  # fmt: skip
    if not args.quick:
        print("\n| deployment | isl/osl | clients | running | simulated TTFT ms | closed-loop "
              "predicted ms | error | steady-state ms | error |")  # fmt: skip
        print("|---|---|---|---|---|---|---|---|---|")
        for label, running, sim, pred, steady in queued_rows():
            errors = f"{pred / sim - 1:+.0%} | {steady * 1e3:.0f} | {steady / sim - 1:+.0%}"
            print(f"| {label} | {running:.0f} | {sim * 1e3:.0f} | {pred * 1e3:.0f} | {errors} |")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

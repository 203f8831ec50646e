"""The search's TTFT percentile against the simulated engine, under Poisson and bursty
arrivals.

    python benchmarks/bench_ttft_tail.py [--quick]

For each target below the planner searches twice: with its TTFT SLO, and without one
(the plan the TPOT SLO alone picks, which the TTFT SLO did not shape; its TTFT is still
predicted at the SLO's percentile). The engine simulator (``rooftop_sim.engine``:
vLLM's V1 scheduler with chunked prefill, steps timed in the measured kernel tables,
never fitted to the planner) then serves one replica of each plan at its share of the
rate, ``REQUESTS`` requests with lengths drawn from the target's distributions (the
first fifth left out as warm-up). Arrivals are Poisson, or, where the target declares
``arrivalDispersion`` D, Poisson within 15-s intervals whose rate is gamma-distributed
(``bursts``' Cox process; a fleet's bursts split at random over R replicas leave each
one D' = 1 + (D − 1)/R).

Columns: the plan, its predicted TTFT at the SLO's percentile, the simulated one, and
the share of requests within the TTFT SLO. Last, the median |error| of the predicted
percentile over all rows.
"""

from __future__ import annotations

import copy
import random
import statistics
import sys
from pathlib import Path
from typing import Any

import numpy as np

from rooftop_api.spec import ServingTargetSpec
from rooftop_planner.bursts import BURST_INTERVAL_S
from rooftop_planner.plan import Plan
from rooftop_planner.search import plan_target
from rooftop_planner.workload import from_spec
from rooftop_sim.engine.core import Request

sys.path.insert(0, str(Path(__file__).resolve().parent))
from bench_chunk import draw_lengths, replica_engine  # noqa: E402  (sibling scripts, not a package)
from bench_ttft import print_markdown, quick_flag, serve_arrivals  # noqa: E402

REQUESTS = 3000
SEED = 0
CHAT = {
    "model": "meta-llama/Llama-3.1-8B-Instruct",
    "slo": {"tpotMs": 40},
    "workload": {
        "promptTokens": {"mean": 1155, "p90": 2600},  # Azure's 2023 conversation trace
        "outputTokens": {"mean": 211, "p90": 450},
    },
    "budget": {"usdPerHour": 500},
    "constraints": {"maxReplicas": 64},
}
LONG_PROMPTS = {"mean": 4000, "p90": 12000}  # RAG-like: long documents in the prompt
# (GPU, TTFT SLO ms, percentile, req/s, prompt lengths (None: CHAT's), dispersion D)
TARGETS: tuple[tuple[str, float, str, float, Any, float | None], ...] = (
    ("h100-sxm", 300, "p90", 20, None, None),
    ("h100-sxm", 300, "p99", 20, None, None),
    ("l40s", 800, "p90", 10, None, None),
    ("l40s", 800, "p99", 10, None, None),
    ("a100-80gb", 500, "p99", 15, None, None),
    ("h100-sxm", 1500, "p90", 5, LONG_PROMPTS, None),
    ("h100-sxm", 1500, "p99", 5, LONG_PROMPTS, None),
    ("l4", 1500, "p90", 3, None, None),
    ("h100-sxm", 300, "p99", 20, None, 4.0),
    ("l40s", 800, "p99", 10, None, 4.0),
    ("a100-80gb", 500, "p90", 15, None, 8.0),
)


def target(
    gpu: str, ttft_ms: float | None, percentile: str, rate: float, prompt: Any, d: float | None
) -> ServingTargetSpec:
    spec: dict[str, Any] = copy.deepcopy(CHAT)
    spec["constraints"]["gpuTypes"] = [gpu]
    spec["slo"].update(tpotPercentile=percentile, ttftPercentile=percentile)
    if ttft_ms is not None:
        spec["slo"]["ttftMs"] = ttft_ms
    spec["workload"]["requestsPerSecond"] = rate
    spec["workload"]["promptTokens"] = prompt or spec["workload"]["promptTokens"]
    if d is not None:
        spec["workload"]["arrivalDispersion"] = d
    return ServingTargetSpec.model_validate(spec)


def arrival_times(rng: random.Random, rate: float, dispersion: float, count: int) -> list[float]:
    """``count`` arrival times (s): Poisson at ``rate`` (req/s) within each
    ``BURST_INTERVAL_S`` interval, the interval's rate gamma-distributed with mean ``rate``
    and index of dispersion ``dispersion`` (≤ 1: plain Poisson)."""
    if dispersion <= 1.0:
        times, now = [], 0.0
        for _ in range(count):
            now += rng.expovariate(rate)
            times.append(now)
        return times
    theta = (dispersion - 1.0) / BURST_INTERVAL_S
    times, start = [], 0.0
    while len(times) < count:
        level, now = rng.gammavariate(rate / theta, theta), start
        while level > 0.0:
            now += rng.expovariate(level)
            if now >= start + BURST_INTERVAL_S:
                break
            times.append(now)
        start += BURST_INTERVAL_S
    return times[:count]


def serve(spec: ServingTargetSpec, plan: Plan) -> tuple[float, float]:
    """(simulated TTFT at the SLO's percentile in s, share within the TTFT SLO or NaN) of
    one replica of ``plan`` at its share of the rate."""
    rng = random.Random(SEED)
    prompts, outputs = (
        from_spec(spec.workload.prompt_tokens),
        from_spec(spec.workload.output_tokens),
    )
    engine = replica_engine(plan, spec.model, plan.max_num_batched_tokens)
    fleet_d = spec.workload.arrival_dispersion or 1.0
    replica_d = 1.0 + (fleet_d - 1.0) / plan.replicas
    rate = spec.workload.requests_per_second / plan.replicas
    requests = []
    for i, arrival in enumerate(arrival_times(rng, rate, replica_d, REQUESTS)):
        isl, osl = draw_lengths(rng, prompts, outputs, plan.max_model_len)
        requests.append(Request(str(i), isl, osl, arrival))
    finished = serve_arrivals(engine, requests)
    ttft = np.array([r.ttft_s for r in finished if int(r.request_id) >= REQUESTS // 5])
    slo = spec.slo.ttft_ms
    within = float((ttft <= slo / 1e3).mean()) if slo else float("nan")
    return float(np.quantile(ttft, spec.slo.ttft_percentile.quantile)), within


def rows(quick: bool) -> tuple[list[list[str]], list[float]]:
    out, errors = [], []
    for gpu, ttft_ms, pct, rate, prompt, d in TARGETS[:3] if quick else TARGETS:
        label = (
            f"{gpu} {pct} TTFT {ttft_ms:g} ms, {rate:g} req/s"
            + (", long prompts" if prompt else "")
            + (f", D={d:g}" if d else "")
        )
        for slo in (ttft_ms, None):
            spec = target(gpu, slo, pct, rate, prompt, d)
            plan = plan_target(spec).plan
            if plan is None:
                out.append([label, "TTFT SLO" if slo else "TPOT only", "no plan", "", "", ""])
                continue
            simulated, within = serve(target(gpu, ttft_ms, pct, rate, prompt, d), plan)
            errors.append(plan.ttft_ms / (simulated * 1e3) - 1.0)
            out.append([
                label,
                "TTFT SLO" if slo else "TPOT only",
                f"{plan.replicas}x TP{plan.tp} cap {plan.max_num_seqs}",
                f"{plan.ttft_ms:.0f} / {simulated * 1e3:.0f}",
                f"{errors[-1]:+.0%}",
                f"{within:.1%} (goal {spec.slo.ttft_percentile.quantile:.0%})",
            ])  # fmt: skip
    return out, errors


def main(argv: list[str] | None = None) -> int:
    quick = quick_flag(__doc__, argv)
    headers = [
        "target",
        "searched with",
        "plan",
        "TTFT at the percentile, ms: predicted / simulated",
        "error",
        "within the TTFT SLO",
    ]
    table, errors = rows(quick)
    print_markdown(headers, table)
    print(
        f"\nmedian |error| {statistics.median(abs(e) for e in errors):.0%} over {len(errors)} rows"
    )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

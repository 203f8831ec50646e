"""The prefill chunk as a planned choice, against the simulated engine.

    python benchmarks/bench_chunk.py [--quick]

For each target below the planner searches the prefill chunks it lists
(``prefillChunkTokens``: 8,192, 4,096 and 2,048 tokens, vLLM's --max-num-batched-tokens)
with everything else. Where it picks a chunk smaller
than 8,192 tokens, the engine simulator (``rooftop_sim.engine``: vLLM's V1 scheduler
with chunked prefill, steps timed in the measured kernel tables, never fitted to the
planner) serves one replica of the plan at its share of the rate (Poisson arrivals
split at random over the replicas stay Poisson), lengths drawn from the target's
distributions, three ways:

- ``planned``: the plan as chosen, at its chunk;
- ``8192 chunk``: the same replicas and batch cap at 8,192-token chunks (what the chunk
  alone buys);
- ``best at 8192``: the cheapest plan at 8,192-token chunks, what Rooftop planned before
  the chunk was searched (its own shape and replica count).

Each run: ``REQUESTS`` requests (the first fifth left out as warm-up), the share whose
TPOT is within the SLO, and the mean TTFT. The cost ratio is the planned plan's $/hour
over the best 8,192-token plan's, both from the same search.
"""

from __future__ import annotations

import copy
import random
import statistics
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from rooftop_api.spec import ServingTargetSpec
from rooftop_planner.choice import rank
from rooftop_planner.perf import DEFAULT_MAX_NUM_BATCHED_TOKENS
from rooftop_planner.plan import Plan
from rooftop_planner.search import plan_target
from rooftop_planner.workload import LengthDistribution, from_spec
from rooftop_sim.engine.core import EngineConfig, EngineCore, Request
from rooftop_sim.engine.truth import TruthModel

sys.path.insert(0, str(Path(__file__).resolve().parent))
from bench_ttft import print_markdown, quick_flag, serve_arrivals  # noqa: E402  (a sibling script)

REQUESTS = 3000
SEED = 0
CHAT = {
    "model": "meta-llama/Llama-3.1-8B-Instruct",
    "slo": {"tpotMs": 25, "tpotPercentile": "p99"},
    "workload": {
        "requestsPerSecond": 8,
        "promptTokens": {"mean": 1155, "p90": 2600},  # Azure's 2023 conversation trace
        "outputTokens": {"mean": 211, "p90": 450},
    },
    "budget": {"usdPerHour": 500},
    "constraints": {"maxReplicas": 64, "prefillChunkTokens": [8192, 4096, 2048]},
}
LONG_PROMPTS = {"mean": 4000, "p90": 12000}  # RAG-like: long documents in the prompt
SHORT_ANSWERS = {"mean": 40, "p90": 100}  # extraction, classification, tool calls
SHORTEST_ANSWERS = {"mean": 12, "p90": 30}
# (label, GPU types, TPOT percentile, req/s, prompt lengths, answer lengths; None: CHAT's)
TARGETS: tuple[tuple[str, list[str], str, float, Any, Any], ...] = (
    ("chat, L40S, p99, 30 req/s", ["l40s"], "p99", 30.0, None, None),
    ("RAG, H100, p99, 2 req/s", ["h100-sxm"], "p99", 2.0, LONG_PROMPTS, None),
    ("extraction, H100, p90, 8 req/s", ["h100-sxm"], "p90", 8.0, LONG_PROMPTS, SHORTEST_ANSWERS),
    ("extraction, H100, p99, 2 req/s", ["h100-sxm"], "p99", 2.0, LONG_PROMPTS, SHORT_ANSWERS),
    ("extraction, H100, p99, 30 req/s", ["h100-sxm"], "p99", 30.0, LONG_PROMPTS, SHORT_ANSWERS),
    ("extraction, A100, p90, 30 req/s", ["a100-80gb"], "p90", 30.0, LONG_PROMPTS, SHORT_ANSWERS),
)


def target(
    gpus: list[str], percentile: str, rate: float, prompt: Any, output: Any
) -> ServingTargetSpec:
    spec = copy.deepcopy(CHAT)
    spec["constraints"]["gpuTypes"] = gpus
    spec["slo"]["tpotPercentile"] = percentile
    spec["workload"]["requestsPerSecond"] = rate
    spec["workload"]["promptTokens"] = prompt or spec["workload"]["promptTokens"]
    spec["workload"]["outputTokens"] = output or spec["workload"]["outputTokens"]
    return ServingTargetSpec.model_validate(spec)


@dataclass(frozen=True)
class Served:
    """One simulated replica's requests: share within the TPOT SLO, mean TTFT (s)."""

    within: float
    ttft_s: float


def replica_engine(plan: Plan, model: str, chunk: int) -> EngineCore:
    """The engine simulator as one replica of ``plan`` (of ``model``) at ``chunk``-token
    prefill chunks."""
    truth = TruthModel.for_deployment(model, plan.gpu, plan.tp, plan.weight_dtype, plan.kv_dtype)
    config = EngineConfig(
        kv_capacity_tokens=truth.kv_capacity_tokens(plan.gpu_memory_utilization),
        max_num_seqs=plan.max_num_seqs,
        max_num_batched_tokens=chunk,
        max_model_len=plan.max_model_len,
    )
    return EngineCore(config, truth)


def serve(spec: ServingTargetSpec, plan: Plan, chunk: int) -> Served:
    """One replica of ``plan`` at ``chunk``-token prefill chunks, at its share of the
    target's rate, in the engine simulator."""
    rng = random.Random(SEED)
    prompts, outputs = (
        from_spec(spec.workload.prompt_tokens),
        from_spec(spec.workload.output_tokens),
    )
    rate = spec.workload.requests_per_second / plan.replicas
    requests, arrival = [], rng.expovariate(rate)
    for i in range(REQUESTS):
        isl, osl = draw_lengths(rng, prompts, outputs, plan.max_model_len)
        requests.append(Request(str(i), isl, osl, arrival))
        arrival += rng.expovariate(rate)
    finished = serve_arrivals(replica_engine(plan, spec.model, chunk), requests)
    kept = [r for r in finished if int(r.request_id) >= REQUESTS // 5]
    slo_s = spec.slo.tpot_ms / 1e3
    tpots = [r.tpot_s for r in kept if r.tpot_s is not None]
    within = sum(t <= slo_s for t in tpots) / len(tpots)
    return Served(within, statistics.mean(r.ttft_s for r in kept if r.ttft_s is not None))


def draw_lengths(
    rng: random.Random, prompts: LengthDistribution, outputs: LengthDistribution, context: int
) -> tuple[int, int]:
    """(prompt, answer) tokens of one request, drawn in that order, within ``context``
    (max-model-len): the prompt leaves room for the two answer tokens a request needs."""
    isl = _draw(rng, prompts, context - 2)
    return isl, max(min(_draw(rng, outputs, 4096), context - isl), 2)


def _draw(rng: random.Random, lengths: LengthDistribution, most: int) -> int:
    """A length drawn from the distribution (inverse CDF) up to its p99.9 (a fitted
    log-normal's far tail runs past any model's context), 1..``most`` tokens."""
    q = min(max(rng.random(), 1e-6), 0.999)
    return max(1, min(round(lengths.quantile(q)), most))


def rows(quick: bool) -> list[list[str]]:
    out = []
    for label, *shape in TARGETS[:3] if quick else TARGETS:
        spec = target(*shape)
        result = plan_target(spec)
        plan = result.plan
        whole = [p for p in result.candidates if p.max_num_batched_tokens == 8192]
        if plan is None or plan.max_num_batched_tokens == DEFAULT_MAX_NUM_BATCHED_TOKENS:
            out.append([label, "8192 chunk planned", "", "", "", ""])
            continue
        before = min(whole, key=rank, default=None)  # None: no plan at 8192 meets the SLO
        runs = [
            serve(spec, plan, plan.max_num_batched_tokens),
            serve(spec, plan, DEFAULT_MAX_NUM_BATCHED_TOKENS),
        ]
        if before is not None:
            runs.append(serve(spec, before, DEFAULT_MAX_NUM_BATCHED_TOKENS))
        goal = spec.slo.tpot_percentile.quantile
        out.append([
            label,
            f"{_shape(plan)}, {plan.max_num_batched_tokens} / "
            + (_shape(before) if before else "none"),
            f"{plan.usd_per_hour / before.usd_per_hour:.2f}" if before else "-",
            " / ".join(f"{r.within:.1%}" for r in runs) + f" (goal {goal:.0%})",
            " / ".join(f"{r.ttft_s * 1e3:.0f}" for r in runs),
            f"{plan.ttft_ms:.0f} / " + (f"{before.ttft_ms:.0f}" if before else "-"),
        ])  # fmt: skip
    return out


def _shape(plan: Plan) -> str:
    return f"{plan.replicas}x TP{plan.tp} cap {plan.max_num_seqs}"


def main(argv: list[str] | None = None) -> int:
    quick = quick_flag(__doc__, argv)
    headers = [
        "target",
        "planned, chunk / best at 8192",
        "cost ratio",
        "within TPOT SLO: planned / 8192 chunk / best at 8192",
        "mean TTFT ms (same order)",
        "predicted p90 TTFT ms: planned / best at 8192",
    ]
    print_markdown(headers, rows(quick))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

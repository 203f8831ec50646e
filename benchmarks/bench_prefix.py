"""Prefix reuse on Kimi's conversation trace: the planner's predicted prefix-cache hit
rate, TTFT and replicas against the simulated engines', prefix-aware against
prefix-blind planning, with the Service's random spreading and with session affinity;
a markdown table for docs/benchmarks.md.

    .venv/bin/python benchmarks/bench_prefix.py [--jobs 2] [--minutes 60]
        [--out benchmarks/prefix_table.md] [--write-docs]

The trace (examples/traces/mooncake_conversation.jsonl) names each prompt's 512-token
blocks; the simulated engines cache them as vLLM's prefix cache does (full blocks by
chained hash, least-recently-used eviction when the KV cache is full) and the cluster
routes as a Service does (``random``) or with ClientIP affinity (``session``). The
target states the workload a user measures on their own traffic: rate and length
percentiles, the shared first block (512 tokens), the session share that one replica
with an unbounded cache would hit, and the mean gap between a session's requests. Each
plan runs as a fixed fleet (its replicas and batch cap) for the whole trace.
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence
from concurrent.futures import ProcessPoolExecutor
from dataclasses import replace
from pathlib import Path
from typing import Any

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))
import bench_simulate  # noqa: E402  (a sibling script, not a package)

ROOT = Path(__file__).resolve().parents[1]
TRACE = ROOT / "examples" / "traces" / "mooncake_conversation.jsonl"
START, END = "<!-- prefix-table:start -->", "<!-- prefix-table:end -->"
SHARED_TOKENS = 512  # block 0 starts every prompt of the trace
# The served model, its GPU and largest tensor parallelism: an 8B on H100s, whose KV
# cache holds about 37 of these prompts, and a 70B on B200 nodes, with room for sessions.
FLEETS = {
    "8B on H100": ("llama-3.1-8b", "h100-sxm", 1),
    "70B on B200": ("llama-3.1-70b", "b200", 8),
}
# (fleet, label, states the prefix?, clientIPSessions, the cluster's routing)
Case = tuple[str, str, bool, bool, str]
CASES: tuple[Case, ...] = tuple(
    (fleet, label, prefix, client_ip, routing)
    for fleet in FLEETS
    for label, prefix, client_ip, routing in (
        ("prefix-blind, Service", False, False, "random"),
        ("prefix-aware, Service", True, False, "random"),
        ("prefix-blind, ClientIP", False, False, "session"),
        ("prefix-aware, ClientIP allowed", True, True, "as planned"),
    )
)


def measured(trace: Any) -> dict[str, float]:
    """What a user measures on the traffic: rate, length mean and p90, the hit ratio of
    one replica with an unbounded cache, and the mean gap between a session's requests."""
    prompts = trace.prompt_tokens.astype(float)
    seen: set[int] = set()
    hits = 0.0
    for i, length in enumerate(prompts):
        blocks = trace.prefix.of(i).tolist()
        run = next((k for k, b in enumerate(blocks) if b not in seen), len(blocks))
        hits += min(run * trace.prefix.block_tokens, length)
        seen.update(blocks)
    gaps = _session_gaps(trace.arrival_s, trace.session)
    return {
        "rate": len(prompts) / float(trace.arrival_s[-1] - trace.arrival_s[0]),
        "prompt_mean": float(prompts.mean()),
        "prompt_p90": float(np.quantile(prompts, 0.9)),
        "output_mean": float(trace.output_tokens.mean()),
        "output_p90": float(np.quantile(trace.output_tokens, 0.9)),
        "hit_one_replica": hits / float(prompts.sum()),
        "session_gap_s": float(np.mean(gaps)) if gaps else 0.0,
    }


def _session_gaps(arrivals: Sequence[float], sessions: Sequence[int]) -> list[float]:
    last: dict[int, float] = {}
    gaps: list[float] = []
    for t, key in zip(arrivals, sessions, strict=True):
        if key in last:
            gaps.append(float(t) - last[key])
        last[int(key)] = float(t)
    return gaps


def target(
    stats: dict[str, float], prefix: bool, client_ip: bool, fleet: str = "8B on H100"
) -> Any:
    """The fleet's chat target, stating the measured workload (and prefix)."""
    from rooftop_api.spec import ServingTargetSpec

    workload: dict[str, Any] = {
        "requestsPerSecond": round(stats["rate"], 3),
        "promptTokens": {"mean": round(stats["prompt_mean"]), "p90": round(stats["prompt_p90"])},
        "outputTokens": {"mean": round(stats["output_mean"]), "p90": round(stats["output_p90"])},
    }
    if prefix:
        share = (stats["hit_one_replica"] * stats["prompt_mean"] - SHARED_TOKENS) / (
            stats["prompt_mean"] - SHARED_TOKENS
        )
        workload["prefix"] = {
            "sharedTokens": SHARED_TOKENS,
            "sessionShare": round(share, 3),
            "sessionGapSeconds": round(stats["session_gap_s"], 1),
            "clientIPSessions": client_ip,
        }
    model, gpu, tp = FLEETS[fleet]
    return ServingTargetSpec.model_validate(
        {
            "model": model,
            "slo": {"tpotMs": 50, "ttftMs": 5000},
            "workload": workload,
            "budget": {"usdPerHour": 500},
            "constraints": {"gpuTypes": [gpu], "maxTensorParallel": tp,
                            "kvDtypes": ["auto"], "maxReplicas": 64},
        }
    )  # fmt: skip


def one(case: Case, minutes: float) -> dict[str, Any]:
    """Plan the case's target and run its plan as a fixed fleet over the trace."""
    from rooftop_sim.cluster import Cluster, RequestStream
    from rooftop_sim.policies import FixedPolicy
    from rooftop_sim.report import summary
    from rooftop_sim.simulate import scenario
    from rooftop_sim.traces import load_trace

    fleet, label, prefix, client_ip, routing = case
    trace = load_trace(TRACE).window(0.0, minutes * 60.0)
    spec = target(measured(trace), prefix, client_ip, fleet)
    stream = RequestStream(
        trace.arrival_s,
        np.maximum(trace.prompt_tokens, 1),
        np.maximum(trace.output_tokens, 1),
        TRACE.name,
        trace.prefix,
        trace.session,
    )
    scn = scenario(spec, stream, routing="random" if routing == "as planned" else routing)
    plan = scn.plan
    if client_ip:  # the Service as the plan sets it: pinned only where it chose to
        scn = replace(
            scn, sim=replace(scn.sim, routing="session" if plan.session_affinity else "random")
        )
    res = Cluster(scn.workload, scn.sim).run(FixedPolicy(plan.replicas, plan.max_num_seqs, label))
    out = summary(res, scn.slo, 1.0)
    ttft = (res.first_token_s - res.workload.arrival_s) * 1e3
    ttft = ttft[np.isfinite(ttft)]
    return {
        "fleet": fleet,
        "case": label,
        "plan": f"{plan.replicas} x {plan.tp}x {plan.gpu}, cap {plan.max_num_seqs}"
        + (f", {plan.session_affinity}" if plan.session_affinity else ""),
        "replicas": plan.replicas,
        "usd_per_hour": round(plan.usd_per_hour, 2),
        "hits_predicted": round(plan.prefix_hit_ratio, 3),
        "hits_simulated": out["prefix_hit_ratio"],
        "ttft_p90_predicted_ms": round(plan.ttft_ms),
        "ttft_p90_simulated_ms": round(float(np.quantile(ttft, 0.9))),
        "tpot_within": out["slo_attainment_tpot"],
        "ttft_within": out["slo_attainment_ttft"],
        "requests": out["requests"],
    }


def table(rows: list[dict[str, Any]], stats: dict[str, float], minutes: float) -> str:
    head = (
        f"Mooncake conversation trace, first {minutes:g} min ({stats['rate']:.2f} req/s, "
        f"prompts {stats['prompt_mean']:,.0f} tokens mean, answers {stats['output_mean']:,.0f}; "
        f"one replica with an unbounded cache would hit {stats['hit_one_replica']:.1%}; a "
        f"session's requests {stats['session_gap_s']:.0f} s apart on average). Llama-3.1 "
        "in bf16, SLO p90 TPOT 50 ms and p90 TTFT 5 s, each plan a fixed fleet.\n\n"
        "| model, GPU | plan | routing | plan | $/h | hits predicted | hits simulated | "
        "p90 TTFT predicted | p90 TTFT simulated | within TPOT | within TTFT |\n"
        "|---|---|---|---|---|---|---|---|---|---|---|\n"
    )
    lines = [
        f"| {r['fleet']} | {r['case'].split(',')[0]} | {r['case'].split(', ')[1]} | {r['plan']} | "
        f"{r['usd_per_hour']:.2f} | {r['hits_predicted']:.1%} | {r['hits_simulated']:.1%} | "
        f"{r['ttft_p90_predicted_ms']:,} ms | {r['ttft_p90_simulated_ms']:,} ms | "
        f"{r['tpot_within']:.1%} | {r['ttft_within']:.1%} |"
        for r in rows
    ]
    return head + "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> int:
    from rooftop_sim.traces import load_trace

    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--jobs", type=int, default=2, help="parallel processes")
    ap.add_argument("--minutes", type=float, default=60.0, help="of the trace to replay")
    ap.add_argument("--out", default=str(ROOT / "benchmarks" / "prefix_table.md"))
    ap.add_argument("--write-docs", action="store_true")
    args = ap.parse_args(argv)
    stats = measured(load_trace(TRACE).window(0.0, args.minutes * 60.0))
    with ProcessPoolExecutor(max_workers=args.jobs) as pool:
        rows = list(pool.map(one, CASES, [args.minutes] * len(CASES)))
    text = table(rows, stats, args.minutes)
    bench_simulate.publish(text, rows, args.out, (START, END), args.write_docs)
    return 0


if __name__ == "__main__":
    sys.exit(main())

"""Speculative decoding as the planner prices it: the seed's case and a 70B target.

    python benchmarks/bench_speculative.py

Llama-3-70B in fp8 on 4 and 8 H100s with a Llama-3-8B fp8 draft model (the
drafter catalog's draft_model for llama-3-70b) at a per-token acceptance of 0.7 and
0.8: the decode TPOT with draft length 3 over the TPOT without, per batch size, and
the batch from which it stops paying. Then a 70B chat target whose TPOT SLO (14 ms)
is beyond 70 tokens/s per user, planned with and without ``constraints.speculative``.
All figures are the planner's predictions from the measured kernel tables (no GPU
timed a speculative step here); the simulated engine does not speculate yet.
"""

from __future__ import annotations

from typing import Any

from rooftop_api.spec import ServingTargetSpec
from rooftop_planner import speculative
from rooftop_planner.catalog import load_catalog
from rooftop_planner.efficiency import load_efficiency
from rooftop_planner.perf import EngineShape
from rooftop_planner.search import plan_target

BATCHES = (1, 4, 16, 32, 64, 128, 256)
CONTEXT = 1500  # tokens a running sequence holds: 1,000-token prompts, 1,000-token answers


def tpot_ratio(dep: EngineShape, spec: speculative.Speculation, batch: int) -> float:
    """Decode TPOT with draft length 3 over TPOT without, at ``batch`` sequences."""
    with_k3 = speculative.decode_tpot_s(dep, spec, batch, CONTEXT, 3)
    return with_k3 / speculative.decode_tpot_s(dep, spec, batch, CONTEXT, 0)


def ratio_table() -> None:
    catalog = load_catalog()
    model, gpu = catalog.model("llama-3-70b"), catalog.gpus["h100-sxm"]
    eff = load_efficiency().lookup(gpu, "vllm")
    heads = " | ".join(f"B={b}" for b in BATCHES)
    print(f"| TP | acceptance | {heads} | K=3 stops paying at |")
    print("|---" * (len(BATCHES) + 3) + "|")
    for tp in (4, 8):
        dep = EngineShape(model, gpu, tp, weight_dtype="fp8", kv_dtype="fp8", efficiency=eff)
        for rate in (0.7, 0.8):
            (spec,), _ = speculative.options(model, ["draft_model"], rate, catalog)
            cross = next((b for b in range(1, 513) if tpot_ratio(dep, spec, b) >= 1.0), None)
            cells = " | ".join(f"{tpot_ratio(dep, spec, b):.2f}" for b in BATCHES)
            print(f"| {tp} | {rate} | {cells} | {cross} |")


def plans() -> None:
    base: dict[str, Any] = {
        "model": "llama-3-70b",
        "slo": {"tpotMs": 14, "tpotPercentile": "p90"},
        "workload": {
            "requestsPerSecond": 2,
            "promptTokens": {"mean": 1000},
            "outputTokens": {"mean": 300},
        },
        "budget": {"usdPerHour": 500},
        "constraints": {"gpuTypes": ["h100-sxm"], "weightDtypes": ["fp8"]},
    }
    with_spec = {
        **base,
        "constraints": {**base["constraints"], "speculative": ["draft_model"]},
        "workload": {**base["workload"], "acceptanceRate": 0.7},
    }
    for name, spec in (("without", base), ("draft_model, acceptance 0.7", with_spec)):
        plan = plan_target(ServingTargetSpec.model_validate(spec)).plan
        assert plan is not None
        print(
            f"{name}: {plan.replicas}x TP{plan.tp} {plan.gpu}, cap {plan.max_num_seqs}, "
            f"p90 TPOT {plan.tpot_ms:.1f} ms, ${plan.usd_per_hour:.2f}/h"
        )
        if plan.speculative_config:
            print(f"  --speculative-config {plan.speculative_config}")


if __name__ == "__main__":
    ratio_table()
    print()
    plans()

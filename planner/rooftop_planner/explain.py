"""The search's decisions in words a platform engineer can act on (``choice`` decides)."""

from __future__ import annotations

from collections import Counter
from typing import TYPE_CHECKING

from rooftop_api.spec import ServingTargetSpec
from rooftop_planner.efficiency import load_efficiency

if TYPE_CHECKING:  # types only: results are built by ``choice``, which imports this module
    from rooftop_planner.perf import StepBreakdown
    from rooftop_planner.plan import Plan
    from rooftop_planner.result import Rejection, SearchResult


def describe(plan: Plan) -> str:
    return (
        f"{plan.replicas}x {plan.gpu} TP{plan.tp} {plan.weight_dtype}/KV {plan.kv_dtype}, "
        f"max-num-seqs {plan.max_num_seqs}"
    )


def chosen(plan: Plan, spec: ServingTargetSpec) -> str:
    """The chosen plan's one-line summary: shape, predictions against the SLO, cost."""
    slo = spec.slo
    return (
        f"{describe(plan)}: predicted {slo.tpot_percentile.value} TPOT {plan.tpot_ms:.1f} ms "
        f"(SLO {slo.tpot_ms:g} ms), {slo.ttft_percentile.value} TTFT {plan.ttft_ms:.0f} ms"
        + (f" (SLO {slo.ttft_ms:g} ms)" if slo.ttft_ms else "")
        + f", ${plan.usd_per_hour:.2f}/h of ${spec.budget.usd_per_hour:g}/h budget"
        + f"; max-model-len {plan.max_model_len} ({plan.context_note})"
        + (f"; {plan.weights_note}" if plan.weight_dtype not in ("bf16", "fp16") else "")
    )


def lost_to(plan: Plan, winner: Plan) -> str:
    """Why a runner-up lost to the chosen plan."""
    extra = plan.usd_per_hour - winner.usd_per_hour
    why = (
        f"costs ${extra:.2f}/h more"
        if extra > 1e-9
        else f"same cost, higher TPOT ({plan.tpot_ms:.1f} vs {winner.tpot_ms:.1f} ms)"
    )
    return f"{describe(plan)}: {why}"


def over_budget(plan: Plan, budget: float) -> str:
    """A plan that meets the SLO but not the budget, and by how much."""
    gap = plan.usd_per_hour - budget
    return f"{describe(plan)} meets the SLO at ${plan.usd_per_hour:.2f}/h, ${gap:.2f} over budget"


def reasons(result: SearchResult, spec: ServingTargetSpec) -> list[str]:
    """The lines a user reads first: rejections by class and, with no plan, why not."""
    rejections = result.rejections
    counts = Counter(r.category for r in rejections)
    lines = [f"{n} candidate(s) rejected: {cat}" for cat, n in counts.most_common()]
    if result.feasible:
        return lines
    if result.alternatives:
        lines.insert(
            0,
            f"no plan meets the SLO within ${spec.budget.usd_per_hour:g}/h; "
            f"cheapest that meets it: {result.alternatives[0].summary}",
        )
    else:
        lines.insert(0, _no_plan(counts, spec))
        lines.extend(_nearest_misses(rejections))
    return lines


LATENCY_MISSES = ("TPOT over SLO", "TTFT over SLO")


def _no_plan(counts: Counter[str], spec: ServingTargetSpec) -> str:
    """The headline when no candidate meets the SLO: blame what actually stopped them."""
    slo = spec.slo
    target = f"a {slo.tpot_percentile.value} TPOT of {slo.tpot_ms:g} ms" + (
        f" and TTFT of {slo.ttft_ms:g} ms" if slo.ttft_ms else ""
    )
    slow = sum(counts[c] for c in LATENCY_MISSES)
    if counts["too many replicas"]:
        limit = spec.constraints.max_replicas
        rest = "; the other shapes are too slow at any batch" if slow else ""
        return (
            f"no plan meets {target} within maxReplicas {limit}: every shape fast enough "
            f"needs more replicas{rest}; raise maxReplicas or allow larger GPUs or more "
            "tensor parallelism"
        )
    if slow:
        return f"no plan meets {target} at any cost with these constraints"
    blocked = ", ".join(f"{cat} ({n})" for cat, n in counts.most_common())
    return f"no candidate can run at all: {blocked or 'no GPU or dtype is allowed'}"


def _nearest_misses(rejections: list[Rejection]) -> list[str]:
    """For latency misses, the best latency any candidate reaches (what *would* work)."""
    misses = [r for r in rejections if r.category in ("TPOT over SLO", "TTFT over SLO")]
    if not misses:
        return []
    best = min(misses, key=lambda r: float(r.detail.split()[0]))
    return [
        f"closest: {best.gpu} TP{best.tp} {best.weight_dtype}/KV {best.kv_dtype} reaches "
        f"{best.category.split()[0]} {best.detail}; relax the SLO to at least that"
    ]


def explain_result(result: SearchResult) -> str:
    """A multi-line explanation: the choice, the runners-up and every rejection class."""
    lines = []
    if result.plan:
        lines.append(f"Chosen: {result.plan.summary}")
        curves = load_efficiency().lookup(result.plan.gpu, "vllm").describe()
        lines.append(f"  - step times from {curves}")
    else:
        lines.append("No feasible plan.")
    lines += [f"  - {reason}" for reason in result.reasons]
    if result.alternatives:
        lines.append("Alternatives:" if result.plan else "What would work:")
        lines += [f"  - {p.summary}" for p in result.alternatives]
    examples: dict[str, Rejection] = {}
    for r in result.rejections:
        examples.setdefault(r.category, r)
    if examples:
        lines.append("Rejected, one example per reason:")
        lines += [
            f"  - {r.category}: {r.gpu} TP{r.tp} {r.weight_dtype}/KV {r.kv_dtype}: {r.detail}"
            for r in examples.values()
        ]
    return "\n".join(lines)


def explain_step(step: StepBreakdown, curves: str) -> list[str]:
    """Where a predicted decode step goes, against its physical floor (``rooftop predict
    --explain``): the floor is what the HBM must stream; the rest is named."""
    total = step.total_s
    lines = [
        f"mean decode step {total * 1e3:.2f} ms ({curves})",
        f"  floor {step.floor_s * 1e3:.2f} ms: weights touched + KV cache read, at peak HBM "
        f"bandwidth; the prediction is {total / step.floor_s:.2f}x the floor"
        if step.floor_s > 0
        else "  no floor (nothing read)",
    ]
    parts = (
        ("GEMMs (QKV, output projection, MLP/MoE, LM head)", step.gemm_s),
        ("attention (decode over the KV cache, carried prefill chunks)", step.attention_s),
        ("tensor-parallel all-reduces", step.allreduce_s),
        ("engine fixed costs (scheduling, sampling, small per-layer kernels)", step.overhead_s),
    )
    lines += [f"  {seconds * 1e3:8.2f} ms  {name}" for name, seconds in parts]
    if step.floor_s > step.gemm_s + step.attention_s + step.allreduce_s + step.overhead_s:
        lines.append("  the kernels' sum is below the floor, so the floor is the prediction")
    return lines

"""Choosing among candidates and saying why, in words a platform engineer can act on."""

from __future__ import annotations

from collections import Counter
from typing import TYPE_CHECKING

from rooftop_api.spec import ServingTargetSpec
from rooftop_planner.efficiency import load_efficiency

if TYPE_CHECKING:
    from rooftop_planner.perf import StepBreakdown
    from rooftop_planner.plan import Plan
    from rooftop_planner.search import Rejection, SearchResult

MAX_ALTERNATIVES = 5


def _rank(plan: Plan) -> tuple[float, float, int]:
    """Cheapest first; ties go to lower latency, then fewer GPUs."""
    return (round(plan.usd_per_hour, 6), plan.tpot_ms, plan.replicas * plan.tp)


def describe(plan: Plan) -> str:
    return (
        f"{plan.replicas}x {plan.gpu} TP{plan.tp} {plan.weight_dtype}/KV {plan.kv_dtype}, "
        f"max-num-seqs {plan.max_num_seqs}"
    )


def pareto_frontier(plans: list[Plan]) -> list[Plan]:
    """Plans no other plan beats on both $/hour and TPOT (sorted by cost)."""
    frontier: list[Plan] = []
    for plan in sorted(plans, key=_rank):
        if not frontier or plan.tpot_ms < frontier[-1].tpot_ms:
            frontier.append(plan)
    return frontier


def _best_per_shape(plans: list[Plan]) -> list[Plan]:
    """The cheapest plan of each (GPU, TP, dtypes) shape, so alternatives differ in kind."""
    best: dict[tuple[str, int, str, str], Plan] = {}
    for plan in sorted(plans, key=_rank):
        best.setdefault(plan.key, plan)
    return sorted(best.values(), key=_rank)


def summarize(
    spec: ServingTargetSpec, plans: list[Plan], rejections: list[Rejection]
) -> SearchResult:
    """Pick the cheapest plan within budget; otherwise explain what would work."""
    from rooftop_planner.search import SearchResult

    budget = spec.budget.usd_per_hour
    affordable = [p for p in plans if p.usd_per_hour <= budget + 1e-9]
    over = [p for p in plans if p.usd_per_hour > budget + 1e-9]
    rejections = rejections + [_over_budget(p, budget) for p in _best_per_shape(over)]
    result = SearchResult(
        feasible=bool(affordable),
        plan=None,
        rejections=rejections,
        frontier=pareto_frontier(plans),
        candidates=plans,
        slo_tpot_ms=spec.slo.tpot_ms,
        budget_usd_per_hour=budget,
    )
    if affordable:
        ranked = _best_per_shape(affordable)
        chosen = ranked[0]
        result.plan = _with_summary(chosen, spec)
        result.alternatives = [_lost_to(p, chosen) for p in ranked[1 : 1 + MAX_ALTERNATIVES]]
    else:
        result.alternatives = _closest(plans, spec)
    result.reasons = _reasons(result, rejections, spec)
    return result


def _with_summary(plan: Plan, spec: ServingTargetSpec) -> Plan:
    from dataclasses import replace

    slo = spec.slo
    text = (
        f"{describe(plan)}: predicted {slo.tpot_percentile.value} TPOT {plan.tpot_ms:.1f} ms "
        f"(SLO {slo.tpot_ms:g} ms), {slo.ttft_percentile.value} TTFT {plan.ttft_ms:.0f} ms"
        + (f" (SLO {slo.ttft_ms:g} ms)" if slo.ttft_ms else "")
        + f", ${plan.usd_per_hour:.2f}/h of ${spec.budget.usd_per_hour:g}/h budget"
        + f"; max-model-len {plan.max_model_len} ({plan.context_note})"
        + (f"; {plan.weights_note}" if plan.weight_dtype not in ("bf16", "fp16") else "")
    )
    return replace(plan, summary=text)


def _lost_to(plan: Plan, chosen: Plan) -> Plan:
    from dataclasses import replace

    extra = plan.usd_per_hour - chosen.usd_per_hour
    why = (
        f"costs ${extra:.2f}/h more"
        if extra > 1e-9
        else f"same cost, higher TPOT ({plan.tpot_ms:.1f} vs {chosen.tpot_ms:.1f} ms)"
    )
    return replace(plan, summary=f"{describe(plan)}: {why}")


def _over_budget(plan: Plan, budget: float) -> Rejection:
    from rooftop_planner.search import Rejection

    return Rejection(
        plan.gpu,
        plan.tp,
        plan.weight_dtype,
        plan.kv_dtype,
        "over budget",
        f"${plan.usd_per_hour:.2f}/h > ${budget:g}/h",
    )


def _closest(plans: list[Plan], spec: ServingTargetSpec) -> list[Plan]:
    """When nothing fits the budget: the cheapest plan that meets the SLO, in words."""
    from dataclasses import replace

    budget = spec.budget.usd_per_hour
    out = []
    for plan in _best_per_shape(plans)[:MAX_ALTERNATIVES]:
        gap = plan.usd_per_hour - budget
        out.append(
            replace(
                plan,
                summary=(
                    f"{describe(plan)} meets the SLO at ${plan.usd_per_hour:.2f}/h, "
                    f"${gap:.2f} over budget"
                ),
            )
        )
    return out


def _reasons(
    result: SearchResult, rejections: list[Rejection], spec: ServingTargetSpec
) -> list[str]:
    counts = Counter(r.category for r in rejections)
    lines = [f"{n} candidate(s) rejected: {cat}" for cat, n in counts.most_common()]
    if result.feasible:
        return lines
    slo = spec.slo
    if result.alternatives:
        lines.insert(
            0,
            f"no plan meets the SLO within ${spec.budget.usd_per_hour:g}/h; "
            f"cheapest that meets it: {result.alternatives[0].summary}",
        )
    else:
        lines.insert(
            0,
            f"no plan meets a {slo.tpot_percentile.value} TPOT of {slo.tpot_ms:g} ms"
            + (f" and TTFT of {slo.ttft_ms:g} ms" if slo.ttft_ms else "")
            + " at any cost with these constraints",
        )
        lines.extend(_nearest_misses(rejections))
    return lines


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

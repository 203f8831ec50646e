"""Choosing among the plans that meet the SLO: the budget cut, the ranking, the runners-up.

The search calls ``choose`` with every plan that met the SLO and every rejection; it
decides (cheapest within budget, ties by ``rank``; alternatives of a different shape,
same-cost KV-only variants folded into one) and ``explain`` puts each decision into
words.
"""

from __future__ import annotations

from dataclasses import replace

from rooftop_api.spec import ServingTargetSpec
from rooftop_planner import explain
from rooftop_planner.plan import Plan
from rooftop_planner.result import Rejection, SearchResult

MAX_ALTERNATIVES = 5
BUDGET_TOLERANCE_USD_PER_HOUR = 1e-9  # float noise in a sum of prices is not overspending


def rank(plan: Plan) -> tuple[float, int, bool, int, bool, int, float]:
    """Cheapest first; ties go to the plan that keeps more of the model's 16-bit outputs
    (quantized weights or KV only where they save money), then to no speculative
    decoding (a second model to load and keep in memory, only where it saves money),
    then to fewer GPUs (where
    GPUs are owned at $0, every plan within them costs the same, and the rest of the
    cluster is for other work), then to no session affinity (it pins sessions, so
    replicas' loads follow the sessions' sizes, only where it saves money), then to the
    larger prefill chunk (a smaller one lengthens TTFT: only where it saves money), then
    lower latency."""
    pinned = bool(plan.session_affinity)
    return (
        round(plan.usd_per_hour, 6),
        explain.quantized(plan),
        bool(plan.speculative_config),
        plan.replicas * plan.tp,
        pinned,
        -plan.max_num_batched_tokens,
        plan.tpot_ms,
    )


def pareto_frontier(plans: list[Plan]) -> list[Plan]:
    """Plans no other plan beats on both $/hour and TPOT (sorted by cost)."""
    frontier: list[Plan] = []
    for plan in sorted(plans, key=rank):
        if not frontier or plan.tpot_ms < frontier[-1].tpot_ms:
            frontier.append(plan)
    return frontier


def best_per_shape(plans: list[Plan]) -> list[Plan]:
    """The cheapest plan of each (GPU, TP, dtypes) shape, so alternatives differ in kind."""
    best: dict[tuple[str, int, str, str], Plan] = {}
    for plan in sorted(plans, key=rank):
        best.setdefault(plan.key, plan)
    return sorted(best.values(), key=rank)


def fold_kv(plans: list[Plan]) -> list[tuple[Plan, tuple[str, ...]]]:
    """Ranked plans with their same-cost KV-dtype variants folded into the best-ranked
    one: (plan, KV dtypes of the folded line). Variants that differ only in the KV cache
    at the same price are one alternative, not two."""
    folded: dict[tuple[str, int, str, int, float], tuple[Plan, tuple[str, ...]]] = {}
    for plan in plans:
        key = (plan.gpu, plan.tp, plan.weight_dtype, plan.replicas, rank(plan)[0])
        first, kvs = folded.get(key, (plan, ()))
        folded[key] = (first, (*kvs, plan.kv_dtype))
    return list(folded.values())


def choose(spec: ServingTargetSpec, plans: list[Plan], rejections: list[Rejection]) -> SearchResult:
    """Pick the cheapest plan within budget; otherwise say what would work."""
    budget = spec.budget.usd_per_hour
    affordable = [p for p in plans if p.usd_per_hour <= budget + BUDGET_TOLERANCE_USD_PER_HOUR]
    over = [p for p in plans if p.usd_per_hour > budget + BUDGET_TOLERANCE_USD_PER_HOUR]
    rejections = rejections + [_over_budget(p, budget) for p in best_per_shape(over)]
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
        (chosen, _), *others = fold_kv(best_per_shape(affordable))
        unpinned = _cheapest_unpinned(chosen, affordable)
        whole = _cheapest_at_default_chunk(chosen, affordable)
        result.plan = replace(chosen, summary=explain.chosen(chosen, spec, unpinned, whole))
        result.alternatives = [
            replace(p, summary=explain.lost_to(p, chosen, kvs))
            for p, kvs in others[:MAX_ALTERNATIVES]
        ]
    else:  # what would work: the cheapest plan of each shape that meets the SLO
        result.alternatives = [
            replace(p, summary=explain.over_budget(p, budget, kvs))
            for p, kvs in fold_kv(best_per_shape(plans))[:MAX_ALTERNATIVES]
        ]
    result.reasons = explain.reasons(result, spec)
    return result


def _cheapest_unpinned(chosen: Plan, plans: list[Plan]) -> Plan | None:
    """For a plan with session affinity: the cheapest plan without, which it beat (its
    price is what the affinity saves); None otherwise."""
    if not chosen.session_affinity:
        return None
    return min((p for p in plans if not p.session_affinity), key=rank, default=None)


def _cheapest_at_default_chunk(chosen: Plan, plans: list[Plan]) -> Plan | None:
    """For a plan with a smaller prefill chunk than the default: the cheapest plan at the
    default, which it beat (its price is what the smaller chunk saves); None otherwise."""
    if explain.default_chunk(chosen):
        return None
    return min(filter(explain.default_chunk, plans), key=rank, default=None)


def _over_budget(plan: Plan, budget: float) -> Rejection:
    return Rejection(
        gpu=plan.gpu,
        tp=plan.tp,
        weight_dtype=plan.weight_dtype,
        kv_dtype=plan.kv_dtype,
        category="over budget",
        detail=f"max-num-seqs {plan.max_num_seqs} needs {plan.replicas} replica(s): "
        f"${plan.usd_per_hour:.2f}/h > ${budget:g}/h",
    )

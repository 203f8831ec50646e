"""The search's decisions in words a platform engineer can act on (``choice`` decides)."""

from __future__ import annotations

from collections import Counter
from typing import TYPE_CHECKING

from rooftop_api.spec import ServingTargetSpec
from rooftop_planner.bursts import HEADROOM, burst_rate
from rooftop_planner.perf import DEFAULT_MAX_NUM_BATCHED_TOKENS

if TYPE_CHECKING:  # types only: results are built by ``choice``, which imports this module
    from rooftop_planner.fleet import MixedFleet
    from rooftop_planner.perf import StepBreakdown
    from rooftop_planner.plan import Plan
    from rooftop_planner.result import Rejection, SearchResult


SIXTEEN_BIT = ("bf16", "fp16", "auto")  # weights and KV caches that keep the model's outputs


def describe(plan: Plan, kv_dtypes: tuple[str, ...] = ()) -> str:
    """``3 replicas of 2x l4 (TP2), bf16/KV auto, max-num-seqs 32``; ``kv_dtypes``: the KV
    dtypes of same-cost variants folded into this line (``KV auto|fp8``).

    "Nx gpu" counts GPUs everywhere the planner speaks (one replica's, here), so a
    tensor-parallel replica never reads as one GPU.
    """
    kv = "|".join(kv_dtypes or (plan.kv_dtype,))
    return (
        f"{replicas_of(plan.replicas, plan.tp, plan.gpu)}, {plan.weight_dtype}/KV {kv}, "
        f"max-num-seqs {plan.max_num_seqs}"
        + ("" if default_chunk(plan) else f", prefill chunks of {plan.max_num_batched_tokens}")
    )


def default_chunk(plan: Plan) -> bool:
    """Whether the plan prefills in the chunks Rooftop renders unless told otherwise."""
    return plan.max_num_batched_tokens == DEFAULT_MAX_NUM_BATCHED_TOKENS


def replicas_of(replicas: object, tp: object, gpu: object) -> str:
    """``1 replica of 2x a100-40gb (TP2)``: the fleet's shape in words."""
    noun = "replica" if replicas == 1 else "replicas"
    return f"{replicas} {noun} of {tp}x {gpu} (TP{tp})"


def quantized(plan: Plan) -> int:
    """How many of the plan's weights and KV cache are quantized (0-2): the ranking's
    and a mixed fleet's preference for the model's 16-bit outputs."""
    return sum(d not in SIXTEEN_BIT for d in (plan.weight_dtype, plan.kv_dtype))


def changes_outputs(plan: Plan) -> str:
    """What in the plan makes outputs differ from the model's 16-bit weights, else ""."""
    parts = [f"weights {plan.weight_dtype}"] if plan.weight_dtype not in SIXTEEN_BIT else []
    parts += [f"KV {plan.kv_dtype}"] if plan.kv_dtype not in SIXTEEN_BIT else []
    return " and ".join(parts)


def chosen(
    plan: Plan,
    spec: ServingTargetSpec,
    unpinned: Plan | None = None,
    whole_chunks: Plan | None = None,
) -> str:
    """The chosen plan's one-line summary: shape, predictions against the SLO, cost, what
    the prefix cache saves (``unpinned``: the best plan without the chosen one's session
    affinity) and what smaller prefill chunks save (``whole_chunks``: the best plan at
    the default chunk)."""
    slo = spec.slo
    return (
        f"{describe(plan)}: predicted {slo.tpot_percentile.value} TPOT {plan.tpot_ms:.1f} ms "
        f"(SLO {slo.tpot_ms:g} ms), {slo.ttft_percentile.value} TTFT {plan.ttft_ms:.0f} ms"
        + (f" (SLO {slo.ttft_ms:g} ms)" if slo.ttft_ms else "")
        + f", ${plan.usd_per_hour:.2f}/h of ${spec.budget.usd_per_hour:g}/h budget"
        + f"; max-model-len {plan.max_model_len} ({plan.context_note})"
        + _quantized_note(plan)
        + prefix_note(plan, unpinned)
        + chunk_note(plan, whole_chunks)
        + (f"; {plan.speculative_note}" if plan.speculative_note else "")
    )


def chunk_note(plan: Plan, whole_chunks: Plan | None) -> str:
    """Why the plan prefills in chunks smaller than the default, and what it saves."""
    if default_chunk(plan):
        return ""
    note = (
        f"; --max-num-batched-tokens {plan.max_num_batched_tokens}: a long prompt is "
        "prefilled over more, shorter steps, so a short answer shares fewer of them "
        f"(TTFT pays for it); with {DEFAULT_MAX_NUM_BATCHED_TOKENS}-token chunks "
    )
    if whole_chunks is None:
        return note + "no plan meets the SLO within the budget"
    return (
        note
        + f"the cheapest plan is {describe(whole_chunks)} at ${whole_chunks.usd_per_hour:.2f}/h"
    )


def prefix_note(plan: Plan, unpinned: Plan | None = None) -> str:
    """What the prefix cache is predicted to hold, and why the Service pins sessions."""
    if plan.prefix_hit_ratio <= 0.0:
        return ""
    note = f"; prefix cache: {plan.prefix_hit_ratio:.0%} of prompt tokens predicted hits"
    if plan.session_affinity:
        note += (
            f"; sessionAffinity: {plan.session_affinity} keeps each session on the replica "
            "that holds its history"
        )
        if unpinned is not None:
            note += (
                f" (spread at random: {unpinned.prefix_hit_ratio:.0%} hits, "
                f"{describe(unpinned)} at ${unpinned.usd_per_hour:.2f}/h)"
            )
    return note


def _quantized_note(plan: Plan) -> str:
    """For a plan with quantized weights or KV: that its outputs differ, and why."""
    changed = changes_outputs(plan)
    if not changed:
        return ""
    note = f"; {changed}: outputs differ from bf16"
    if plan.weight_dtype not in SIXTEEN_BIT:
        note += f"; {plan.weights_note}"
    if plan.kv_dtype not in SIXTEEN_BIT:
        note += "; pin kvDtypes: [auto] for a 16-bit KV cache"
    return note


def lost_to(plan: Plan, winner: Plan, kv_dtypes: tuple[str, ...] = ()) -> str:
    """Why a runner-up lost to the chosen plan."""
    extra = plan.usd_per_hour - winner.usd_per_hour
    lower = "lower" if plan.tpot_ms < winner.tpot_ms else "higher"
    tpot = f"same cost, {lower} TPOT ({plan.tpot_ms:.1f} vs {winner.tpot_ms:.1f} ms)"
    gpus, fewest = plan.replicas * plan.tp, winner.replicas * winner.tp
    if extra > 1e-9:
        why = f"costs ${extra:.2f}/h more"
    elif (changed := changes_outputs(plan)) and not changes_outputs(winner):
        why = f"{tpot}, but {changed} would change the outputs"  # lost the tie on quantization
    elif gpus > fewest:  # at equal cost (owned GPUs at $0), the fewest GPUs win
        why = f"{tpot}, but it takes {gpus} GPUs where {fewest} do"
    else:
        why = tpot
    return f"{describe(plan, kv_dtypes)}: {why}"


def over_budget(plan: Plan, budget: float, kv_dtypes: tuple[str, ...] = ()) -> str:
    """A plan that meets the SLO but not the budget, and by how much."""
    gap = plan.usd_per_hour - budget
    return (
        f"{describe(plan, kv_dtypes)} meets the SLO at ${plan.usd_per_hour:.2f}/h, "
        f"${gap:.2f} over budget"
    )


FP8_WOULD_WORK = "fp8 weights would work: "


def with_fp8_weights(plan: Plan) -> str:
    """The fix for a target that only bf16 weights kept from a plan."""
    return (
        f"{FP8_WOULD_WORK}{describe(plan)}, predicted TPOT {plan.tpot_ms:.1f} ms, "
        f"${plan.usd_per_hour:.2f}/h; allow them with constraints.weightDtypes: [bf16, fp8] "
        "(outputs differ from bf16)"
    )


def with_other_gpus(plan: Plan, allowed: list[str]) -> str:
    """The fix for a target whose pinned GPU types keep it from a plan."""
    return (
        f"{plan.gpu} GPUs would work: {describe(plan)}, predicted TPOT {plan.tpot_ms:.1f} ms"
        f"{f', TTFT {plan.ttft_ms:.0f} ms' if plan.ttft_ms else ''}, "
        f"${plan.usd_per_hour:.2f}/h; allow them with constraints.gpuTypes: "
        f"[{', '.join(allowed)}]"
    )


def too_long(model: str, prompt: float, output: float, context: int) -> str:
    """The headline when the workload's lengths put a tenth of its requests beyond the
    model's context. It names the 90th percentiles as what the lengths the user gave
    imply (a mean alone implies them too), never as a p90 the user wrote."""
    where = f"{model}'s {context:,}-token context"
    if prompt > context:
        what = (
            f"prompts at the 90th percentile of the workload's lengths ({prompt:,.0f} "
            f"tokens) exceed {where}"
        )
    else:
        what = (
            f"prompts and answers at the 90th percentile of the workload's lengths "
            f"({prompt:,.0f} + {output:,.0f} tokens) exceed {where}"
        )
    return (
        f"{what}; vLLM refuses such requests, so no GPU serves this workload: serve a "
        "model with a longer context, or shorten them"
    )


def reasons(result: SearchResult, spec: ServingTargetSpec) -> list[str]:
    """The lines a user reads first: rejections by class and, with no plan, why not."""
    rejections = result.rejections
    counts = Counter(r.category for r in rejections)
    lines = [f"{n} candidate(s) rejected: {cat}" for cat, n in counts.most_common()]
    if result.feasible:
        notes = [aim_note(spec), *burst_note(spec), *owned_note(result.plan, spec)]
        if result.mixed is not None:
            notes.append(mixed(result.mixed, result.plan))
        return [*notes, *lines]
    if result.alternatives:
        lines.insert(
            0,
            f"no plan meets the SLO within ${spec.budget.usd_per_hour:g}/h; "
            f"cheapest that meets it: {result.alternatives[0].summary}",
        )
    else:
        # What would work comes second: the short form shows the first three lines.
        lines[:0] = [_no_plan(rejections, spec), *_nearest_misses(rejections, spec)]
    return lines


def aim_note(spec: ServingTargetSpec) -> str:
    """What share of requests replicas are sized for, and why the price includes it."""
    percentile = spec.slo.tpot_percentile
    return (
        f"sized for {percentile.aim * 100:g} % of requests within the TPOT bound: the "
        f"{percentile.value} SLO plus half its allowed misses, which the operator's loop "
        "aims at too, so the price is what it is expected to spend on spec.workload"
    )


def owned_note(plan: Plan | None, spec: ServingTargetSpec) -> list[str]:
    """How many of the owned GPUs of the plan's type it uses, where it has any."""
    owned = (spec.pricing.owned or {}).get(plan.gpu) if plan is not None else None
    if plan is None or owned is None:
        return []
    gpus = plan.replicas * plan.tp
    used, beyond = min(gpus, owned.count), max(gpus - owned.count, 0)
    more = f", and {beyond} more at the on-demand price" if beyond else ""
    return [
        f"uses {used} of the {owned.count} owned {plan.gpu} GPUs at "
        f"${owned.usd_per_gpu_hour:.2f}/GPU-h{more}; among plans of equal cost the one with "
        "the fewest GPUs wins"
    ]


def mixed(fleet: MixedFleet, single: Plan | None) -> str:
    """Why the fleet of several GPU types is the plan (``fleet.summary`` says what it is):
    it costs less than the best single type (named, with its cost), or no single type
    serves."""
    if single is None:
        lead = "no single GPU type serves this target here, but pools of several do"
    else:
        saving = single.usd_per_hour - fleet.usd_per_hour
        lead = (
            f"pools of several GPU types cost ${saving:.2f}/h less than the best single "
            f"type ({describe(single)}: ${single.usd_per_hour:.2f}/h)"
        )
    return f"{lead}; one Deployment per pool, behind one Service"


def gpus_of(plan: Plan) -> str:
    """The plan's GPU types: ``l4``, or a mixed fleet's ``a100-80gb+l4``."""
    return "+".join(p.gpu for p in plan.pools) if plan.pools else plan.gpu


def burst_note(spec: ServingTargetSpec) -> list[str]:
    """The capacity held for bursts, where it is more than the mean rate's headroom."""
    workload, aim = spec.workload, spec.slo.burst_aim
    rate = workload.requests_per_second
    held = burst_rate(rate, workload.arrival_dispersion or 1.0, aim)
    if held <= rate * HEADROOM:
        return []
    return [
        f"holds capacity for {held:.3g} req/s, the 15-s rate {aim * 100:g} % of requests "
        f"arrive into at arrivalDispersion {workload.arrival_dispersion:g} (the mean "
        f"{rate:g} req/s with its headroom: {rate * HEADROOM:.3g})"
    ]


LATENCY_MISSES = ("TPOT over SLO", "TTFT over SLO")
CLOSEST = "closest: "  # the line that names the latency miss nearest its bound


def _no_plan(rejections: list[Rejection], spec: ServingTargetSpec) -> str:
    """The headline when no candidate meets the SLO: blame what actually stopped them."""
    counts = Counter(r.category for r in rejections)
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
    return _cannot_run(rejections)


# Rejections that say where a GPU is missing (an engine image, a node), not why the
# candidates that have one cannot run.
PLACEMENT_MISSES = ("no engine", "not in cluster")
FIXES = {
    "does not fit": "allow GPUs with more memory (constraints.gpuTypes), more tensor "
    "parallelism (constraints.maxTensorParallel) or quantized weights (constraints.weightDtypes)",
    "no checkpoint": "name one in spec.engine.checkpoints, or allow bf16 weights "
    "(constraints.weightDtypes)",
    "invalid": "change constraints.weightDtypes, kvDtypes or maxTensorParallel as each says",
    "no engine": "configure that engine image, or allow CUDA GPUs (constraints.gpuTypes)",
    "not in cluster": "add the GPU nodes it names",
}


def _cannot_run(rejections: list[Rejection]) -> str:
    """The headline when no candidate reached the latency model: the reason they share
    (ignoring GPUs with no engine or node, unless that is all there is) and its fix."""
    if not rejections:
        return "no candidate can run at all: no GPU or dtype is allowed"
    blocked = [r for r in rejections if r.category not in PLACEMENT_MISSES] or rejections
    if len({r.detail for r in blocked}) == 1:
        return f"no candidate can run: {blocked[0].detail}"
    counts = Counter(r.category for r in blocked)
    if len(counts) > 1:
        listed = ", ".join(f"{cat} ({n})" for cat, n in counts.most_common())
        return f"no candidate can run at all: {listed}"
    widest = max(blocked, key=lambda r: r.tp)  # the best chance, for "does not fit"
    category = widest.category
    return (
        f"no candidate can run: all {len(blocked)} are rejected as {category}, e.g. "
        f"{widest.gpu} TP{widest.tp} {widest.weight_dtype}/KV {widest.kv_dtype}: "
        f"{widest.detail}; {FIXES.get(category, 'see the rejections below')}"
    )


def _nearest_misses(rejections: list[Rejection], spec: ServingTargetSpec) -> list[str]:
    """For latency misses, the candidate nearest its bound and what would let it run.

    Nearness is the reached latency over the SLO's bound for that metric (TPOT in ms
    against ``tpotMs``, TTFT against ``ttftMs``), so a TTFT of 2,272 ms against 2,000 ms
    (1.14x) is as near as a TPOT of 114 ms against 100 ms; milliseconds of the two
    metrics do not compare."""
    bounds = {"TPOT over SLO": spec.slo.tpot_ms, "TTFT over SLO": spec.slo.ttft_ms}
    misses = [r for r in rejections if bounds.get(r.category)]
    if not misses:
        return []

    def over(r: Rejection) -> float:
        return float(r.detail.split()[0]) / float(bounds[r.category] or 1.0)

    best = min(misses, key=over)
    metric = best.category.split()[0]
    reached = best.detail.split()[0]
    hint = (
        f"{CLOSEST}{best.gpu} TP{best.tp} {best.weight_dtype}/KV {best.kv_dtype} reaches "
        f"{metric} {best.detail} ({over(best):.2f}x the bound); relax slo."
        f"{metric.lower()}Ms to at least {reached} ms"
    )
    if metric == "TTFT":  # at batch 1 TTFT is the long prompts' prefill alone
        hint += (
            ": at batch 1 it is the prefill of the workload's long prompts, so if the "
            "served prompts are shorter than spec.workload.promptTokens says, declare them"
        )
    return [hint]


def explain_result(result: SearchResult) -> str:
    """A multi-line explanation: the choice, the runners-up and every rejection class."""
    lines = []
    if result.mixed is not None:  # the reasons say why it beats the best single type
        lines.append(f"Chosen: {result.mixed.summary}")
    elif result.plan:
        lines.append(f"Chosen: {result.plan.summary}")
        if result.step_times_from:
            lines.append(f"  - step times from {result.step_times_from}")
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


def explain_step(
    step: StepBreakdown, curves: str, tpot_s: float | None = None, evictions: float = 0.0
) -> list[str]:
    """Where a predicted decode step goes, against its physical floor (``rooftop predict
    --explain``): the floor is what the HBM must stream; the rest is named. ``tpot_s``
    above the step is the wait of requests evicted from a full KV cache."""
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
        ("elementwise kernels (norms, rotary, activation, KV-cache writes)", step.elementwise_s),
        ("engine fixed costs (scheduling, launch, per-layer)", step.overhead_s),
    )
    lines += [f"  {seconds * 1e3:8.2f} ms  {name}" for name, seconds in parts]
    if step.host_s > max(step.kernels_s, step.floor_s):
        lines.append(
            f"  the engine's own host work for the step ({step.host_s * 1e3:.2f} ms: "
            "scheduling, inputs, sampling bookkeeping) takes longer than the GPU's, so "
            "it sets the pace"
        )
    elif step.floor_s > step.kernels_s:
        lines.append("  the kernels' sum is below the floor, so the floor is the prediction")
    if evictions > 0 and tpot_s is not None:
        lines.append(
            f"TPOT {tpot_s * 1e3:.2f} ms: the KV cache is full, so each request is evicted "
            f"{evictions:.2f} times on average, prefilled again (in the step above) and "
            f"waits out of the batch meanwhile (+{(tpot_s - total) * 1e3:.2f} ms per token)"
        )
    return lines

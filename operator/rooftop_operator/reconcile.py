"""One reconcile pass for one ServingTarget: plan, apply the children, write status.

``reconcile`` parses the spec with the pydantic models, plans with the planner,
server-side applies the children (Deployment, Service, PodMonitor) and writes status:
plan, gpu, slo, observedGeneration and the Planned, Feasible, Deployed and WithinBudget
conditions (read-modify-write, see ``kube.update_status``).

Failure policy: an invalid spec or an infeasible target is a condition and an event,
never an exception, and changes no workload; a target waiting for GPU nodes is planned
again by a timer (``handlers.replan_waiting``), not by failing. API errors propagate as
``KubeError``; the kopf handlers turn them into retries.

The feedback loop (``loop.py``) re-applies the children through ``apply_children`` and
writes ``status.plan.replicas``/``maxNumSeqs``. A later reconcile of the same spec
generation (an operator restart, a repaired Deployment) keeps those
(``keep_loop_scale``); a spec edit or a new engine shape starts from the new plan.
"""

from __future__ import annotations

import json
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, replace
from typing import Any

from rooftop_api import conditions as cnd
from rooftop_api.conditions import Condition
from rooftop_api.spec import (
    MeasuredWorkload,
    Mode,
    ServingTargetSpec,
    ServingTargetStatus,
)
from rooftop_control.control import RESHAPE_GAIN, WorkloadReplan
from rooftop_control.traffic import with_measured
from rooftop_operator import builders, children
from rooftop_operator.errors import OperatorError
from rooftop_operator.kube import KubeError
from rooftop_operator.runtime import Obj, Runtime
from rooftop_operator.specs import SpecError, TargetRef, parse_spec, slo_text
from rooftop_planner import explain
from rooftop_planner.catalog import Catalog
from rooftop_planner.errors import PlannerError
from rooftop_planner.explain import replicas_of
from rooftop_planner.inventory import GpuInventory, Placement, held_gpus, inventory_from_nodes
from rooftop_planner.lifecycle import DOWNLOAD_BYTES_PER_S
from rooftop_planner.plan import Plan, without_drafts
from rooftop_planner.pricing import PodsPrice, replica_price, with_default
from rooftop_planner.result import SearchResult

PODMONITOR_API = ("monitoring.coreos.com/v1", "podmonitors")


# A target only GPU nodes the cluster lacks could serve is planned again every
# ``OperatorConfig.nodes_retry_s`` (``replan_waiting``), so nodes added later (by hand
# or by an autoscaler) are picked up without a spec edit.
WAITING_FOR_NODES = "waiting-for-nodes"
# A loop re-plan (``LOOP_REPLANS``) that left the running engine's shape as it was: the
# loop gives back the batch-cap cooldown it started (``control.plan_kept``).
KEPT = "kept"


def plan_changed(old: Plan | None, new: Plan) -> bool:
    """Whether the engine changed: its shape or its scale (a "PlanChanged" event)."""
    return old is None or (old.shape, old.scale) != (new.shape, new.scale)


def stored_plan(status: ServingTargetStatus) -> Plan | None:
    """``status.plan`` as a plan, or None when there is none."""
    return None if status.plan is None else Plan.from_status(status.plan)


def describe_plan(plan: Plan) -> str:
    """``2 replicas of 1x h100-sxm (TP1), batch 64, fp8/auto, $6.98/h``; a mixed fleet's
    pools joined by `` + ``."""
    if plan.pools:
        return " + ".join(map(describe_plan, plan.pools))
    return (
        f"{replicas_of(plan.replicas, plan.tp, plan.gpu)}, "
        f"batch {plan.max_num_seqs}, {plan.weight_dtype}/{plan.kv_dtype}, "
        f"${round(plan.usd_per_hour, 3):.2f}/h"
    )


def _initial(status: ServingTargetStatus) -> list[Condition]:
    """Ready and SLOMet belong to other writers; seed them so columns are never blank."""
    seeds = [
        Condition(cnd.READY, "False", "Deploying", "waiting for the engine Deployment"),
        Condition(cnd.SLO_MET, "Unknown", "NotObserved", "no engine metrics observed yet"),
    ]
    return [c for c in seeds if cnd.find(status.conditions, c.type) is None]


def with_conditions(
    status: ServingTargetStatus,
    updates: Sequence[Condition],
    *,
    now: str,
    generation: int,
    **fields: Any,
) -> ServingTargetStatus:
    """``status`` with ``fields`` (its field names) set and ``updates`` merged into its
    conditions."""
    merged = cnd.merge(
        status.conditions, [*_initial(status), *updates], now=now, generation=generation
    )
    return status.model_copy(
        update={**fields, "conditions": merged, "observed_generation": generation}
    )


def controlled_by(obj: Mapping[str, Any], uid: str) -> bool:
    refs = obj.get("metadata", {}).get("ownerReferences") or []
    return any(r.get("uid") == uid and r.get("controller") for r in refs)


def is_subset(desired: Any, actual: Any) -> bool:
    """Whether every field we set already has our value (server defaults aside), so
    the apply can be skipped. Lists must match element by element."""
    if isinstance(desired, Mapping):
        return isinstance(actual, Mapping) and all(
            k in actual and is_subset(v, actual[k]) for k, v in desired.items()
        )
    if isinstance(desired, list):
        return (
            isinstance(actual, list)
            and len(desired) == len(actual)
            and all(is_subset(d, a) for d, a in zip(desired, actual, strict=True))
        )
    return bool(desired == actual)


def reconcile(
    rt: Runtime,
    body: Mapping[str, Any],
    *,
    step_time_scale: float = 1.0,
    requests_per_second: float | None = None,
    cause: str = "spec_change",
    acceptance: float | None = None,
    relengths: WorkloadReplan | None = None,
) -> str:
    """One pass for one target; returns the result recorded in metrics (``success``,
    ``skipped`` for invalid/infeasible targets), or ``WAITING_FOR_NODES`` when only GPU
    nodes the cluster lacks could serve it (``replan_waiting`` then plans it again), or
    ``KEPT`` for a loop re-plan (``LOOP_REPLANS``) that kept the running engine's shape.

    ``acceptance``: the per-token draft acceptance the feedback loop measured, planned
    with in place of the spec's (and kept in ``status.plan.measuredAcceptance``, which a
    later pass of the same spec generation plans with again); ``relengths``: the served
    prompt and output lengths it measured, likewise (``status.plan.measuredWorkload``),
    at its rate, where a plan of another shape rolls out only if it pays
    (``control.WorkloadReplan``)."""
    ref = TargetRef.from_body(body)
    try:
        spec = with_default(parse_spec(body.get("spec") or {}), rt.config.default_pricing)
    except SpecError as err:
        _invalid(rt, body, ref, err)
        return "skipped"
    if acceptance is None:
        acceptance = resumed_acceptance(body)
    workload = resumed_workload(body) if relengths is None else relengths.workload
    if relengths is not None:
        requests_per_second = relengths.requests_per_second
    planning = _Planning(
        step_time_scale, requests_per_second, cause, acceptance, workload, relengths
    )
    if not counts_gpus(rt, spec):
        return _plan_and_deploy(rt, body, ref, spec, None, planning)
    # One target at a time from reading the free GPUs to applying its Deployment, so
    # the next one planned reads that Deployment's replicas (``held_gpus``) and never
    # counts the same free GPUs twice.
    with rt.inventory_lock:
        counted = gpu_inventory(rt, spec, ref)
        return _plan_and_deploy(rt, body, ref, spec, counted, planning)


def resumed_acceptance(body: Mapping[str, Any]) -> float | None:
    """The acceptance the loop measured and planned the current spec generation with
    (``status.plan.measuredAcceptance``), None after an edit or where it never did:
    an operator restart re-plans the same spec, and must not undo the loop's plan."""
    if not _same_generation(body):
        return None
    plan = stored_plan(ServingTargetStatus.read(body.get("status")))
    return None if plan is None else plan.measured_acceptance


def resumed_workload(body: Mapping[str, Any]) -> MeasuredWorkload | None:
    """The served lengths the loop measured and planned the current spec generation
    with (``status.plan.measuredWorkload``), as ``resumed_acceptance``."""
    if not _same_generation(body):
        return None
    plan = stored_plan(ServingTargetStatus.read(body.get("status")))
    return None if plan is None else plan.measured_workload


def _as_measured(spec: ServingTargetSpec, planning: _Planning) -> ServingTargetSpec:
    """``spec`` planned with a measured draft acceptance and served lengths (None: as
    written)."""
    workload = with_measured(spec.workload, planning.workload)
    if planning.acceptance is not None:
        workload = workload.model_copy(update={"acceptance_rate": planning.acceptance})
    return spec.model_copy(update={"workload": workload})


@dataclass(frozen=True)
class _Planning:
    """What one pass plans with beyond the spec (``reconcile``'s arguments)."""

    step_time_scale: float
    requests_per_second: float | None
    cause: str
    acceptance: float | None
    workload: MeasuredWorkload | None
    relengths: WorkloadReplan | None = None


def _plan_and_deploy(
    rt: Runtime,
    body: Mapping[str, Any],
    ref: TargetRef,
    spec: ServingTargetSpec,
    counted: GpuInventory | None,
    planning: _Planning,
) -> str:
    """Plan (for the ``counted`` GPUs, when given; ``planning``: the step-time factor,
    rate, cause, measured acceptance and lengths, see ``reconcile``) and deploy or say
    why not."""
    cause, acceptance = planning.cause, planning.acceptance
    inventory = {} if counted is None else {"gpu_inventory": counted}
    try:
        result = rt.plan(
            _as_measured(spec, planning),
            catalog=rt.catalog,
            step_time_scale=planning.step_time_scale,
            requests_per_second=planning.requests_per_second,
            engine_families=children.engine_families(rt.config, spec),
            **inventory,
        )
    except PlannerError as err:  # unknown model/GPU, bad modelConfig: the spec's fault
        _plan_error(rt, body, ref, spec, err)
        return "skipped"
    plan, kept = result.deployed, False
    old_plan = stored_plan(ServingTargetStatus.read(body.get("status")))
    if plan is not None and planning.relengths is not None:
        plan, kept = _reshaped(rt, body, spec, (old_plan, plan), planning.relengths, counted)
    if not kept:  # a kept plan's figures stay as recorded when it was deployed
        _record_plan(rt, ref, spec, result)
    if plan is None and cause in LOOP_REPLANS:
        _no_plan_at_acceptance(rt, body, acceptance, result)
        return "skipped"
    if plan is None:
        _infeasible(rt, body, ref, spec, result)
        return WAITING_FOR_NODES if result.beyond_inventory else "skipped"
    advice = "" if result.mixed is None else explain.mixed(result.mixed, result.plan)
    plan = replace(plan, measured_acceptance=acceptance, measured_workload=planning.workload)
    # Judged on what was applied: ``keep_loop_scale`` may have put the loop's drafts back
    # on a plan that differed from the running one only in them.
    applied = _deploy(rt, body, ref, spec, plan, cause, counted, advice) or plan
    if cause in LOOP_REPLANS and old_plan is not None and old_plan.shape == applied.shape:
        if not kept:  # a plan that does not pay said so (``_reshaped``)
            _same_engine(rt, body, old_plan, planning)
        return KEPT
    return "success"


def _same_engine(rt: Runtime, body: Mapping[str, Any], plan: Plan, planning: _Planning) -> None:
    """A PlanKept event: the loop's re-plan chose the engine that runs."""
    measured = "served lengths" if planning.relengths is not None else "measured acceptance"
    message = f"planned again with the {measured}: the running engine ({describe_plan(plan)}) "
    rt.emit(body, "Normal", "PlanKept", message + "is still the cheapest that meets the SLO")


def _reshaped(
    rt: Runtime,
    body: Mapping[str, Any],
    spec: ServingTargetSpec,
    plans: tuple[Plan | None, Plan],
    relengths: WorkloadReplan,
    inventory: GpuInventory | None,
) -> tuple[Plan, bool]:
    """The plan a re-plan with the served lengths deploys, and whether it is the running
    one, kept because the new plan does not pay (``WorkloadReplan.pays``); a new shape
    starts with the pods that carry the load (``transition_pods``). ``plans``: the
    running plan (None where status holds none) and the one the served lengths got."""
    old_plan, plan = plans
    if old_plan is None or plan.pools or old_plan.pools or old_plan.shape == plan.shape:
        return plan, False
    if not relengths.pays(plan.usd_per_hour):
        rt.emit(body, "Normal", "PlanKept", _does_not_pay(plan, relengths))
        return old_plan, True
    price = replica_price(spec, rt.catalog, plan.gpu, plan.tp)
    pods = relengths.pods(plan.replicas)
    return transition_pods(plan, pods, price, spec, inventory), False


def _does_not_pay(plan: Plan, relengths: WorkloadReplan) -> str:
    """Why a plan of another shape for the served lengths is not deployed."""
    running, new = relengths.running_usd_per_hour, plan.usd_per_hour
    saving = 1.0 - new / running if running > 0 else 0.0
    return (
        f"the served lengths plan {describe_plan(plan)} at "
        f"{relengths.requests_per_second:.2f} req/s, {saving:.0%} under the "
        f"${running:.2f}/h the running shape costs at that rate: a new shape rolls "
        "every pod and starts the step-time factor over, so it must save "
        f"{RESHAPE_GAIN:.0%}; the running plan is kept"
    )


def counts_gpus(rt: Runtime, spec: ServingTargetSpec) -> bool:
    """Whether this target is planned and scaled within the GPUs the cluster's nodes have
    free (``gpuInventory: nodes``). A simulated engine runs on any node, so the GPUs the
    nodes offer do not bound it."""
    return rt.config.gpu_inventory and spec.mode is not Mode.SIMULATED


def gpu_inventory(rt: Runtime, spec: ServingTargetSpec, ref: TargetRef) -> GpuInventory:
    """The GPUs the cluster's Nodes offer this target's pods now (its nodeSelector and
    tolerations), less what every other pod holds or waits for and what the other
    targets' engine Deployments ask for (``inventory.held_gpus``; this target's own are
    replaced by its plan).
    Read on every plan rather than watched: plans happen on spec changes, restarts and
    scale-ups, rarely enough that a list is cheap, and a node added or a pod gone since
    the last plan is seen by the next one."""
    placement = Placement.of(spec.constraints)
    pods, engines = rt.kube.list_unfinished_pods(), rt.kube.list_engine_deployments()
    held = held_gpus(pods, rt.catalog, (ref.namespace, ref.name), engines)
    return inventory_from_nodes(rt.kube.list_nodes(), rt.catalog, placement, held)


def _invalid(rt: Runtime, body: Mapping[str, Any], ref: TargetRef, err: SpecError) -> None:
    cond = Condition(cnd.PLANNED, "False", "InvalidSpec", str(err))
    if _write(rt, ref, [cond], seen=body):
        rt.emit(body, "Warning", "InvalidSpec", str(err))


def _plan_error(
    rt: Runtime, body: Mapping[str, Any], ref: TargetRef, spec: ServingTargetSpec, err: Exception
) -> None:
    message = f"planner error: {err}"
    cond = Condition(cnd.PLANNED, "False", "PlannerError", message)
    if _write(rt, ref, [cond], seen=body, slo=slo_text(spec)):
        rt.emit(body, "Warning", "PlannerError", message)


def _infeasible(
    rt: Runtime,
    body: Mapping[str, Any],
    ref: TargetRef,
    spec: ServingTargetSpec,
    result: SearchResult,
) -> None:
    """Say why no plan fits; leave the workload exactly as it was. The reason tells
    the two fixes apart: ``Infeasible`` (change the spec) and ``NodesUnavailable``
    (a GPU node the cluster lacks would do: add one, and the re-plan uses it)."""
    explanation = str(result.explain())
    reason = "NodesUnavailable" if getattr(result, "beyond_inventory", None) else "Infeasible"
    conds = [
        Condition(cnd.PLANNED, "True", "Planned", "the planner ran on this generation"),
        Condition(cnd.FEASIBLE, "False", reason, explanation),
    ]
    if _write(rt, ref, conds, seen=body, slo=slo_text(spec)):
        rt.emit(body, "Warning", reason, explanation)


def _no_plan_at_acceptance(
    rt: Runtime, body: Mapping[str, Any], acceptance: float | None, result: SearchResult
) -> None:
    """The loop's re-plan with the acceptance it measured found no plan: the running
    one stays and the loop goes on scaling it; a Warning event says why. The target's
    conditions are left as its spec's plan set them: a Feasible flipped to False here
    would flip back at the next operator restart, which plans the spec as written."""
    measured = (
        f"drafts accepted at {acceptance:.2f} per token"
        if acceptance is not None
        else "the served lengths"
    )
    message = (
        f"planned again with {measured}, no plan fits: {result.explain()}; the running plan stays"
    )
    rt.emit(body, "Warning", "ReplanInfeasible", message)


def _deploy(
    rt: Runtime,
    body: Mapping[str, Any],
    ref: TargetRef,
    spec: ServingTargetSpec,
    plan: Plan,
    cause: str,
    inventory: GpuInventory | None = None,
    advice: str = "",
) -> Plan | None:
    """Apply the plan's children (``inventory``: the cluster's free GPUs, with
    ``gpuInventory: nodes``; a rollout surges only into them; ``advice``: why a mixed
    fleet, said in the Feasible condition). Returns the plan applied: ``plan`` at the
    loop's scale and drafts where it keeps them (``keep_loop_scale``), or None where the
    plan could not be deployed."""
    old_plan = stored_plan(ServingTargetStatus.read(body.get("status")))
    if cause != "spec_change" or _same_generation(body):
        # a re-plan with the measured acceptance chooses the drafts itself
        plan = keep_loop_scale(plan, old_plan, keep_drafts=cause != ACCEPTANCE)
    try:
        apply_children(rt, ref, spec, plan, inventory)
    except (builders.UnsupportedPlan, ChildConflict) as err:
        reason = "UnsupportedPlan" if isinstance(err, builders.UnsupportedPlan) else "NameConflict"
        _not_deployed(rt, body, ref, spec, plan, reason, str(err))
        return None
    except KubeError as err:
        if not err.transient and not err.namespace_terminating:  # refused: say so on it
            message = f"the API server refused the engine's objects: {err}"
            _not_deployed(rt, body, ref, spec, plan, "ApplyRejected", message)
        raise  # reconcile_target retries, backing off
    deployed = Condition(cnd.DEPLOYED, "True", "Applied", f"engine {describe_plan(plan)}")
    cache = model_cache_condition(rt.catalog, spec, plan)
    conds = [*_plan_conditions(spec, plan, advice), deployed, *([cache] if cache else [])]
    shown = {"plan": plan.to_status(), "gpu": explain.gpus_of(plan), "slo": slo_text(spec)}
    _write(rt, ref, conds, seen=body, **shown)
    if plan_changed(old_plan, plan):
        verb = "PlanChanged" if old_plan else "Planned"
        rt.emit(body, "Normal", verb, f"{describe_plan(plan)} ({cause})")
        if old_plan:
            rt.metrics.record_decision(ref.namespace, ref.name, "replan", cause)
    if cache is not None and cache.status == "False" and not old_plan:
        rt.emit(body, "Warning", cache.reason, cache.message)
    return plan


def model_cache_condition(
    catalog: Catalog, spec: ServingTargetSpec, plan: Plan
) -> Condition | None:
    """ModelCached: whether a new engine pod finds the weights on a volume or downloads
    them (None for a simulated engine, which loads none).

    Why a condition: with the default emptyDir every new pod (each scale-up, rollout,
    rescheduled pod) downloads the whole checkpoint again, which is slow, costs egress
    and makes the loop's start-up long; nothing else would tell the user.
    """
    if spec.mode is Mode.SIMULATED:
        return None
    life = children.pod_lifecycle(catalog, spec, plan)
    if not life.downloads:
        where = "a model volume" if spec.engine.model_volume else "a PersistentVolumeClaim"
        return Condition(
            cnd.MODEL_CACHED, "True", "Persistent", f"engine pods load the weights from {where}"
        )
    gb, fetch_s = life.checkpoint_bytes / 1e9, life.checkpoint_bytes / DOWNLOAD_BYTES_PER_S
    return Condition(
        cnd.MODEL_CACHED,
        "False",
        "EveryPodDownloads",
        f"every new engine pod downloads the {gb:.0f} GB checkpoint into its own emptyDir "
        f"(about {fetch_s:.0f} s at {DOWNLOAD_BYTES_PER_S / 1e6:.0f} MB/s); name a "
        "ReadWriteMany PersistentVolumeClaim in spec.engine.modelCache.pvcName, or serve "
        "prepared files from spec.engine.modelVolume",
    )


def _not_deployed(
    rt: Runtime,
    body: Mapping[str, Any],
    ref: TargetRef,
    spec: ServingTargetSpec,
    plan: Plan,
    reason: str,
    message: str,
) -> None:
    """Deployed=False with ``reason``; a Warning event only when that is news."""
    failed = Condition(cnd.DEPLOYED, "False", reason, message[:1000])
    if _write(rt, ref, [*_plan_conditions(spec, plan), failed], seen=body, slo=slo_text(spec)):
        rt.emit(body, "Warning", reason, message[:1000])


# The cause of a re-plan the feedback loop asks for with the acceptance it measured.
ACCEPTANCE = "acceptance"
# The cause of a re-plan the feedback loop asks for with the lengths it measured.
WORKLOAD = "workload"
LOOP_REPLANS = (ACCEPTANCE, WORKLOAD)


def transition_pods(
    plan: Plan,
    wanted: int,
    price: PodsPrice,
    spec: ServingTargetSpec,
    inventory: GpuInventory | None,
) -> Plan:
    """``plan`` (of another shape than the running one) at ``wanted`` pods where that
    is more than its own, within maxReplicas, the budget and the free GPUs where
    counted (``WorkloadReplan.pods``: the old pods the load needs now, which the
    rolling update keeps serving only up to the new count). The loop gives any extra
    pods back after its scale-down window, once the new ones serve."""
    most = price.affordable(spec.budget.usd_per_hour, min(wanted, spec.constraints.max_replicas))
    if inventory is not None:
        most = min(most, inventory.replicas_fit(plan.gpu, plan.tp))
    pods = max(plan.replicas, most)
    if pods == plan.replicas:
        return plan
    return plan.rescaled(pods, usd_per_hour=price.usd_per_hour(pods))


def _same_generation(body: Mapping[str, Any]) -> bool:
    """Whether status was written for the current spec (a resume, not an edit)."""
    seen = ServingTargetStatus.read(body.get("status")).observed_generation
    return seen is not None and seen == (body.get("metadata") or {}).get("generation")


def keep_loop_scale(plan: Plan, old_plan: Plan | None, keep_drafts: bool = True) -> Plan:
    """``plan`` with the replicas and batch cap the feedback loop last chose.

    Why: the planner sizes for the spec's expected rate, the loop for the observed one.
    A resume (operator restart) or a repair of a deleted Deployment re-plans the same
    spec; resetting to the planned size would undo the loop's last decision, e.g. drop
    the replicas a load spike needed. Kept only when the engine shape (GPU, TP, dtypes,
    context) is unchanged: a new shape is a new operating curve and starts from its plan.
    The drafts the loop chose from the acceptance it measured (``_loop_drafts``) are
    kept too, unless ``keep_drafts`` is False (a re-plan with that acceptance, which
    chooses them).
    """
    if old_plan is None:
        return plan
    if keep_drafts and old_plan.shape != plan.shape and _loop_drafts(plan, old_plan):
        # the loop re-planned speculation from the acceptance it measured: the same
        # spec planned again from its declared acceptance must not undo that
        plan = replace(plan, speculative_config=old_plan.speculative_config, speculative_note="")
    if old_plan.shape != plan.shape:
        return plan
    replicas, cap = old_plan.scale
    if replicas < 1 or cap < 1 or old_plan.scale == plan.scale:
        return plan
    if plan.pools:  # the same pools: each at the loop's last count and cap
        pools = tuple(
            p.rescaled(*o.scale, o.usd_per_hour)
            for p, o in zip(plan.pools, old_plan.pools, strict=True)
        )
        return replace(plan.rescaled(replicas, cap, old_plan.usd_per_hour), pools=pools)
    return plan.rescaled(replicas, cap)


def _loop_drafts(plan: Plan, old_plan: Plan) -> bool:
    """Whether ``old_plan`` is ``plan`` with the drafts the feedback loop chose: the
    same engine but for the speculative config, one of the same drafter or none, where
    ``plan`` speculates (``control.Decision.speculative_config``)."""
    if not plan.speculative_config or without_drafts(plan.shape) != without_drafts(old_plan.shape):
        return False
    if not old_plan.speculative_config:  # the loop turned it off
        return True
    drafter = ("method", "model")
    new, old = json.loads(plan.speculative_config), json.loads(old_plan.speculative_config)
    return all(new.get(k) == old.get(k) for k in drafter)


def _plan_conditions(spec: ServingTargetSpec, plan: Plan, advice: str = "") -> list[Condition]:
    cost, budget = round(plan.usd_per_hour, 3), spec.budget.usd_per_hour
    within = cost <= budget
    found = "a plan meets the SLO within the budget" + (f"; {advice}" if advice else "")
    return [
        Condition(cnd.PLANNED, "True", "Planned", plan.summary or describe_plan(plan)),
        Condition(cnd.FEASIBLE, "True", "PlanFound", found),
        Condition(
            cnd.WITHIN_BUDGET,
            "True" if within else "False",
            "WithinBudget" if within else "OverBudget",
            f"plan costs ${cost:.2f}/h of a ${budget:.2f}/h budget",
        ),
    ]


def _write(
    rt: Runtime,
    ref: TargetRef,
    conds: Sequence[Condition],
    *,
    seen: Mapping[str, Any] | None = None,
    **fields: Any,
) -> bool:
    """Merge our conditions and fields into status; True if anything changed. Written
    against ``seen``, the body this pass began with; read again only on a 409."""
    now = rt.now()

    def mutate(stored: Obj) -> Obj:
        status = ServingTargetStatus.read(stored)
        return with_conditions(status, conds, now=now, generation=ref.generation, **fields).stored()

    return rt.kube.update_status(ref.namespace, ref.name, mutate, seen=seen) is not None


def _record_plan(
    rt: Runtime, ref: TargetRef, spec: ServingTargetSpec, result: SearchResult
) -> None:
    plan = result.deployed
    ttft = spec.slo.ttft_ms
    rt.metrics.record_plan(
        ref.namespace,
        ref.name,
        feasible=plan is not None,
        slo_tpot_s=spec.slo.tpot_ms / 1000.0,
        slo_ttft_s=None if ttft is None else ttft / 1000.0,
        slo_quantiles=(spec.slo.tpot_percentile.quantile, spec.slo.ttft_percentile.quantile),
        budget_usd_per_hour=spec.budget.usd_per_hour,
        gpu_type=None if plan is None else plan.gpu,  # a mix's: ``pools``, per type
        gpus=None if plan is None else gpu_count(plan),
        usd_per_hour=None if plan is None else plan.usd_per_hour,
        predicted_tpot_s=None if plan is None else plan.tpot_ms / 1000.0,
        predicted_ttft_s=None if plan is None or plan.ttft_ms is None else plan.ttft_ms / 1000.0,
        pools=()
        if plan is None
        else [(p.gpu, p.tp * p.replicas, p.usd_per_hour) for p in plan.pools],
    )


class ChildConflict(OperatorError, RuntimeError):
    """A child's name is taken by an object this target does not control."""


def gpu_count(plan: Plan) -> int:
    """The GPUs a plan's pods take, every pool's."""
    return sum(p.tp * p.replicas for p in plan.pools or (plan,))


def apply_children(
    rt: Runtime,
    ref: TargetRef,
    spec: ServingTargetSpec,
    plan: Plan,
    inventory: GpuInventory | None = None,
) -> None:
    """Server-side apply each child that differs from what is there (its fields, or
    the digest of what was last applied: see ``builders.with_applied_hash``). Raises
    ``ChildConflict`` rather than take over an object someone else created.
    ``inventory``: the cluster's free GPUs (None: not counted); each Deployment's
    rollout surges only into the replicas they hold for its shape, so its surge pods
    never wait for GPUs nobody frees."""
    inputs = children.engine_inputs(
        rt.catalog, rt.config, ref, spec, plan, pod_monitor=rt.kube.has_api(*PODMONITOR_API)
    )
    inputs = with_room(inputs, inventory)
    for child in map(builders.with_applied_hash, children.desired(inputs)):
        meta = child["metadata"]
        current = rt.kube.get(child["apiVersion"], child["kind"], ref.namespace, meta["name"])
        if current is not None and not controlled_by(current, ref.uid):
            raise ChildConflict(
                f"{child['kind']} {meta['name']} exists and is not owned by this ServingTarget"
            )
        if current is None and child["kind"] == "Deployment":
            # its first seconds of rollout events say "0/N ready" and nothing more: the
            # seeded Ready=False Deploying says as much (see PODS_LOOK_EVERY_S)
            rt.pods_listed[ref.uid] = rt.clock()
        if current is None or not is_subset(child, current):
            rt.kube.apply(child)
            if child["kind"] == "Deployment" and rt.config.fault_pause_after_apply_s:
                time.sleep(rt.config.fault_pause_after_apply_s)  # test hook, see settings


def with_room(
    inputs: builders.EngineInputs, inventory: GpuInventory | None
) -> builders.EngineInputs:
    """``inputs`` (each pool's) with the replicas the free GPUs hold for its shape."""
    if inventory is None:
        return inputs

    def room(inp: builders.EngineInputs) -> builders.EngineInputs:
        return replace(inp, inventory_replicas=inventory.replicas_fit(inp.plan.gpu, inp.plan.tp))

    return replace(room(inputs), pools=tuple(map(room, inputs.pools)))


def waiting_for_nodes(status: Mapping[str, Any]) -> bool:
    """Whether the last plan found that only GPU nodes the cluster lacks could serve the
    target (Feasible=False, reason NodesUnavailable). kopf asks it on every watch event
    of every target, so it validates the conditions alone, not the plan and figures."""
    conditions = ServingTargetStatus.read({"conditions": status.get("conditions")}).conditions
    feasible = cnd.find(conditions, cnd.FEASIBLE)
    return feasible is not None and (feasible.status, feasible.reason) == (
        "False",
        "NodesUnavailable",
    )

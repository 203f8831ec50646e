"""kopf handlers for ServingTarget, and the plain functions they call.

One reconcile pass (``reconcile``): parse the spec with the pydantic models, plan with
the planner, server-side apply the children (Deployment, Service, PodMonitor), write
status. Everything a pass needs arrives in a ``Runtime`` (API wrapper, catalog, planner,
event sink, metrics), so tests call ``reconcile`` with fakes and no cluster.

Who writes what in ``status`` (each with read-modify-write, see ``kube.update_status``):
- ``reconcile``: plan, gpu, slo, observedGeneration and the Planned, Feasible,
  Deployed and WithinBudget conditions.
- ``sync_readiness`` (Deployment events, and the feedback loop while a target is not
  ready): replicas, readyReplicas, ready and Ready (naming pods the scheduler cannot
  place: that changes no Deployment field, so no Deployment event reports it).
- the feedback loop (``loop.py``): observed and SLOMet (it may refresh WithinBudget).

Failure policy: an invalid spec or an infeasible target is a condition and an event,
never an exception, and changes no workload; a target waiting for GPU nodes is planned
again by a timer (``replan_waiting``), not by failing. API errors raise
``kopf.TemporaryError`` so kopf retries with a delay.

Registration: ``rooftop_operator.wiring`` registers these handlers, and the feedback
loop's, with kopf (importing this module registers nothing). The loop (``loop.py``)
decides replicas and batch cap from observed metrics, re-applies the children through
``apply_children`` and writes ``status.plan.replicas``/``maxNumSeqs``. A later
reconcile of the same spec generation (an operator restart, a repaired Deployment) keeps
those (``keep_loop_scale``); a spec edit or a new engine shape starts from the new plan.
"""

from __future__ import annotations

import asyncio
import dataclasses
import logging
import math
import time
from collections import OrderedDict
from collections.abc import Callable, Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Any, Protocol

import kopf

from rooftop_api import conditions as cnd
from rooftop_api.conditions import Condition
from rooftop_api.spec import (
    GROUP,
    KIND,
    PLURAL,
    VERSION,
    Mode,
    ServingTargetSpec,
    ServingTargetStatus,
)
from rooftop_operator import builders, children, metrics
from rooftop_operator.kube import Kube, KubeError
from rooftop_operator.loop_memory import EngineIndex, LoopMemory
from rooftop_operator.settings import OperatorConfig, configure
from rooftop_operator.specs import SpecError, TargetRef, parse_spec, slo_text
from rooftop_planner.catalog import Catalog, load_catalog
from rooftop_planner.explain import replicas_of
from rooftop_planner.inventory import GpuInventory, Placement, inventory_from_nodes
from rooftop_planner.lifecycle import DOWNLOAD_BYTES_PER_S
from rooftop_planner.plan import Plan
from rooftop_planner.result import SearchResult
from rooftop_planner.search import plan_target

log = logging.getLogger(__name__)

PODMONITOR_API = ("monitoring.coreos.com/v1", "podmonitors")
RETRY_DELAY_S = 10.0  # first retry after a failed API call, doubling up to:
MAX_RETRY_DELAY_S = 600.0
# A Deployment that is not ready has its pods listed (to name one the scheduler cannot
# place) and its progress written at most this often, and not in its first half-minute
# (a young rollout is normal; image pulls take minutes): a rollout's stream of status
# events would otherwise list and write on each, and under a burst of new targets each
# costs the API server (the loop's tick looks again).
PODS_LOOK_EVERY_S = 30.0
# A target only GPU nodes the cluster lacks could serve is planned again every
# ``OperatorConfig.nodes_retry_s`` (``replan_waiting``), so nodes added later (by hand
# or by an autoscaler) are picked up without a spec edit.
WAITING_FOR_NODES = "waiting-for-nodes"

Obj = dict[str, Any]
EmitFn = Callable[[Mapping[str, Any], str, str, str], None]


class KubeLike(Protocol):
    """The subset of ``kube.Kube`` the handlers use (tests pass a fake)."""

    def get(self, api_version: str, kind: str, namespace: str, name: str) -> Obj | None: ...
    def apply(self, obj: Mapping[str, Any]) -> None: ...
    def has_api(self, group_version: str, plural: str) -> bool: ...
    def list_nodes(self) -> list[Obj]: ...
    def list_pods(self, namespace: str, labels: Mapping[str, str]) -> list[Obj]: ...
    def get_target(self, namespace: str, name: str) -> Obj | None: ...
    def update_status(
        self,
        namespace: str,
        name: str,
        mutate: Callable[[Obj], Obj],
        uid: str | None = None,
        seen: Mapping[str, Any] | None = None,
    ) -> Obj | None: ...


def kopf_emit(body: Mapping[str, Any], type_: str, reason: str, message: str) -> None:
    """Post a Kubernetes Event about the target through kopf's event queue."""
    kopf.event(body, type=type_, reason=reason, message=message[:1000])  # type: ignore[arg-type]


class RecentlyDeleted:
    """The uids of the last ``size`` targets whose DELETED watch event arrived.

    Why: a timer or daemon without kopf's finalizer is not stopped by the deletion
    itself. kopf runs the watch handlers of an event before it re-matches the object's
    timers and daemons against their ``when`` filters, so ``target_event`` recording the
    uid here makes their ``alive`` filter fail in that same event, and kopf stops them.
    The uid is needed only for that moment; the bound keeps a long-lived operator's
    memory flat.
    """

    def __init__(self, size: int = 4096) -> None:
        self._uids: OrderedDict[str, None] = OrderedDict()
        self._size = size

    def add(self, uid: str) -> None:
        self._uids[uid] = None
        while len(self._uids) > self._size:
            self._uids.popitem(last=False)

    def __contains__(self, uid: object) -> bool:
        return uid in self._uids


@dataclass
class Runtime:
    """What every handler needs; built once at startup and kept in kopf's memo."""

    kube: KubeLike
    catalog: Catalog
    plan: Callable[..., SearchResult]
    config: OperatorConfig = field(default_factory=OperatorConfig)
    emit: EmitFn = kopf_emit
    metrics: metrics.OperatorMetrics = metrics.DEFAULT
    now: Callable[[], str] = cnd.now_iso
    # What this process last wrote of each target's readiness, by target uid (see
    # ``sync_readiness``); a deleted target's entry goes with its DELETED event.
    readiness_written: dict[str, tuple[Any, ...]] = field(default_factory=dict)
    # When each target's pods were last listed (``clock``), by target uid.
    pods_listed: dict[str, float] = field(default_factory=dict)
    clock: Callable[[], float] = time.monotonic
    # What the feedback loop keeps between ticks, and the targets deleted lately.
    loop: LoopMemory = field(default_factory=LoopMemory)
    deleted: RecentlyDeleted = field(default_factory=RecentlyDeleted)

    def alive(self, uid: str | None) -> bool:
        """Whether the target with ``uid`` has not been deleted (``RecentlyDeleted``)."""
        return uid not in self.deleted

    def forget(self, namespace: str, name: str, uid: str) -> None:
        """Drop what this process keeps of a deleted target: its metric series, its
        readiness memory and the loop's, and stop its timer and daemon."""
        self.deleted.add(uid)
        self.metrics.forget(namespace, name)
        self.readiness_written.pop(uid, None)
        self.pods_listed.pop(uid, None)
        self.loop.forget(uid)


# ---------------------------------------------------------------- pure helpers


def plan_changed(old: Plan | None, new: Plan) -> bool:
    """Whether the engine changed: its shape or its scale (a "PlanChanged" event)."""
    return old is None or (old.shape, old.scale) != (new.shape, new.scale)


def stored_plan(status: ServingTargetStatus) -> Plan | None:
    """``status.plan`` as a plan, or None when there is none."""
    return None if status.plan is None else Plan.from_status(status.plan)


def describe_plan(plan: Plan) -> str:
    """``2 replicas of 1x h100-sxm (TP1), batch 64, fp8/auto, $6.98/h``."""
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


# ---------------------------------------------------------------- reconcile


def reconcile(
    rt: Runtime,
    body: Mapping[str, Any],
    *,
    step_time_scale: float = 1.0,
    requests_per_second: float | None = None,
    cause: str = "spec_change",
) -> str:
    """One pass for one target; returns the result recorded in metrics (``success``,
    ``skipped`` for invalid/infeasible targets), or ``WAITING_FOR_NODES`` when only GPU
    nodes the cluster lacks could serve it (``replan_waiting`` then plans it again)."""
    ref = TargetRef.from_body(body)
    try:
        spec = parse_spec(body.get("spec") or {})
    except SpecError as err:
        _invalid(rt, body, ref, err)
        return "skipped"
    # A simulated engine runs on any node, so the GPUs the nodes offer do not bound it.
    on_gpus = rt.config.gpu_inventory and spec.mode is not Mode.SIMULATED
    inventory = {"gpu_inventory": gpu_inventory(rt, spec)} if on_gpus else {}
    try:
        result = rt.plan(
            spec,
            catalog=rt.catalog,
            step_time_scale=step_time_scale,
            requests_per_second=requests_per_second,
            engine_families=children.engine_families(rt.config, spec),
            **inventory,
        )
    except (KeyError, ValueError) as err:  # unknown model/GPU, bad modelConfig
        _plan_error(rt, body, ref, spec, err)
        return "skipped"
    _record_plan(rt, ref, spec, result)
    if not result.feasible or result.plan is None:
        _infeasible(rt, body, ref, spec, result)
        return WAITING_FOR_NODES if result.beyond_inventory else "skipped"
    _deploy(rt, body, ref, spec, result.plan, cause)
    return "success"


def gpu_inventory(rt: Runtime, spec: ServingTargetSpec) -> GpuInventory:
    """The GPUs the cluster's Nodes offer this target's pods now (its nodeSelector and
    tolerations). Read on every plan rather than watched: plans happen on spec changes
    and restarts, rarely enough that a list is cheap, and a node added since the last
    plan is seen by the next one."""
    placement = Placement.of(spec.constraints)
    return inventory_from_nodes(rt.kube.list_nodes(), rt.catalog, placement)


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


def _deploy(
    rt: Runtime,
    body: Mapping[str, Any],
    ref: TargetRef,
    spec: ServingTargetSpec,
    plan: Plan,
    cause: str,
) -> None:
    old_plan = stored_plan(ServingTargetStatus.read(body.get("status")))
    if cause != "spec_change" or _same_generation(body):
        plan = keep_loop_scale(plan, old_plan)
    try:
        apply_children(rt, ref, spec, plan)
    except (builders.UnsupportedPlan, ChildConflict) as err:
        reason = "UnsupportedPlan" if isinstance(err, builders.UnsupportedPlan) else "NameConflict"
        _not_deployed(rt, body, ref, spec, plan, reason, str(err))
        return
    except KubeError as err:
        if not err.transient and not err.namespace_terminating:  # refused: say so on it
            message = f"the API server refused the engine's objects: {err}"
            _not_deployed(rt, body, ref, spec, plan, "ApplyRejected", message)
        raise  # reconcile_target retries, backing off
    deployed = Condition(cnd.DEPLOYED, "True", "Applied", f"engine {describe_plan(plan)}")
    cache = model_cache_condition(rt.catalog, spec, plan)
    conds = [*_plan_conditions(spec, plan), deployed, *([cache] if cache else [])]
    _write(rt, ref, conds, seen=body, plan=plan.to_status(), gpu=plan.gpu, slo=slo_text(spec))
    if plan_changed(old_plan, plan):
        verb = "PlanChanged" if old_plan else "Planned"
        rt.emit(body, "Normal", verb, f"{describe_plan(plan)} ({cause})")
        if old_plan:
            rt.metrics.record_decision(ref.namespace, ref.name, "replan", cause)
    if cache is not None and cache.status == "False" and not old_plan:
        rt.emit(body, "Warning", cache.reason, cache.message)


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


def _same_generation(body: Mapping[str, Any]) -> bool:
    """Whether status was written for the current spec (a resume, not an edit)."""
    seen = ServingTargetStatus.read(body.get("status")).observed_generation
    return seen is not None and seen == (body.get("metadata") or {}).get("generation")


def keep_loop_scale(plan: Plan, old_plan: Plan | None) -> Plan:
    """``plan`` with the replicas and batch cap the feedback loop last chose.

    Why: the planner sizes for the spec's expected rate, the loop for the observed one.
    A resume (operator restart) or a repair of a deleted Deployment re-plans the same
    spec; resetting to the planned size would undo the loop's last decision, e.g. drop
    the replicas a load spike needed. Kept only when the engine shape (GPU, TP, dtypes,
    context) is unchanged: a new shape is a new operating curve and starts from its plan.
    """
    if old_plan is None or old_plan.shape != plan.shape:
        return plan
    replicas, cap = old_plan.scale
    if replicas < 1 or cap < 1 or old_plan.scale == plan.scale:
        return plan
    return plan.rescaled(replicas, cap)


def _plan_conditions(spec: ServingTargetSpec, plan: Plan) -> list[Condition]:
    cost, budget = round(plan.usd_per_hour, 3), spec.budget.usd_per_hour
    within = cost <= budget
    return [
        Condition(cnd.PLANNED, "True", "Planned", plan.summary or describe_plan(plan)),
        Condition(cnd.FEASIBLE, "True", "PlanFound", "a plan meets the SLO within the budget"),
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
    plan = result.plan if result.feasible else None
    ttft = spec.slo.ttft_ms
    rt.metrics.record_plan(
        ref.namespace,
        ref.name,
        feasible=bool(result.feasible),
        slo_tpot_s=spec.slo.tpot_ms / 1000.0,
        slo_ttft_s=None if ttft is None else ttft / 1000.0,
        slo_quantiles=(spec.slo.tpot_percentile.quantile, spec.slo.ttft_percentile.quantile),
        budget_usd_per_hour=spec.budget.usd_per_hour,
        gpu_type=None if plan is None else plan.gpu,
        gpus=None if plan is None else plan.tp * plan.replicas,
        usd_per_hour=None if plan is None else plan.usd_per_hour,
        predicted_tpot_s=None if plan is None else plan.tpot_ms / 1000.0,
        predicted_ttft_s=None if plan is None or plan.ttft_ms is None else plan.ttft_ms / 1000.0,
    )


# ---------------------------------------------------------------- children


class ChildConflict(RuntimeError):
    """A child's name is taken by an object this target does not control."""


def apply_children(rt: Runtime, ref: TargetRef, spec: ServingTargetSpec, plan: Plan) -> None:
    """Server-side apply each child that differs from what is there (its fields, or
    the digest of what was last applied: see ``builders.with_applied_hash``). Raises
    ``ChildConflict`` rather than take over an object someone else created."""
    inputs = children.engine_inputs(
        rt.catalog, rt.config, ref, spec, plan, pod_monitor=rt.kube.has_api(*PODMONITOR_API)
    )
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


# ---------------------------------------------------------------- readiness


def readiness(
    deployment: Mapping[str, Any], pods: Sequence[Mapping[str, Any]] = ()
) -> tuple[Condition, int, int]:
    """(Ready condition, desired replicas, ready replicas) of an engine Deployment.
    Ready means the rollout finished: every desired pod runs the current template.
    ``pods``: its pods; one the scheduler cannot place makes the reason
    ``Unschedulable`` with the scheduler's own message (which nodes lack what), the
    first thing a user asks of a target that stays not ready."""
    spec, status = deployment.get("spec") or {}, deployment.get("status") or {}
    desired, ready = int(spec.get("replicas", 1)), int(status.get("readyReplicas") or 0)
    updated, total = int(status.get("updatedReplicas") or 0), int(status.get("replicas") or 0)
    current = int(status.get("observedGeneration") or 0) >= int(
        deployment.get("metadata", {}).get("generation") or 0
    )
    counts = f"{ready}/{desired} engine replicas ready"
    if desired == 0:
        return Condition(cnd.READY, "False", "ScaledToZero", "no engine replicas"), 0, ready
    if current and updated >= desired and ready >= desired and total == desired:
        return Condition(cnd.READY, "True", "EngineReady", counts), desired, ready
    if stuck := [why for p in pods if (why := unschedulable(p))]:
        msg = f"{counts}; {len(stuck)} pod(s) cannot be scheduled: {stuck[0]}"
        return Condition(cnd.READY, "False", "Unschedulable", msg), desired, ready
    if refused := replica_failure(status):
        # The API server refused the pods (Pod Security admission, a quota): no pod
        # exists to look at, and only the Deployment's condition says why.
        return Condition(cnd.READY, "False", "FailedCreate", f"{counts}; {refused}"), desired, ready
    for c in status.get("conditions") or []:
        if c.get("type") == "Progressing" and c.get("status") == "False":
            stalled = Condition(cnd.READY, "False", str(c.get("reason")), str(c.get("message")))
            return stalled, desired, ready
    reason = "RollingOut" if updated < desired or total > desired else "Deploying"
    return Condition(cnd.READY, "False", reason, counts), desired, ready


def replica_failure(status: Mapping[str, Any]) -> str:
    """The message of a Deployment's ReplicaFailure condition (its ReplicaSet could not
    create pods, e.g. ``violates PodSecurity "restricted:latest"``), else ""."""
    for c in status.get("conditions") or []:
        if c.get("type") == "ReplicaFailure" and c.get("status") == "True":
            return str(c.get("message") or c.get("reason") or "pods cannot be created")
    return ""


def unschedulable(pod: Mapping[str, Any]) -> str:
    """The scheduler's message for a pod it cannot place (its PodScheduled condition
    is False with reason Unschedulable), else ""."""
    if (pod.get("metadata") or {}).get("deletionTimestamp"):
        return ""
    for c in (pod.get("status") or {}).get("conditions") or []:
        placed = (c.get("type"), c.get("status"), c.get("reason"))
        if placed == ("PodScheduled", "False", "Unschedulable"):
            return str(c.get("message") or "no node fits")
    return ""


def deployment_ready(deployment: Mapping[str, Any]) -> bool:
    """Whether an engine Deployment's rollout is complete (its Ready condition is True).
    A periodic caller (the feedback loop) mirrors a not-ready one into status with
    ``sync_readiness``: a pod the scheduler gave up on, or placed after a node joined,
    changes no Deployment field, so no watch event would. A ready one costs nothing."""
    return readiness(deployment)[0].status == "True"


def refresh_readiness(rt: Runtime, deployment: Mapping[str, Any] | None) -> None:
    """``sync_readiness`` for a Deployment that is not ready (see ``deployment_ready``)."""
    if deployment is not None and not deployment_ready(deployment):
        sync_readiness(rt, deployment)


def sync_readiness(rt: Runtime, deployment: Mapping[str, Any]) -> None:
    """Mirror an engine Deployment's rollout state into its target's status. Pods are
    listed only while it is not ready, so a steady fleet costs no extra API call.

    Most events of a Deployment (the controller's status updates during a rollout)
    change nothing the target shows; what this process last wrote is remembered, so
    those cost no read and no write. Only this function writes these fields (reconcile
    seeds Ready once, when absent), so the memory cannot miss another writer's change.
    """
    meta = deployment.get("metadata") or {}
    owner = next((r for r in meta.get("ownerReferences") or [] if r.get("controller")), None)
    if owner is None or owner.get("kind") != KIND:
        return
    cond, desired, ready = readiness(deployment)
    uid = str(owner.get("uid"))
    if cond.status != "True" and desired > 0:
        if rt.clock() - rt.pods_listed.get(uid, -math.inf) < PODS_LOOK_EVERY_S:
            return  # looked moments ago; a later event or the loop's tick looks again
        rt.pods_listed[uid] = rt.clock()
        selector = builders.selector_labels(str(owner.get("name")))
        pods = rt.kube.list_pods(str(meta.get("namespace")), selector)
        cond, desired, ready = readiness(deployment, pods)
    shown = (cond.status, cond.reason, cond.message, desired, ready)
    if rt.readiness_written.get(uid) == shown:
        return
    now = rt.now()

    def mutate(stored: Obj) -> Obj:
        status = ServingTargetStatus.read(stored)
        merged = cnd.merge(status.conditions, [cond], now=now)
        shown = {"conditions": merged, "replicas": desired, "ready_replicas": ready}
        return status.model_copy(update={**shown, "ready": cond.status}).stored()

    # uid: only the owner; a target recreated under the same name is not this one
    rt.kube.update_status(str(meta.get("namespace")), str(owner.get("name")), mutate, uid=uid)
    rt.readiness_written[uid] = shown
    rt.metrics.record_replicas(
        str(meta.get("namespace")), str(owner.get("name")), desired=desired, ready=ready
    )


# ---------------------------------------------------------------- kopf wiring


def runtime(memo: Any) -> Runtime:
    rt: Runtime = memo.runtime
    return rt


def build_runtime(config: OperatorConfig) -> Runtime:
    """The production runtime: real API client, packaged catalog, the planner."""
    return Runtime(
        kube=Kube.from_environment(), catalog=load_catalog(), plan=plan_target, config=config
    )


def startup(settings: kopf.OperatorSettings, memo: kopf.Memo, **_: Any) -> None:
    config = getattr(memo, "config", None) or OperatorConfig()
    configure(settings, config)
    if getattr(memo, "runtime", None) is None:
        memo.runtime = build_runtime(config)
    if config.metrics_port is not None:
        metrics.start_http_server(config.metrics_port)


def reconcile_target(body: kopf.Body, memo: kopf.Memo, retry: int = 0, **_: Any) -> None:
    rt = runtime(memo)
    try:
        result = reconcile(rt, body)
    except KubeError as err:
        rt.metrics.record_reconcile("retry")
        raise kopf.TemporaryError(str(err), delay=retry_delay_s(retry)) from err
    _record(rt, result)


def retry_delay_s(retry: int) -> float:
    """Seconds before the next attempt after ``retry`` failed ones: doubling from
    ``RETRY_DELAY_S`` up to ``MAX_RETRY_DELAY_S``, so a child the API server refuses (an
    invalid field, a full Service IP range) is retried, not logged every 10 s forever."""
    return float(min(RETRY_DELAY_S * 2 ** min(retry, 16), MAX_RETRY_DELAY_S))


def _record(rt: Runtime, result: str) -> None:
    """Count a finished pass; waiting for nodes counts as skipped (no failure:
    ``replan_waiting`` tries again, quietly)."""
    rt.metrics.record_reconcile("skipped" if result == WAITING_FOR_NODES else result)


def waiting_for_nodes(status: Mapping[str, Any]) -> bool:
    """Whether the last plan found that only GPU nodes the cluster lacks could serve the
    target (Feasible=False, reason NodesUnavailable)."""
    feasible = cnd.find(ServingTargetStatus.read(status).conditions, cnd.FEASIBLE)
    return feasible is not None and (feasible.status, feasible.reason) == (
        "False",
        "NodesUnavailable",
    )


def timer_without_finalizer(
    fn: Callable[..., Any],
    *,
    interval: float,
    when: Callable[..., bool],
    registry: kopf.OperatorRegistry | None = None,
) -> None:
    """Register ``fn`` as a ServingTarget timer that puts no finalizer on the targets.

    kopf gives every object with a timer or daemon its finalizer, so that it can stop
    them before the object goes. A finalizer makes ``kubectl delete`` (and a namespace's
    deletion) hang whenever the operator is not running: after ``helm uninstall``, on a
    crash-looping operator. Ours need no last word with the object (the children go by
    garbage collection), so the finalizer is dropped and they are stopped by their
    ``when`` filter instead (``alive``).
    """
    real = registry if registry is not None else kopf.get_default_registry()
    kopf.timer(
        GROUP, VERSION, PLURAL, interval=interval, initial_delay=interval, when=when, registry=real
    )(fn)
    _without_finalizer(real)


def daemon_without_finalizer(
    fn: Callable[..., Any],
    *,
    when: Callable[..., bool],
    registry: kopf.OperatorRegistry | None = None,
) -> None:
    """Register ``fn`` as a ServingTarget daemon with no finalizer (see
    ``timer_without_finalizer``)."""
    real = registry if registry is not None else kopf.get_default_registry()
    kopf.daemon(GROUP, VERSION, PLURAL, when=when, registry=real)(fn)
    _without_finalizer(real)


def _without_finalizer(registry: kopf.OperatorRegistry) -> None:
    """Replace the spawning handler registered last by a copy that requires no finalizer.
    kopf offers no public switch for this, and its maintainer declined one (nolar/kopf#896,
    2026: timers and daemons keep their finalizers by design), so this reaches into the
    registry: ``test_timers_put_no_finalizer`` fails if its shape changes, and
    ``make floors`` runs it on the oldest kopf pyproject.toml allows (1.44.6)."""
    spawning = registry._spawning._handlers
    spawning[-1] = dataclasses.replace(spawning[-1], requires_finalizer=False)


def replan_waiting(body: kopf.Body, memo: kopf.Memo, **_: Any) -> None:
    """Plan a target that waits for GPU nodes again, so nodes added later (by hand or by
    an autoscaler) are picked up without a spec edit. A timer, not a handler retry:
    kopf logs every retry of a failed handler as an ERROR line, and a wait of hours for
    a node pool is not an error."""
    rt = runtime(memo)
    try:
        result = reconcile(rt, body)  # the same spec generation the wait began with
    except KubeError as err:  # the next tick tries again
        log.warning("replan %s: %s", body.get("metadata", {}).get("name"), err)
        rt.metrics.record_reconcile("retry")
        return
    _record(rt, result)


def repair_deleted(rt: Runtime, deployment: Mapping[str, Any]) -> bool:
    """Someone deleted an engine Deployment whose target still exists: reconcile the
    target at once (it recreates the Deployment) instead of waiting for the next spec
    change. Returns whether a reconcile ran."""
    meta = deployment.get("metadata") or {}
    owner = next((r for r in meta.get("ownerReferences") or [] if r.get("controller")), None)
    if owner is None or owner.get("kind") != KIND:
        return False
    target = rt.kube.get_target(str(meta.get("namespace")), str(owner.get("name")))
    if target is None or target["metadata"].get("uid") != owner.get("uid"):
        return False  # deleted with its target: garbage collection at work
    if target["metadata"].get("deletionTimestamp"):
        return False
    reconcile(rt, target, cause="other")
    return True


def index_entry(body: Mapping[str, Any]) -> dict[str, Any]:
    """What the loop reads of an engine Deployment: replicas, rollout status and owner.
    A copy without managedFields and the pod template keeps 1,000 of them small."""
    meta = body.get("metadata") or {}
    kept = ("name", "namespace", "uid", "generation", "ownerReferences", "deletionTimestamp")
    return {
        "metadata": {k: meta[k] for k in kept if k in meta},
        "spec": {"replicas": (body.get("spec") or {}).get("replicas", 1)},
        "status": dict(body.get("status") or {}),
    }


# The index and the targets' watch handler are coroutines: kopf runs a plain function in
# its thread pool, a hop per watch event (several per target under a burst) for work that
# takes microseconds and makes no API call.
async def engine_deployments(
    namespace: str | None, name: str | None, body: kopf.Body, **_: Any
) -> dict[tuple[str, str], dict[str, Any]]:
    """kopf's in-memory index of the engine Deployments, kept current by the same watch
    as ``engine_deployment_event``: the feedback loop reads a target's Deployment from
    here (passed to its daemon as the ``engine_deployments`` argument) instead of a GET
    per target and tick."""
    return {(str(namespace), str(name)): index_entry(body)}


def indexed_deployment(index: EngineIndex, namespace: str, name: str) -> dict[str, Any] | None:
    """The indexed Deployment ``namespace/name``, or None when there is none."""
    store = index.get((namespace, name))
    return next(iter(store), None) if store is not None else None


# Threads for the engine Deployments' events, apart from kopf's pool: a burst of new
# targets brings several Deployment events per target (the controller's rollout
# updates), and in one shared pool they queued the reconciles of targets not yet
# deployed behind the readiness of those that were.
DEPLOYMENT_EVENT_THREADS = 4
DEPLOYMENT_EVENTS = ThreadPoolExecutor(DEPLOYMENT_EVENT_THREADS, "deployment-events")


async def engine_deployment_event(
    body: kopf.Body, event: kopf.RawEvent, memo: kopf.Memo, **_: Any
) -> None:
    """Mirror readiness, or repair a deleted Deployment (``deployment_event``), in the
    Deployment events' own threads."""
    loop = asyncio.get_running_loop()
    kind = str(event.get("type"))
    await loop.run_in_executor(DEPLOYMENT_EVENTS, deployment_event, runtime(memo), body, kind)


def deployment_event(rt: Runtime, body: Mapping[str, Any], kind: str) -> None:
    """One watch event of an engine Deployment (``kind``: ADDED, MODIFIED, DELETED)."""
    try:
        if kind == "DELETED":
            repair_deleted(rt, body)
        else:
            sync_readiness(rt, body)
    except KubeError as err:  # event handlers are not retried: the next event will be
        name = body.get("metadata", {}).get("name")
        if err.namespace_terminating:  # its namespace is going: the target goes with it
            log.debug("engine %s: not repaired, %s", name, err)
            return
        log.warning("engine %s: %s", name, err)


async def target_event(
    event: kopf.RawEvent, name: str | None, namespace: str | None, memo: kopf.Memo, **_: Any
) -> None:
    """Drop a deleted target's metric series and the loop's memory of it, and stop its
    timer and daemon (``RecentlyDeleted``). A watch event rather than on.delete: a
    deletion handler would need a finalizer, and the children go by garbage collection."""
    if event.get("type") == "DELETED":
        uid = ((event.get("object") or {}).get("metadata") or {}).get("uid")
        runtime(memo).forget(str(namespace), str(name), str(uid))

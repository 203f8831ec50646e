"""The engine Deployments' state, mirrored into their targets' status.

``sync_readiness`` (Deployment events, and the feedback loop while a target is not ready)
writes replicas, readyReplicas, ready and the Ready condition, naming pods the scheduler
cannot place (that changes no Deployment field, so no Deployment event reports it).
``repair_deleted`` reconciles a target whose engine Deployment someone deleted. The
feedback loop reads each Deployment from kopf's index (``index_entry``,
``indexed_deployment``) rather than a GET per target and tick.
"""

from __future__ import annotations

import logging
import math
from collections.abc import Mapping, Sequence
from typing import Any

from rooftop_api import conditions as cnd
from rooftop_api.conditions import Condition
from rooftop_api.spec import (
    KIND,
    ServingTargetStatus,
)
from rooftop_operator import builders
from rooftop_operator.kube import KubeError
from rooftop_operator.loop_memory import EngineIndex
from rooftop_operator.reconcile import reconcile
from rooftop_operator.runtime import Obj, Runtime

log = logging.getLogger(__name__)

# A Deployment that is not ready has its pods listed (to name one the scheduler cannot
# place) and its progress written at most this often, and not in its first half-minute
# (a young rollout is normal; image pulls take minutes): a rollout's stream of status
# events would otherwise list and write on each, and under a burst of new targets each
# costs the API server (the loop's tick looks again).
PODS_LOOK_EVERY_S = 30.0


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


def combined(deployments: Sequence[Mapping[str, Any]]) -> dict[str, Any]:
    """A mixed fleet's pool Deployments as one for ``readiness``: their replicas summed,
    current only when every one is, and every one's conditions."""
    spec_replicas = status_replicas = ready = updated = 0
    current = True
    conditions: list[Any] = []
    for d in deployments:
        status = d.get("status") or {}
        spec_replicas += int((d.get("spec") or {}).get("replicas", 1))
        status_replicas += int(status.get("replicas") or 0)
        ready += int(status.get("readyReplicas") or 0)
        updated += int(status.get("updatedReplicas") or 0)
        generation = int((d.get("metadata") or {}).get("generation") or 0)
        current = current and int(status.get("observedGeneration") or 0) >= generation
        conditions += status.get("conditions") or []
    return {
        "metadata": {"generation": 1},
        "spec": {"replicas": spec_replicas},
        "status": {
            "observedGeneration": 1 if current else 0,
            "replicas": status_replicas,
            "readyReplicas": ready,
            "updatedReplicas": updated,
            "conditions": conditions,
        },
    }


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
    if str(meta.get("name")) != builders.deployment_name(str(owner.get("name"))):
        # a mixed fleet's pool: the target is ready when all its pools are
        deployment = combined(
            rt.kube.list_pool_deployments(str(meta.get("namespace")), str(owner.get("name")))
        )
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
    if not _planned(target, str(meta.get("name"))):
        return False  # pruned: a pool the plan no longer has
    reconcile(rt, target, cause="other")
    return True


def _planned(target: Mapping[str, Any], name: str) -> bool:
    """Whether the target's stored plan has the engine Deployment ``name`` (true
    without a readable plan: reconcile then decides)."""
    stored = ServingTargetStatus.read(target.get("status")).plan
    if stored is None:
        return True
    pools = tuple(p.gpu for p in stored.pools or ())
    return name in builders.engine_deployment_names(str(target["metadata"]["name"]), pools)


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


def indexed_deployment(index: EngineIndex, namespace: str, name: str) -> dict[str, Any] | None:
    """The indexed Deployment ``namespace/name``, or None when there is none."""
    store = index.get((namespace, name))
    return next(iter(store), None) if store is not None else None


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

"""Handlers and the reconcile pass, called directly with an in-memory API."""

from __future__ import annotations

import copy
from dataclasses import replace
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import kopf
import pytest
import yaml
from operator_fakes import (
    NS,
    SPEC,
    UID,
    Events,
    FakeKube,
    FakePlanner,
    FakeResult,
    make_plan,
    target_body,
)

from rooftop_api.conditions import Condition
from rooftop_api.spec import ObservedStatus
from rooftop_control import control
from rooftop_control.readings import MetricState, Observation, Reading
from rooftop_operator import builders, children, handlers, loop, readiness, wiring
from rooftop_operator.kube import KubeError
from rooftop_operator.reconcile import apply_children, is_subset, reconcile, waiting_for_nodes
from rooftop_operator.runtime import Runtime
from rooftop_operator.settings import OperatorConfig
from rooftop_operator.specs import TargetRef, parse_spec
from rooftop_planner.catalog import CatalogError

EXAMPLES = Path(__file__).resolve().parents[3] / "examples"


def created(kube: FakeKube, name: str = "chat") -> dict[str, Any]:
    """The target as the API would now hand it to the next reconcile."""
    body = target_body(name)
    kube.add(body)
    return body


def latest(kube: FakeKube, name: str = "chat") -> dict[str, Any]:
    found = kube.get_target(NS, name)
    assert found is not None
    return found


def find(stored: list[dict[str, Any]] | None, type_: str) -> dict[str, Any] | None:
    """The stored condition of that type (as the API server holds it), or None."""
    return next((c for c in stored or [] if c.get("type") == type_), None)


def cond(kube: FakeKube, type_: str) -> dict[str, Any]:
    found = find(kube.status().get("conditions"), type_)
    assert found is not None, f"no {type_} condition in {kube.status()}"
    return dict(found)


def kinds(kube: FakeKube) -> set[str]:
    return {kind for kind, _, _ in kube.objects if kind != "ServingTarget"}


def test_first_reconcile_deploys_and_reports(rt: Runtime, kube: FakeKube, events: Events) -> None:
    assert reconcile(rt, created(kube)) == "success"
    assert kinds(kube) == {"ConfigMap", "Deployment", "Service", "PodDisruptionBudget"}
    status = kube.status()
    assert status["plan"]["gpu"] == "h100-sxm" and status["plan"]["maxNumSeqs"] == 64
    assert status["gpu"] == "h100-sxm"
    assert status["slo"] == "p90 TPOT<=50ms, p90 TTFT<=1000ms"
    assert status["observedGeneration"] == 1
    for type_ in ("Planned", "Feasible", "Deployed", "WithinBudget"):
        assert cond(kube, type_)["status"] == "True", type_
    assert cond(kube, "Ready")["status"] == "False"  # until the Deployment reports
    assert cond(kube, "SLOMet")["status"] == "Unknown"  # until the feedback loop measures
    # the default emptyDir cache: each new pod downloads the checkpoint, and says so
    cache = cond(kube, "ModelCached")
    assert (cache["status"], cache["reason"]) == ("False", "EveryPodDownloads")
    assert "spec.engine.modelCache.pvcName" in cache["message"]
    assert events.reasons == ["Planned", "EveryPodDownloads"]


def test_a_persistent_cache_clears_the_download_warning(
    rt: Runtime, kube: FakeKube, events: Events
) -> None:
    spec = {**SPEC, "engine": {"modelCache": {"pvcName": "hf-cache"}}}
    kube.add(target_body(spec=spec))
    reconcile(rt, latest(kube))
    assert (cond(kube, "ModelCached")["status"], events.reasons) == ("True", ["Planned"])


def scrape_annotations(template: dict[str, Any]) -> list[str]:
    annotations = template["metadata"].get("annotations") or {}
    return [k for k in annotations if k.startswith("prometheus.io/")]


def test_pod_monitor_when_the_api_exists(rt: Runtime, kube: FakeKube) -> None:
    kube.pod_monitors = True
    reconcile(rt, created(kube))
    assert kinds(kube) == {"ConfigMap", "Deployment", "Service", "PodDisruptionBudget",
                           "PodMonitor"}  # fmt: skip
    deployment = kube.get("apps/v1", "Deployment", NS, "chat-engine")
    assert deployment is not None
    assert not scrape_annotations(deployment["spec"]["template"])


def test_repeated_reconcile_changes_nothing(rt: Runtime, kube: FakeKube, events: Events) -> None:
    reconcile(rt, created(kube))
    before = copy.deepcopy(kube.objects)
    applied, writes = len(kube.applied), kube.status_writes
    for _ in range(3):
        assert reconcile(rt, latest(kube)) == "success"
    assert kube.objects == before
    assert (len(kube.applied), kube.status_writes) == (applied, writes)
    assert events.reasons == ["Planned", "EveryPodDownloads"]


def pod_spec(kube: FakeKube) -> dict[str, Any]:
    deployment = kube.get("apps/v1", "Deployment", NS, "chat-engine")
    assert deployment is not None
    return dict(deployment["spec"]["template"]["spec"])


def test_a_field_removed_from_the_spec_leaves_the_deployment(rt: Runtime, kube: FakeKube) -> None:
    """A child whose fields still hold every desired value is not re-applied; but a
    removed nodeSelector entry is a change too (the applied digest says so)."""
    pinned = {**SPEC, "constraints": {**SPEC.get("constraints", {}),
                                      "nodeSelector": {"pool": "a"}}}  # fmt: skip
    body = target_body(spec=pinned)
    kube.add(body)
    reconcile(rt, body)
    assert pod_spec(kube)["nodeSelector"]["pool"] == "a"
    body = target_body(spec=SPEC)
    body["metadata"]["generation"] = 2
    kube.add({**body, "status": kube.status()})
    applied = len(kube.applied)
    reconcile(rt, latest(kube))
    assert len(kube.applied) == applied + 1  # the Deployment, again
    assert "pool" not in pod_spec(kube)["nodeSelector"]


def test_pod_monitor_arriving_drops_the_scrape_annotations(rt: Runtime, kube: FakeKube) -> None:
    reconcile(rt, created(kube))
    template = kube.get("apps/v1", "Deployment", NS, "chat-engine")["spec"]["template"]  # type: ignore[index]
    assert "prometheus.io/scrape" in template["metadata"]["annotations"]
    kube.pod_monitors = True  # the Prometheus operator was installed since
    reconcile(rt, latest(kube))
    template = kube.get("apps/v1", "Deployment", NS, "chat-engine")["spec"]["template"]  # type: ignore[index]
    assert not scrape_annotations(template)


def test_new_plan_rolls_the_deployment(
    rt: Runtime, kube: FakeKube, planner: FakePlanner, events: Events
) -> None:
    reconcile(rt, created(kube))
    feasible_since = cond(kube, "Feasible")["lastTransitionTime"]
    planner.result = FakeResult(True, make_plan(max_num_seqs=32, replicas=3))
    rt.now = lambda: "2026-01-02T00:00:00Z"
    body = latest(kube)
    body["metadata"]["generation"] = 2
    reconcile(rt, body)
    deployment = kube.get("apps/v1", "Deployment", NS, "chat-engine")
    assert deployment is not None
    args = deployment["spec"]["template"]["spec"]["containers"][0]["args"]
    assert args[args.index("--max-num-seqs") + 1] == "32"
    assert deployment["spec"]["replicas"] == 3
    assert events.reasons == ["Planned", "EveryPodDownloads", "PlanChanged"]
    assert kube.status()["observedGeneration"] == 2
    # Feasible stayed True: its transition time must not move.
    assert cond(kube, "Feasible")["lastTransitionTime"] == feasible_since
    assert cond(kube, "Feasible")["observedGeneration"] == 2


def _loop_scaled(kube: FakeKube, replicas: int, cap: int) -> dict[str, Any]:
    """The target after the feedback loop scaled it (status.plan and the Deployment)."""
    body = latest(kube)
    body["status"]["plan"] = {**body["status"]["plan"], "replicas": replicas, "maxNumSeqs": cap}
    kube.add(body)
    return body


def test_resume_keeps_the_loops_replicas_and_cap(rt: Runtime, kube: FakeKube) -> None:
    reconcile(rt, created(kube))
    body = _loop_scaled(kube, replicas=5, cap=48)
    reconcile(rt, body)  # an operator restart: same generation, same plan shape
    deployment = kube.get("apps/v1", "Deployment", NS, "chat-engine")
    assert deployment is not None and deployment["spec"]["replicas"] == 5
    args = deployment["spec"]["template"]["spec"]["containers"][0]["args"]
    assert args[args.index("--max-num-seqs") + 1] == "48"
    plan = kube.status()["plan"]
    assert (plan["replicas"], plan["maxNumSeqs"]) == (5, 48)
    assert plan["usdPerHour"] == pytest.approx(6.98 / 2 * 5, abs=1e-3)


def test_spec_edit_starts_from_the_new_plan(rt: Runtime, kube: FakeKube) -> None:
    reconcile(rt, created(kube))
    body = _loop_scaled(kube, replicas=5, cap=48)
    body["metadata"]["generation"] = 2
    reconcile(rt, body)
    deployment = kube.get("apps/v1", "Deployment", NS, "chat-engine")
    assert deployment is not None and deployment["spec"]["replicas"] == 2


def test_new_engine_shape_starts_from_its_plan(
    rt: Runtime, kube: FakeKube, planner: FakePlanner
) -> None:
    reconcile(rt, created(kube))
    body = _loop_scaled(kube, replicas=5, cap=48)
    planner.result = FakeResult(True, make_plan(gpu="a100-80gb", replicas=3))
    reconcile(rt, body)  # same generation, but the planner now picks another GPU
    deployment = kube.get("apps/v1", "Deployment", NS, "chat-engine")
    assert deployment is not None and deployment["spec"]["replicas"] == 3


def test_invalid_spec_is_a_condition_not_a_crash(
    rt: Runtime, kube: FakeKube, events: Events
) -> None:
    body = target_body(spec={**SPEC, "slo": {"tpotMs": -1}})
    kube.add(body)
    assert reconcile(rt, body) == "skipped"
    planned = cond(kube, "Planned")
    assert planned["status"] == "False" and planned["reason"] == "InvalidSpec"
    assert "spec.slo.tpotMs" in planned["message"]
    assert kinds(kube) == set()
    assert events.reasons == ["InvalidSpec"]


def test_infeasible_target_changes_no_workload(
    rt: Runtime, kube: FakeKube, planner: FakePlanner, events: Events
) -> None:
    reconcile(rt, created(kube))
    deployed = copy.deepcopy(kube.objects)
    applied = len(kube.applied)
    planner.result = FakeResult(False, None, ["TPOT over SLO on every GPU"])
    reconcile(rt, latest(kube))
    assert len(kube.applied) == applied
    assert {k: v for k, v in kube.objects.items() if k[0] != "ServingTarget"} == {
        k: v for k, v in deployed.items() if k[0] != "ServingTarget"
    }
    feasible = cond(kube, "Feasible")
    assert (feasible["status"], feasible["reason"]) == ("False", "Infeasible")
    assert "TPOT over SLO on every GPU" in feasible["message"]
    assert kube.status()["plan"]["gpu"] == "h100-sxm"  # still what runs
    assert events.reasons == ["Planned", "EveryPodDownloads", "Infeasible"]


def test_infeasible_from_the_start_deploys_nothing(
    rt: Runtime, kube: FakeKube, planner: FakePlanner
) -> None:
    planner.result = FakeResult(False, None, ["over budget"])
    assert reconcile(rt, created(kube)) == "skipped"
    assert kinds(kube) == set()
    assert cond(kube, "Feasible")["status"] == "False"
    assert "plan" not in kube.status()


def test_planner_error_is_reported(rt: Runtime, kube: FakeKube, planner: FakePlanner) -> None:
    planner.error = CatalogError("unknown model 'gpt-17'")
    assert reconcile(rt, created(kube)) == "skipped"
    planned = cond(kube, "Planned")
    assert planned["reason"] == "PlannerError" and "gpt-17" in planned["message"]


def test_a_planner_bug_is_not_reported_as_the_specs_fault(
    rt: Runtime, kube: FakeKube, planner: FakePlanner
) -> None:
    """A KeyError from a lookup that should never miss is a bug: it surfaces (kopf logs
    it and retries) instead of telling the user their spec is wrong."""
    planner.error = KeyError("h100-sxm")
    with pytest.raises(KeyError):
        reconcile(rt, created(kube))
    assert find(kube.status().get("conditions"), "Planned") is None


def test_foreign_object_with_our_name_is_not_taken_over(
    rt: Runtime, kube: FakeKube, events: Events
) -> None:
    foreign = {"apiVersion": "v1", "kind": "Service", "metadata": {"name": "chat", "namespace": NS}}
    kube.add(foreign)
    reconcile(rt, created(kube))
    assert kube.get("v1", "Service", NS, "chat") == foreign
    deployed = cond(kube, "Deployed")
    assert (deployed["status"], deployed["reason"]) == ("False", "NameConflict")
    assert "Warning" in {t for t, _, _ in events.items}


def test_plan_vllm_cannot_run_is_reported(
    rt: Runtime, kube: FakeKube, planner: FakePlanner
) -> None:
    planner.result = FakeResult(True, make_plan(kv_dtype="int4"))
    reconcile(rt, created(kube))
    assert cond(kube, "Deployed")["reason"] == "UnsupportedPlan"
    assert kinds(kube) == set()


@pytest.mark.parametrize(
    ("plan", "why"),
    [
        # int8 used to render --quantization bitsandbytes on the bf16 checkpoint
        ({"weight_dtype": "int8"}, "checkpoints.int8"),
        ({"weight_dtype": "fp4", "gpu": "b200"}, "checkpoints.fp4"),
        ({"weight_dtype": "fp16", "kv_dtype": "bf16"}, "kv bf16 needs weight dtype bf16"),
        # a ROCm GPU used to get the CUDA image
        ({"gpu": "mi300x"}, "operator.rocmImage"),
        ({"gpu": "tpu-v5e"}, "operator.tpuImage"),
    ],
)
def test_a_plan_vllm_would_refuse_is_never_deployed(
    rt: Runtime, kube: FakeKube, planner: FakePlanner, plan: dict[str, Any], why: str
) -> None:
    body = target_body(spec={**SPEC, "model": "mistral-7b"})  # no quantized checkpoints
    kube.add(body)
    planner.result = FakeResult(True, make_plan(**plan))
    reconcile(rt, body)
    deployed = cond(kube, "Deployed")
    assert (deployed["status"], deployed["reason"]) == ("False", "UnsupportedPlan")
    assert why in deployed["message"]
    assert kinds(kube) == set()


def test_a_quantized_plan_deploys_its_checkpoint(
    rt: Runtime, kube: FakeKube, planner: FakePlanner
) -> None:
    planner.result = FakeResult(True, make_plan(weight_dtype="int4"))
    reconcile(rt, created(kube))
    (deployment,) = [o for o in kube.applied if o["kind"] == "Deployment"]
    args = deployment["spec"]["template"]["spec"]["containers"][0]["args"]
    assert args[0] == "hugging-quants/Meta-Llama-3.1-8B-Instruct-AWQ-INT4"


def test_the_planner_is_told_which_accelerator_families_have_an_engine(
    rt: Runtime, kube: FakeKube, planner: FakePlanner
) -> None:
    reconcile(rt, created(kube))
    assert planner.calls[-1]["engine_families"] == ["cuda"]
    with_rocm = replace(rt, config=replace(rt.config, rocm_image="rocm/vllm:tested"))
    reconcile(with_rocm, created(kube, "other"))
    assert planner.calls[-1]["engine_families"] == ["cuda", "rocm"]


def test_over_budget_plan_is_flagged(rt: Runtime, kube: FakeKube, planner: FakePlanner) -> None:
    planner.result = FakeResult(True, make_plan(usd_per_hour=25.0))
    reconcile(rt, created(kube))
    budget = cond(kube, "WithinBudget")
    assert (budget["status"], budget["reason"]) == ("False", "OverBudget")


def test_feedback_hook_passes_calibration_to_the_planner(
    rt: Runtime, kube: FakeKube, planner: FakePlanner
) -> None:
    reconcile(rt, created(kube), step_time_scale=1.3, requests_per_second=9.0, cause="calibration")
    assert planner.calls[-1]["step_time_scale"] == 1.3
    assert planner.calls[-1]["requests_per_second"] == 9.0
    assert planner.calls[-1]["catalog"] is rt.catalog


def test_other_writers_fields_survive(rt: Runtime, kube: FakeKube) -> None:
    body = target_body(observed={"tpotMs": 41.0})
    body["status"]["conditions"] = [
        {"type": "SLOMet", "status": "True", "reason": "Met", "message": "",
         "lastTransitionTime": "2025-12-31T00:00:00Z"}
    ]  # fmt: skip
    kube.add(body)
    reconcile(rt, body)
    assert kube.status()["observed"] == {"tpotMs": 41.0}
    assert cond(kube, "SLOMet")["status"] == "True"


# ---------------------------------------------------------------- readiness


def deployment(status: dict[str, Any] | None = None, desired: int = 2) -> dict[str, Any]:
    return {
        "apiVersion": "apps/v1",
        "kind": "Deployment",
        "metadata": {
            "name": "chat-engine", "namespace": NS, "generation": 2,
            "ownerReferences": [{"kind": "ServingTarget", "name": "chat", "uid": UID,
                                 "controller": True}],
        },
        "spec": {"replicas": desired},
        "status": {"observedGeneration": 2, **(status or {})},
    }  # fmt: skip


@pytest.mark.parametrize(
    ("status", "expected"),
    [
        ({"replicas": 2, "updatedReplicas": 2, "readyReplicas": 2}, ("True", "EngineReady")),
        ({"replicas": 2, "updatedReplicas": 2, "readyReplicas": 1}, ("False", "Deploying")),
        ({"replicas": 3, "updatedReplicas": 1, "readyReplicas": 2}, ("False", "RollingOut")),
        ({}, ("False", "RollingOut")),
        (
            {"replicas": 2, "conditions": [{"type": "Progressing", "status": "False",
                                            "reason": "ProgressDeadlineExceeded",
                                            "message": "stuck"}]},
            ("False", "ProgressDeadlineExceeded"),
        ),
    ],
)  # fmt: skip
def test_readiness(status: dict[str, Any], expected: tuple[str, str]) -> None:
    ready, desired, _ = readiness.readiness(deployment(status))
    assert (ready.status, ready.reason) == expected
    assert desired == 2


def test_readiness_waits_for_the_controller_to_see_the_new_spec() -> None:
    stale = deployment({"replicas": 2, "updatedReplicas": 2, "readyReplicas": 2})
    stale["status"]["observedGeneration"] = 1
    assert readiness.readiness(stale)[0].status == "False"


def test_sync_readiness_writes_ready_and_counts(rt: Runtime, kube: FakeKube) -> None:
    created(kube)
    ready = deployment({"replicas": 2, "updatedReplicas": 2, "readyReplicas": 2})
    readiness.sync_readiness(rt, ready)
    status = kube.status()
    assert (status["ready"], status["replicas"], status["readyReplicas"]) == ("True", 2, 2)
    assert cond(kube, "Ready")["reason"] == "EngineReady"
    writes = kube.status_writes
    readiness.sync_readiness(rt, ready)  # same state: no write
    assert kube.status_writes == writes


def test_sync_readiness_ignores_deployments_of_a_recreated_target(
    rt: Runtime, kube: FakeKube
) -> None:
    body = target_body()
    body["metadata"]["uid"] = "another-uid"
    kube.add(body)
    readiness.sync_readiness(
        rt, deployment({"replicas": 2, "updatedReplicas": 2, "readyReplicas": 2})
    )
    assert kube.status() == {}


NO_FIT = (
    "0/7 nodes are available: 4 Insufficient nvidia.com/gpu, 3 node(s) didn't match "
    "Pod's node affinity/selector."
)


def engine_pod(
    name: str, phase: str = "Pending", scheduled: str | None = "False"
) -> dict[str, Any]:
    conditions = []
    if scheduled is not None:
        conditions.append({"type": "PodScheduled", "status": scheduled,
                           **({"reason": "Unschedulable", "message": NO_FIT}
                              if scheduled == "False" else {})})  # fmt: skip
    return {"kind": "Pod",
            "metadata": {"name": name, "namespace": NS,
                         "labels": builders.labels("chat")},
            "status": {"phase": phase, "conditions": conditions}}  # fmt: skip


def test_readiness_names_pods_the_scheduler_cannot_place() -> None:
    rolling = deployment({"replicas": 2, "updatedReplicas": 2, "readyReplicas": 1})
    pods = [engine_pod("a", "Running", "True"), engine_pod("b")]
    ready, _, _ = readiness.readiness(rolling, pods)
    assert (ready.status, ready.reason) == ("False", "Unschedulable")
    assert ready.message == f"1/2 engine replicas ready; 1 pod(s) cannot be scheduled: {NO_FIT}"
    placed = [engine_pod("a", "Running", "True"), engine_pod("b", scheduled="True")]
    assert readiness.readiness(rolling, placed)[0].reason == "Deploying"
    done = deployment({"replicas": 2, "updatedReplicas": 2, "readyReplicas": 2})
    assert readiness.readiness(done, pods)[0].reason == "EngineReady"


def test_refresh_readiness_sees_pods_the_deployment_does_not_report(
    rt: Runtime, kube: FakeKube
) -> None:
    clock = [0.0]
    rt = replace(rt, clock=lambda: clock[0])
    created(kube)
    starting = deployment({"replicas": 2, "updatedReplicas": 2, "readyReplicas": 1})
    kube.add(engine_pod("b"))
    readiness.refresh_readiness(rt, starting)
    assert cond(kube, "Ready")["reason"] == "Unschedulable"
    assert NO_FIT in cond(kube, "Ready")["message"]
    kube.add(engine_pod("b", scheduled="True"))  # a node joined: placed, still starting
    readiness.refresh_readiness(rt, starting)  # looked a moment ago: not again yet
    assert (kube.pod_lists, cond(kube, "Ready")["reason"]) == (1, "Unschedulable")
    clock[0] += readiness.PODS_LOOK_EVERY_S  # the loop's next tick
    readiness.refresh_readiness(rt, starting)  # the same Deployment status
    assert cond(kube, "Ready")["reason"] == "Deploying"
    lists, writes = kube.pod_lists, kube.status_writes
    readiness.refresh_readiness(rt, None)  # no Deployment (yet)
    readiness.refresh_readiness(rt, deployment({"replicas": 2, "updatedReplicas": 2,
                                               "readyReplicas": 2}))  # fmt: skip
    assert (kube.pod_lists, kube.status_writes) == (lists, writes)  # ready: no API call


class CountingKube(FakeKube):
    status_reads = 0

    def update_status(self, *args: Any, **kwargs: Any) -> dict[str, Any] | None:
        self.status_reads += 1  # the real one reads the target before it writes
        return super().update_status(*args, **kwargs)


def test_deployment_events_that_change_nothing_shown_cost_no_api_call(rt: Runtime) -> None:
    """A rollout's controller updates (observedGeneration, conditions) arrive as events
    that leave the target's readiness as it was: no read, no write."""
    kube = CountingKube()
    rt = replace(rt, kube=kube)
    created(kube)
    done = deployment({"replicas": 2, "updatedReplicas": 2, "readyReplicas": 2})
    readiness.sync_readiness(rt, done)
    assert (kube.status_reads, cond(kube, "Ready")["reason"]) == (1, "EngineReady")
    readiness.sync_readiness(rt, {**done, "status": {**done["status"], "availableReplicas": 2}})
    assert kube.status_reads == 1
    readiness.sync_readiness(rt, deployment({"replicas": 2, "updatedReplicas": 2,
                                            "readyReplicas": 1}))  # fmt: skip
    assert kube.status_reads == 2 and cond(kube, "Ready")["status"] == "False"


def test_a_new_deployments_first_seconds_cost_no_api_call_until_it_is_ready(
    rt: Runtime, kube: FakeKube
) -> None:
    """Under a burst each new Deployment brings a few "0/1 ready" events; the seeded
    Ready=False Deploying already says that. Ready is written at once; a rollout still
    going after PODS_LOOK_EVERY_S has its pods looked at and its progress written."""
    clock = [100.0]
    rt = replace(rt, clock=lambda: clock[0])
    reconcile(rt, created(kube))
    writes = kube.status_writes
    starting = deployment({"replicas": 2, "updatedReplicas": 2, "readyReplicas": 0}, desired=2)
    readiness.sync_readiness(rt, starting)
    assert (kube.pod_lists, kube.status_writes) == (0, writes)
    assert cond(kube, "Ready")["reason"] == "Deploying"
    clock[0] += readiness.PODS_LOOK_EVERY_S
    readiness.sync_readiness(rt, starting)
    assert (kube.pod_lists, kube.status_writes) == (1, writes + 1)
    assert cond(kube, "Ready")["message"].startswith("0/2 engine replicas ready")
    readiness.sync_readiness(rt, deployment({"replicas": 2, "updatedReplicas": 2,
                                            "readyReplicas": 2}))  # fmt: skip
    assert cond(kube, "Ready")["reason"] == "EngineReady"


def test_a_ready_deployment_lists_no_pods(rt: Runtime, kube: FakeKube) -> None:
    created(kube)
    readiness.sync_readiness(rt, deployment({"replicas": 2, "updatedReplicas": 2,
                                            "readyReplicas": 2}))  # fmt: skip
    assert cond(kube, "Ready")["reason"] == "EngineReady" and kube.pod_lists == 0


# ---------------------------------------------------------------- kopf wiring


def test_handler_retries_api_errors_later(rt: Runtime, kube: FakeKube) -> None:
    def broken(obj: Any) -> None:
        raise KubeError(503, "etcd leader changed")

    kube.apply = broken  # type: ignore[method-assign]
    with pytest.raises(kopf.TemporaryError, match="etcd leader changed"):
        handlers.reconcile_target(body=created(kube), memo=kopf.Memo(runtime=rt))


def test_handler_records_reconcile_metrics(rt: Runtime, kube: FakeKube) -> None:
    handlers.reconcile_target(body=created(kube), memo=kopf.Memo(runtime=rt))
    value = rt.metrics.registry.get_sample_value("rooftop_reconciles_total", {"result": "success"})
    assert value == 1.0


def test_a_child_the_api_server_refuses_is_on_the_resource_once(
    rt: Runtime, kube: FakeKube, events: Events
) -> None:
    """A 422 (say, a nodeSelector value over 63 characters) says so in Deployed with the
    server's words and one event; kopf retries, backing off, instead of every 10 s."""
    kube.apply_error = KubeError(422, 'Deployment.apps "chat-engine" is invalid: spec...')
    memo = kopf.Memo(runtime=rt)
    created(kube)
    for attempt in range(3):
        with pytest.raises(kopf.TemporaryError) as err:
            handlers.reconcile_target(body=latest(kube), memo=memo, retry=attempt)
        assert err.value.delay == handlers.retry_delay_s(attempt)
    deployed = cond(kube, "Deployed")
    assert (deployed["status"], deployed["reason"]) == ("False", "ApplyRejected")
    assert "is invalid" in deployed["message"]
    assert [e[1] for e in events.items].count("ApplyRejected") == 1
    assert [handlers.retry_delay_s(n) for n in (0, 1, 2, 10)] == [10.0, 20.0, 40.0, 600.0]


def test_an_outage_while_applying_is_retried_without_a_condition(
    rt: Runtime, kube: FakeKube
) -> None:
    kube.apply_error = KubeError(0, "API server unreachable: connection refused")
    with pytest.raises(kopf.TemporaryError):
        handlers.reconcile_target(body=created(kube), memo=kopf.Memo(runtime=rt))
    deployed = find(kube.status().get("conditions"), "Deployed")
    assert deployed is None or deployed["reason"] != "ApplyRejected"  # not the user's fault


async def test_deleted_target_forgets_its_metrics(rt: Runtime, kube: FakeKube) -> None:
    reconcile(rt, created(kube))
    labels = {"namespace": NS, "name": "chat"}
    assert rt.metrics.registry.get_sample_value("rooftop_target_feasible", labels) == 1.0
    unreachable = replace(rt.config.loop, prometheus_url="http://127.0.0.1:1")
    rt.config = replace(rt.config, loop=unreachable)
    memo = kopf.Memo(runtime=rt)
    await loop.feedback(body=latest(kube), memo=memo, engine_deployments={})
    other = rt.loop.targets[UID]
    rt.loop.targets["other-uid"] = other
    deleted = {"type": "DELETED", "object": target_body()}
    await handlers.target_event(event=deleted, name="chat", namespace=NS, memo=memo)
    assert rt.metrics.registry.get_sample_value("rooftop_target_feasible", labels) is None
    assert rt.loop.targets == {"other-uid": other}  # the loop's memory of it is gone too
    assert set(rt.loop.parsed) == set() and not rt.alive(UID)


# ---------------------------------------------------------------- helpers


def test_served_model_prefers_the_catalog_repo(rt: Runtime) -> None:
    assert children.served_model(parse_spec(SPEC), rt.catalog) == (
        "meta-llama/Llama-3.1-8B-Instruct"
    )
    unknown = parse_spec({**SPEC, "model": "acme/private-7b", "modelConfig": {"x": 1}})
    assert children.served_model(unknown, rt.catalog) == "acme/private-7b"


@pytest.mark.parametrize(
    ("desired", "actual", "expected"),
    [
        ({"a": 1}, {"a": 1, "b": 2}, True),
        ({"a": {"b": [1, {"c": 2}]}}, {"a": {"b": [1, {"c": 2, "d": 3}]}}, True),
        ({"a": [1, 2]}, {"a": [1, 2, 3]}, False),
        ({"a": 1}, {"a": 2}, False),
        ({"a": 1}, {}, False),
    ],
)
def test_is_subset(desired: Any, actual: Any, expected: bool) -> None:
    assert is_subset(desired, actual) is expected


def test_deleted_deployment_of_a_live_target_is_recreated(rt: Runtime, kube: FakeKube) -> None:
    reconcile(rt, created(kube))
    gone = kube.objects.pop(("Deployment", NS, "chat-engine"))
    assert readiness.repair_deleted(rt, gone) is True
    assert kube.get("apps/v1", "Deployment", NS, "chat-engine") is not None


def test_deployment_deleted_with_its_target_is_left_alone(rt: Runtime, kube: FakeKube) -> None:
    reconcile(rt, created(kube))
    gone = kube.objects.pop(("Deployment", NS, "chat-engine"))
    kube.objects.pop(("ServingTarget", NS, "chat"))
    assert readiness.repair_deleted(rt, gone) is False
    assert kube.get("apps/v1", "Deployment", NS, "chat-engine") is None


def test_a_deployment_deleted_with_its_namespace_is_not_repaired_nor_a_warning(
    rt: Runtime, kube: FakeKube, caplog: pytest.LogCaptureFixture
) -> None:
    """Deleting a namespace removes the Deployment before (or after) its target; the
    repair's apply is then refused (HTTP 403, namespace being terminated), which is
    the namespace going away, not a fault to warn about."""
    reconcile(rt, created(kube))
    gone = kube.objects.pop(("Deployment", NS, "chat-engine"))
    kube.apply_error = KubeError(403, f'deployments.apps "chat-engine" is forbidden: unable to '
                                 f"create new content in namespace {NS} because it is being "
                                 "terminated")  # fmt: skip
    with caplog.at_level("DEBUG", logger="rooftop_operator.readiness"):
        readiness.deployment_event(rt, gone, "DELETED")
    assert [r.levelname for r in caplog.records] == ["DEBUG"]
    assert cond(kube, "Deployed")["status"] == "True"  # no ApplyRejected either
    kube.apply_error = KubeError(403, "deployments.apps is forbidden: User cannot create")
    with caplog.at_level("DEBUG", logger="rooftop_operator.readiness"):
        readiness.deployment_event(rt, gone, "DELETED")
    assert caplog.records[-1].levelname == "WARNING"  # RBAC: a real fault, said


def _held(began: bool) -> control.Decision:
    state = replace(control.initial_state(1, 64), held_cap=32)
    return control.Decision(1, 64, "hold 1; max_num_seqs held at 64, not 32: ...", (), state,
                            MetricState.OK, 1, 1, 64, cap_hold_began=began,
                            cause=control.Cause.BUDGET)  # fmt: skip


def test_a_held_batch_cap_is_an_event_once(rt: Runtime, kube: FakeKube, events: Events) -> None:
    body = target_body()
    kube.add(body)
    plan = make_plan(
        gpu="l4",
        tp=1,
        replicas=1,
        max_num_seqs=64,
        weight_dtype="fp8",
        kv_dtype="fp8",
        max_model_len=8192,
        usd_per_hour=0.8,
    )
    obs = Observation(ready_replicas=1)
    loop._apply(rt, body, TargetRef.from_body(body), parse_spec(SPEC), plan, _held(True), obs)
    assert events.items == [("Normal", "BatchCapHeld", _held(True).reason)]
    loop._apply(rt, body, TargetRef.from_body(body), parse_spec(SPEC), plan, _held(False), obs)
    assert len(events.items) == 1  # still held: no event on every tick
    assert kube.applied == []  # nothing changed, nothing written to the Deployment


def _steady(tpot_ms: float, rate: float | None = None) -> tuple[control.Decision, Observation]:
    """A decision that changes nothing, with SLOMet's message carrying the figure, over
    a window that saw ``rate`` requests/s (None: no rate read)."""
    conds = (
        Condition("SLOMet", "True", "SLOMet", f"observed TPOT {tpot_ms:.1f} ms <= SLO 50 ms"),
        Condition("WithinBudget", "True", "WithinBudget", "1 replica, $0.80/h"),
    )
    state = control.initial_state(1, 64)
    d = control.Decision(1, 64, "hold 1", conds, state, MetricState.OK, 1, 1, 64,
                         cause=control.Cause.LOAD_CHANGE)  # fmt: skip
    ok = MetricState.OK
    seen = Reading() if rate is None else Reading(rate, ok)
    return d, Observation(tpot_ms=Reading(tpot_ms, ok), requests_per_second=seen, ready_replicas=1)


def test_a_quiet_tick_writes_nothing(rt: Runtime, kube: FakeKube) -> None:
    """Status is written when something a user can see changed, never for a timestamp
    or a figure moving within its noise: a write per target per tick is what limits how
    many targets one operator runs."""
    body = created(kube)
    plan = make_plan(gpu="l4", replicas=1, usd_per_hour=0.8)
    ref, spec = TargetRef.from_body(body), parse_spec(SPEC)
    loop._apply(rt, body, ref, spec, plan, *_steady(30.0))
    assert kube.status_writes == 1
    rt.now = lambda: "2030-01-01T00:00:00Z"  # a later tick
    loop._apply(rt, latest(kube), ref, spec, plan, *_steady(30.9))  # within 5 %
    assert kube.status_writes == 1
    assert latest(kube)["status"]["observed"]["tpotMs"] == 30.0
    loop._apply(rt, latest(kube), ref, spec, plan, *_steady(36.0))  # news
    assert kube.status_writes == 2
    assert latest(kube)["status"]["observed"]["tpotMs"] == 36.0
    slo = find(latest(kube)["status"]["conditions"], "SLOMet")
    assert slo is not None and "36.0 ms" in slo["message"]


def test_a_window_of_few_requests_moves_within_its_noise(rt: Runtime, kube: FakeKube) -> None:
    """A percentile of a window's few requests wanders by about 1/√n of itself from one
    window to the next: at 1 request/s over the loop's window it may move 20 % without
    a write; at 100 requests/s the same move is news."""
    assert rt.config.loop.window_s == 60.0
    body = created(kube)
    plan = make_plan(gpu="l4", replicas=1, usd_per_hour=0.8)
    ref, spec = TargetRef.from_body(body), parse_spec(SPEC)
    loop._apply(rt, body, ref, spec, plan, *_steady(30.0, rate=1.0))
    loop._apply(rt, latest(kube), ref, spec, plan, *_steady(36.0, rate=1.0))
    assert kube.status_writes == 1
    loop._apply(rt, latest(kube), ref, spec, plan, *_steady(30.0, rate=100.0))  # rate moved
    assert kube.status_writes == 2
    loop._apply(rt, latest(kube), ref, spec, plan, *_steady(36.0, rate=100.0))
    assert kube.status_writes == 3
    assert latest(kube)["status"]["observed"]["tpotMs"] == 36.0


def _at(rate: float, **figures: float) -> dict[str, float]:
    """``status.observed`` figures read over a window that saw ``rate`` requests/s."""
    return {"requestsPerSecond": rate, **figures}


@pytest.mark.parametrize(
    ("old", "new", "changed"),
    [
        ({"tpotMs": 30.0, "time": "t0"}, {"tpotMs": 31.0, "time": "t1"}, False),
        ({"tpotMs": 30.0}, {"tpotMs": 32.0}, True),  # > 5 %
        ({"running": 0.0}, {"running": 1.0}, False),  # a count within its floor
        ({"running": 0.0}, {"running": 2.0}, True),
        ({"tpotMs": 30.0}, {}, True),  # vanished: metrics went missing
        ({"metricsState": "ok"}, {"metricsState": "stale"}, True),
        ({"calibrationSamples": 3}, {"calibrationSamples": 4}, False),  # bookkeeping
        # a percentile of 60 requests (1 req/s over 60 s) wanders by 3·√(2/60) ≈ 55 %
        (_at(1.0, tpotMs=30.0), _at(1.0, tpotMs=42.0), False),
        (_at(1.0, tpotMs=30.0), _at(1.0, tpotMs=48.0), True),
        # of 6,000 requests only by 5.5 %
        (_at(100.0, tpotMs=30.0), _at(100.0, tpotMs=32.0), True),
        ({"requestsPerSecond": 1.0}, {"requestsPerSecond": 1.3}, False),
        ({"requestsPerSecond": 100.0}, {"requestsPerSecond": 110.0}, True),
        # a count of requests: Poisson, 3·√(2·30) ≈ 23 running
        ({"running": 30.0}, {"running": 52.0}, False),
        ({"running": 30.0}, {"running": 54.0}, True),
        # the KV cache holds what the running requests hold: 3·√(2/8) = 150 % at 8
        ({"kvCacheUsageRatio": 0.3, "running": 8.0},
         {"kvCacheUsageRatio": 0.5, "running": 8.0}, False),
        ({"kvCacheUsageRatio": 0.3, "running": 800.0},
         {"kvCacheUsageRatio": 0.35, "running": 800.0}, True),
    ],
)  # fmt: skip
def test_observed_figures_change_beyond_their_noise(
    old: dict[str, Any], new: dict[str, Any], changed: bool
) -> None:
    typed = ObservedStatus.model_validate
    assert loop.observed_changed(typed(old), typed(new), window_s=60.0) is changed


async def test_the_loop_holds_when_an_edit_no_longer_plans(rt: Runtime, kube: FakeKube) -> None:
    # Deployed, then edited: a price for "h100", which is not a catalog id. Reconcile
    # reports that; the feedback timer must hold quietly, not fail on every tick.
    reconcile(rt, created(kube))
    body = latest(kube)
    body["spec"] = {**body["spec"], "pricing": {"usdPerGpuHour": {"h100": 1.0}}}
    body["metadata"]["generation"] = 2
    kube.add(body)
    writes = len(kube.applied)
    memo = SimpleNamespace(runtime=rt)
    await loop.feedback(body=body, memo=memo, engine_deployments={})  # returns, no CatalogError
    assert len(kube.applied) == writes  # the workload is untouched
    assert not rt.loop.targets


class NoDeploymentGets(FakeKube):
    """The API server of a loop that must read Deployments from kopf's index (once
    ``looping``; reconcile itself may read them)."""

    looping = False

    def get(self, api_version: str, kind: str, namespace: str, name: str) -> dict[str, Any] | None:
        assert not (self.looping and kind == "Deployment"), "the loop read a Deployment"
        return super().get(api_version, kind, namespace, name)


async def test_the_loop_reads_the_deployment_from_kopfs_index(rt: Runtime) -> None:
    """No GET per target and tick: the Deployment (here scaled to 3 by the loop before an
    operator restart) comes from the watch's index, and seeds the controller's replicas."""
    kube = NoDeploymentGets()
    rt = replace(
        rt,
        kube=kube,
        config=replace(
            rt.config, loop=replace(rt.config.loop, prometheus_url="http://127.0.0.1:1")
        ),
    )
    reconcile(rt, created(kube))
    body = latest(kube)
    deployment = next(o for (k, _, _), o in kube.objects.items() if k == "Deployment")
    ready = {
        **deployment,
        "spec": {**deployment["spec"], "replicas": 3},
        "status": {"replicas": 3, "readyReplicas": 3, "updatedReplicas": 3},
    }
    index = {(NS, deployment["metadata"]["name"]): [readiness.index_entry(ready)]}
    memo, kube.looping = SimpleNamespace(runtime=rt), True
    await loop.feedback(body=body, memo=memo, engine_deployments=index)
    assert [m.state.replicas for m in rt.loop.targets.values()] == [3]


# ---------------------------------------------------------------- GPU inventory


def l4_node(name: str, gpus: int) -> dict[str, Any]:
    return {"kind": "Node",
            "metadata": {"name": name, "labels": {"nvidia.com/gpu.product": "NVIDIA-L4"}},
            "status": {"allocatable": {"nvidia.com/gpu": str(gpus)}}}  # fmt: skip


# The example with a short chat's workload and budget pinned (plans that shard over a
# few L4s), so the example's own may follow its trace.
SIM_CHAT = {
    **yaml.safe_load((EXAMPLES / "simulated-chat.yaml").read_text())["spec"],
    "workload": {"requestsPerSecond": 4, "promptTokens": {"mean": 512, "p90": 1024},
                 "outputTokens": {"mean": 128, "p90": 256}},
    "budget": {"usdPerHour": 10},
}  # fmt: skip
# fp8 weights allowed: the plan then fits a 2-GPU L4 node (bf16 alone needs four L4s)
# mode vllm: a simulated engine runs on any node, so the inventory does not bound it
L4_ONLY = {**SIM_CHAT, "mode": "vllm",
           "constraints": {**SIM_CHAT["constraints"], "gpuTypes": ["l4"],
                           "weightDtypes": ["bf16", "fp8"]}}  # fmt: skip


@pytest.fixture
def inventory_rt(rt: Runtime) -> Runtime:
    from rooftop_planner.search import plan_target

    return replace(rt, plan=plan_target, config=replace(rt.config, gpu_inventory=True))


def test_with_inventory_the_plan_fits_the_biggest_node(
    inventory_rt: Runtime, kube: FakeKube
) -> None:
    kube.nodes = [l4_node("small", 1), l4_node("big", 2), l4_node("big-2", 2)]
    body = target_body(spec=L4_ONLY)
    kube.add(body)
    assert reconcile(inventory_rt, body) == "success"
    plan = kube.status()["plan"]
    assert (plan["gpu"], plan["tp"], plan["replicas"]) == ("l4", 2, 2)
    assert kube.node_lists == 1
    # no GPUs free beyond the plan's: a rollout replaces one pod at a time, never
    # surging a pod that would wait for GPUs nobody frees
    deployment = next(o for (k, _, _), o in kube.objects.items() if k == "Deployment")
    rolling = deployment["spec"]["strategy"]["rollingUpdate"]
    assert (rolling["maxSurge"], rolling["maxUnavailable"]) == (0, 1)
    kube.nodes.append(l4_node("big-3", 2))  # room for one more: the rollout surges into it
    assert reconcile(inventory_rt, latest(kube)) == "success"
    deployment = next(o for (k, _, _), o in kube.objects.items() if k == "Deployment")
    rolling = deployment["spec"]["strategy"]["rollingUpdate"]
    assert (rolling["maxSurge"], rolling["maxUnavailable"]) == (1, 0)


def gpu_pod(name: str, node: str | None, gpus: int, namespace: str = "other") -> dict[str, Any]:
    """A pod requesting ``gpus`` GPUs, bound to ``node`` (None: waiting for an L4 node)."""
    spec: dict[str, Any] = {"containers": [
        {"name": "c", "resources": {"limits": {"nvidia.com/gpu": str(gpus)}}}]}  # fmt: skip
    if node is None:
        spec["nodeSelector"] = {"nvidia.com/gpu.product": "NVIDIA-L4"}
    else:
        spec["nodeName"] = node
    return {"kind": "Pod", "metadata": {"name": name, "namespace": namespace},
            "spec": spec, "status": {"phase": "Running" if node else "Pending"}}  # fmt: skip


def test_gpus_other_pods_hold_are_not_planned(
    inventory_rt: Runtime, kube: FakeKube, events: Events
) -> None:
    """The plan needs two 2-GPU pods; two 2-L4 nodes have room for them until a pod of
    another team holds one GPU of one node: then the target waits, saying how many GPUs
    are missing, and nothing is deployed."""
    kube.nodes = [l4_node("big", 2), l4_node("big-2", 2)]
    kube.add(gpu_pod("training", "big-2", 1))
    body = target_body(spec=L4_ONLY)
    kube.add(body)
    handlers.reconcile_target(body=body, memo=kopf.Memo(runtime=inventory_rt))
    feasible = cond(kube, "Feasible")
    assert (feasible["status"], feasible["reason"]) == ("False", "NodesUnavailable")
    assert "l4 x2/node (3 free on 2 nodes)" in feasible["message"]
    assert "2 replica(s) need 4 l4 GPUs (2 per node)" in feasible["message"]
    assert "room for 1: 2 more l4 GPUs needed" in feasible["message"]
    assert "Deployment" not in kinds(kube)
    del kube.objects[("Pod", "other", "training")]  # the job finishes: the re-plan deploys
    handlers.replan_waiting(body=latest(kube), memo=kopf.Memo(runtime=inventory_rt))
    assert cond(kube, "Feasible")["status"] == "True" and "Deployment" in kinds(kube)


def test_a_target_planned_next_counts_the_first_ones_deployment_before_its_pods(
    inventory_rt: Runtime, kube: FakeKube
) -> None:
    """The first target's Deployment asks for the four L4s before the scheduler has
    bound a pod: the second target planned next reads the Deployment and waits, instead
    of planning onto the same four GPUs."""
    kube.nodes = [l4_node("big", 2), l4_node("big-2", 2)]
    first = target_body(name="first", spec=L4_ONLY)
    kube.add(first)
    assert reconcile(inventory_rt, first) == "success"
    assert not [o for (k, _, _), o in kube.objects.items() if k == "Pod"]  # none bound yet
    second = target_body(name="second", spec=L4_ONLY)
    kube.add(second)
    assert reconcile(inventory_rt, second) == "waiting-for-nodes"
    feasible = find(kube.status("second").get("conditions"), "Feasible")
    assert feasible is not None and "room for 0: 4 more l4 GPUs needed" in feasible["message"]


def test_a_pod_waiting_for_an_l4_node_claims_its_gpus(
    inventory_rt: Runtime, kube: FakeKube
) -> None:
    kube.nodes = [l4_node("big", 2), l4_node("big-2", 2)]
    kube.add(gpu_pod("queued", None, 2))
    body = target_body(spec=L4_ONLY)
    kube.add(body)
    handlers.reconcile_target(body=body, memo=kopf.Memo(runtime=inventory_rt))
    assert "room for 1: 2 more l4 GPUs needed" in cond(kube, "Feasible")["message"]


def test_the_targets_own_engine_pods_do_not_count_against_it(
    inventory_rt: Runtime, kube: FakeKube
) -> None:
    kube.nodes = [l4_node("big", 2), l4_node("big-2", 2)]
    body = target_body(spec=L4_ONLY)
    kube.add(body)
    for i, node in enumerate(("big", "big-2")):  # its running engines, before a re-plan
        pod = gpu_pod(f"engine-{i}", node, 2, namespace=body["metadata"]["namespace"])
        pod["metadata"]["labels"] = {"rooftop.dev/servingtarget": body["metadata"]["name"]}
        kube.add(pod)
    assert reconcile(inventory_rt, body) == "success"
    assert kube.status()["plan"]["replicas"] == 2


def test_no_node_big_enough_waits_and_says_which_nodes_would_do(
    inventory_rt: Runtime, kube: FakeKube, events: Events
) -> None:
    kube.nodes = [l4_node("small", 1)]
    body = target_body(spec=L4_ONLY)
    kube.add(body)
    # no handler failure: kopf would log each retry as an error and post an Error event
    handlers.reconcile_target(body=body, memo=kopf.Memo(runtime=inventory_rt))
    assert waiting_for_nodes(latest(kube)["status"])
    feasible = cond(kube, "Feasible")
    assert feasible["status"] == "False"
    # the message names the node size of the plan the whole catalog would give
    from rooftop_api.spec import ServingTargetSpec
    from rooftop_planner.search import plan_target

    best = plan_target(ServingTargetSpec.model_validate(L4_ONLY)).plan
    assert best is not None and best.tp > 1
    assert f"with nodes of {best.tp} l4 GPU(s) each, this would work" in feasible["message"]
    assert kinds(kube) == set()  # nothing deployed
    assert feasible["reason"] == "NodesUnavailable"
    assert events.reasons == ["NodesUnavailable"]
    handlers.replan_waiting(body=latest(kube), memo=kopf.Memo(runtime=inventory_rt))
    assert kinds(kube) == set()  # still no node: still waiting, nothing deployed
    kube.nodes += [l4_node("big", 2), l4_node("big-2", 2)]  # nodes arrive: the timer deploys
    handlers.replan_waiting(body=latest(kube), memo=kopf.Memo(runtime=inventory_rt))
    assert cond(kube, "Feasible")["status"] == "True" and "Deployment" in kinds(kube)
    assert not waiting_for_nodes(latest(kube)["status"])


@pytest.mark.parametrize(
    ("conditions", "waiting"),
    [
        ([{"type": "Feasible", "status": "False", "reason": "NodesUnavailable"}], True),
        ([{"type": "Feasible", "status": "False", "reason": "Infeasible"}], False),
        ([{"type": "Feasible", "status": "True", "reason": "PlanFound"}], False),
        ([{"type": "Planned", "status": "False", "reason": "NodesUnavailable"}], False),
        ([], False),
        (None, False),
    ],
)
def test_only_targets_waiting_for_nodes_get_the_replan_timer(
    conditions: list[dict[str, str]] | None, waiting: bool
) -> None:
    """An infeasible spec waits for an edit, not for nodes: planning it again every
    minute would only repeat the same answer."""
    assert waiting_for_nodes({"conditions": conditions}) is waiting


def test_the_replan_timer_runs_at_the_configured_interval() -> None:
    registry = kopf.OperatorRegistry()
    wiring.register_handlers(OperatorConfig(nodes_retry_s=5.0), registry)
    spawning = registry._spawning.get_all_handlers()  # kopf keeps timers with daemons
    timers = [h for h in spawning if type(h).__name__ == "TimerHandler"]
    assert [(t.interval, t.initial_delay) for t in timers] == [(5.0, 5.0)]


async def test_the_loop_scales_up_only_as_far_as_the_free_gpus_hold(
    inventory_rt: Runtime, kube: FakeKube
) -> None:
    """Two 2-L4 nodes hold two TP2 replicas; the SLO asks for more: the loop's scale-up
    stops at two and says InventoryLimited. Nodes and pods are listed for the scale-up
    only, never for a tick that holds."""
    from rooftop_control.sizing import PlanTargetPlanner
    from rooftop_planner.inventory import GpuInventory
    from rooftop_planner.search import plan_target

    kube.nodes = [l4_node("big", 2), l4_node("big-2", 2)]
    body = target_body(spec=L4_ONLY)
    kube.add(body)
    spec, ref = parse_spec(L4_ONLY), TargetRef.from_body(body)
    plan = plan_target(spec, gpu_inventory=GpuInventory({"l4": 2})).plan
    assert plan is not None and (plan.tp, plan.replicas) == (2, 2)
    cfg = control.config_from_spec(spec, PlanTargetPlanner(spec, plan), 1.6)
    state = control.initial_state(2, plan.max_num_seqs)
    busy = Observation(
        tpot_ms=Reading(60.0, MetricState.OK),  # over the 25 ms SLO: more replicas
        ttft_ms=Reading(500.0, MetricState.OK),
        requests_per_second=Reading(20.0, MetricState.OK),
        running=Reading(32.0, MetricState.OK),
        waiting=Reading(16.0, MetricState.OK),
        kv_usage_ratio=Reading(0.3, MetricState.OK),
        step_ms=Reading(60.0, MetricState.OK),
        ready_replicas=2,
    )
    wanted = control.decide(state, busy, 1000.0, cfg)
    assert wanted.replicas > 2
    inputs = (state, busy, 1000.0, cfg)
    got = await loop._within_inventory(inventory_rt, ref, spec, plan, wanted, inputs)
    assert got.replicas == 2 and kube.node_lists == 1
    slo = next(c for c in got.conditions if c.type == "SLOMet")
    assert slo.reason == "InventoryLimited"
    # the next tick holds at two: it lists nothing
    assert await loop._within_inventory(inventory_rt, ref, spec, plan, got, inputs) is got
    assert kube.node_lists == 1


def test_two_loops_deciding_on_the_same_free_gpus_are_applied_one_after_the_other(
    inventory_rt: Runtime, kube: FakeKube
) -> None:
    """Two targets of one TP2 replica each and one free 2-L4 node: both loops decide a
    second replica in the same tick, each counting the free node. The first scale-up is
    applied; the second finds the node taken by the first's Deployment and applies
    nothing (the next tick decides within what is left), so no pod waits Pending."""
    from rooftop_control.sizing import PlanTargetPlanner
    from rooftop_planner.inventory import GpuInventory
    from rooftop_planner.search import plan_target

    kube.nodes = [l4_node("n-1", 2), l4_node("n-2", 2), l4_node("n-3", 2)]
    spec = parse_spec(L4_ONLY)
    two = plan_target(spec, gpu_inventory=GpuInventory({"l4": 2})).plan
    assert two is not None and two.tp == 2
    one = two.rescaled(1, two.max_num_seqs, two.usd_per_replica_hour)
    refs = [TargetRef.from_body(target_body(name, L4_ONLY)) for name in ("a", "b")]
    for ref in refs:
        apply_children(inventory_rt, ref, spec, one)
    cfg = control.config_from_spec(spec, PlanTargetPlanner(spec, one), 1.6)
    base = control.decide(control.initial_state(1, one.max_num_seqs), Observation(), 0.0, cfg)
    grow = replace(base, replicas=2, previous_replicas=1)
    price = loop.fleet_price(spec, inventory_rt.catalog, one)
    loop._apply_scale(inventory_rt, refs[0], spec, one, grow, price)
    with pytest.raises(loop.GpusTaken, match="free GPUs now hold 1"):
        loop._apply_scale(inventory_rt, refs[1], spec, one, grow, price)
    replicas = {n: o["spec"]["replicas"] for (k, _, n), o in kube.objects.items()
                if k == "Deployment"}  # fmt: skip
    assert sorted(replicas.values()) == [1, 2]
    assert sum(replicas.values()) * two.tp == 6  # the three nodes' GPUs, none over
    # a scale-down or a hold is never refused, whatever is free
    loop._apply_scale(inventory_rt, refs[1], spec, one, replace(base, previous_replicas=1), price)


async def test_a_scale_up_whose_gpus_were_taken_leaves_the_loop_as_it_was(
    rt: Runtime, kube: FakeKube, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The tick that finds its free GPUs taken (``GpusTaken``) writes nothing and keeps
    the controller's memory as before the decision, so the next tick decides again from
    the fleet there is rather than waiting for pods it never asked for."""
    reconcile(rt, created(kube))
    body = latest(kube)
    deployment = next(o for (k, _, _), o in kube.objects.items() if k == "Deployment")
    replicas = deployment["spec"]["replicas"]
    ready = {**deployment, "status": {"replicas": replicas, "readyReplicas": replicas,
                                      "updatedReplicas": replicas}}  # fmt: skip
    index = {(NS, deployment["metadata"]["name"]): [readiness.index_entry(ready)]}
    busy = Observation(
        tpot_ms=Reading(500.0, MetricState.OK),  # ten times the 50 ms SLO: scale up
        ttft_ms=Reading(900.0, MetricState.OK),
        requests_per_second=Reading(40.0, MetricState.OK),
        running=Reading(64.0, MetricState.OK),
        waiting=Reading(64.0, MetricState.OK),
        kv_usage_ratio=Reading(0.5, MetricState.OK),
        step_ms=Reading(500.0, MetricState.OK),
        ready_replicas=replicas,
    )

    async def observed(*_: Any) -> tuple[Observation, list[str]]:
        return busy, []

    def taken(*_: Any) -> None:
        raise loop.GpusTaken("taken by another target")

    monkeypatch.setattr(loop, "_observe", observed)
    monkeypatch.setattr(loop, "_apply_scale", taken)
    memo, before = SimpleNamespace(runtime=rt), copy.deepcopy(latest(kube))
    await loop.feedback(body=body, memo=memo, engine_deployments=index)
    [memory] = rt.loop.targets.values()
    assert memory.state.replicas == replicas  # not the scale-up that never happened
    assert latest(kube) == before  # no status written
    assert deployment == next(o for (k, _, _), o in kube.objects.items() if k == "Deployment")
    monkeypatch.setattr(loop, "_apply_scale", lambda *_: None)  # the GPUs are free again
    await loop.feedback(body=body, memo=memo, engine_deployments=index)
    assert memory.state.replicas > replicas  # decided again, and taken this time


def test_with_inventory_only_nodes_the_pods_tolerate_count(
    inventory_rt: Runtime, kube: FakeKube
) -> None:
    bigs = [l4_node("big", 2), l4_node("big-2", 2)]
    for big in bigs:
        big["spec"] = {"taints": [{"key": "dedicated", "value": "llm", "effect": "NoSchedule"}]}
    kube.nodes = [l4_node("small", 1), *bigs]
    body = target_body(spec=L4_ONLY)
    kube.add(body)
    handlers.reconcile_target(body=body, memo=kopf.Memo(runtime=inventory_rt))
    assert waiting_for_nodes(latest(kube)["status"])
    assert "taint dedicated=llm:NoSchedule not tolerated" in cond(kube, "Feasible")["message"]
    tolerant = {**L4_ONLY, "constraints": {**L4_ONLY["constraints"],
                "tolerations": [{"key": "dedicated", "operator": "Exists"}]}}  # fmt: skip
    body = target_body(name="tolerant", spec=tolerant)
    kube.add(body)
    assert reconcile(inventory_rt, body) == "success"
    deployment = next(o for (k, _, n), o in kube.objects.items() if k == "Deployment"
                      and n.startswith("tolerant"))  # fmt: skip
    pods = deployment["spec"]["template"]["spec"]
    assert {"key": "dedicated", "operator": "Exists"} in pods["tolerations"]
    assert kube.status("tolerant")["plan"]["tp"] == 2


def test_without_inventory_nodes_are_never_read(
    rt: Runtime, kube: FakeKube, planner: FakePlanner
) -> None:
    reconcile(rt, created(kube))
    assert kube.node_lists == 0 and "gpu_inventory" not in planner.calls[0]


def test_a_failed_node_list_retries_and_changes_nothing(
    inventory_rt: Runtime, kube: FakeKube
) -> None:
    kube.nodes_error = KubeError(403, "nodes is forbidden")
    with pytest.raises(kopf.TemporaryError, match="nodes is forbidden"):
        handlers.reconcile_target(body=created(kube), memo=kopf.Memo(runtime=inventory_rt))
    assert kinds(kube) == set() and kube.status() == {}


def test_a_simulated_target_is_not_bound_by_the_gpus_the_nodes_offer(
    inventory_rt: Runtime, kube: FakeKube
) -> None:
    """A simulated engine asks for no GPU, so a cluster without GPU nodes (the try-it
    path) still plans and deploys it."""
    kube.nodes = []
    body = target_body(spec={**L4_ONLY, "mode": "simulated"})
    kube.add(body)
    handlers.reconcile_target(body=body, memo=kopf.Memo(runtime=inventory_rt))
    assert not waiting_for_nodes(latest(kube)["status"])
    assert find(latest(kube)["status"]["conditions"], "Deployed")["status"] == "True"

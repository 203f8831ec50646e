"""A fleet of several GPU types, deployed: one Deployment per pool behind one Service,
pools the plan no longer has pruned once the new ones serve, readiness over every pool,
and the loop's growth onto the cheapest pool, spilling to the next when one type's free
GPUs run out."""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest
import yaml
from operator_fakes import NS, UID, FakeKube, target_body

from rooftop_control import control
from rooftop_control.readings import MetricState, Observation, Reading
from rooftop_control.sizing import PlanTargetPlanner
from rooftop_operator import loop, readiness
from rooftop_operator.reconcile import keep_loop_scale, reconcile
from rooftop_operator.runtime import Runtime
from rooftop_operator.specs import TargetRef, parse_spec
from rooftop_planner.catalog import Catalog
from rooftop_planner.plan import Plan
from rooftop_planner.search import plan_target

EXAMPLE = Path(__file__).resolve().parents[3] / "examples" / "owned-a100s.yaml"
# four owned A100s and one on-demand GPU of another type cost less than six A100s
SPEC: dict[str, Any] = {**yaml.safe_load(EXAMPLE.read_text())["spec"], "mode": "vllm"}


def deployments(kube: FakeKube) -> dict[str, dict[str, Any]]:
    return {n: o for (k, _, n), o in kube.objects.items() if k == "Deployment"}


def gpu_node(catalog: Catalog, name: str, gpu_id: str, gpus: int) -> dict[str, Any]:
    gpu = catalog.gpu(gpu_id)
    return {"kind": "Node",
            "metadata": {"name": name, "labels": {gpu.node_label_key: gpu.node_label_value}},
            "status": {"allocatable": {gpu.resource_name: str(gpus)}}}  # fmt: skip


@pytest.fixture
def planned_rt(rt: Runtime) -> Runtime:
    return replace(rt, plan=plan_target)


def deployed_mix(rt: Runtime, kube: FakeKube, spec: dict[str, Any] = SPEC) -> Plan:
    body = target_body(spec=spec)
    kube.add(body)
    assert reconcile(rt, body) == "success"
    plan = Plan.from_status(kube.status()["plan"])
    assert len(plan.pools) == 2
    return plan


def test_a_cheaper_mix_deploys_one_deployment_per_pool_behind_one_service(
    planned_rt: Runtime, kube: FakeKube
) -> None:
    plan = deployed_mix(planned_rt, kube)
    pools = {p.gpu: p for p in plan.pools}
    found = deployments(kube)
    assert set(found) == {f"chat-engine-{gpu}" for gpu in pools}
    for gpu, pool in pools.items():
        dep = found[f"chat-engine-{gpu}"]
        assert dep["spec"]["replicas"] == pool.replicas
        # each pool selects its own pods only: two Deployments never fight over a pod
        assert dep["spec"]["selector"]["matchLabels"]["rooftop.dev/pool"] == gpu
        template = dep["spec"]["template"]
        assert template["metadata"]["labels"]["rooftop.dev/pool"] == gpu
        node_label = planned_rt.catalog.gpu(gpu)
        assert template["spec"]["nodeSelector"][node_label.node_label_key] == (
            node_label.node_label_value
        )
        args = template["spec"]["containers"][0]["args"]
        assert args[args.index("--tensor-parallel-size") + 1] == str(pool.tp)
    [service] = [o for (k, _, _), o in kube.objects.items() if k == "Service"]
    assert "rooftop.dev/pool" not in service["spec"]["selector"]  # one Service, every pool
    status = kube.status()
    assert status["gpu"] == "+".join(pools)
    assert plan.replicas == sum(p.replicas for p in plan.pools)
    feasible = next(c for c in status["conditions"] if c["type"] == "Feasible")
    assert (
        "cost $1.89/h less than the best single type (3 replicas of 2x a100-80gb"
        in (feasible["message"])
    )


def test_a_resumed_mix_keeps_the_loops_pool_counts(planned_rt: Runtime, kube: FakeKube) -> None:
    plan = deployed_mix(planned_rt, kube)
    grown = replace(plan, replicas=plan.replicas + 1, pools=(
        plan.pools[0].rescaled(plan.pools[0].replicas + 1), plan.pools[1]))  # fmt: skip
    kept = keep_loop_scale(plan, grown)
    assert [p.replicas for p in kept.pools] == [p.replicas for p in grown.pools]
    assert kept.replicas == grown.replicas


def test_the_loop_grows_the_cheapest_pool_and_spills_when_its_gpus_are_taken(
    planned_rt: Runtime, kube: FakeKube, catalog: Catalog
) -> None:
    """Free: one 8-A100 node (two TP4 pods) and two 1-GH200 nodes. The owned A100 pod
    costs nothing and a GH200 pod less than four on-demand A100s, so growth takes the
    GH200s first; once both are taken it spills onto the A100 node; past every free GPU
    the scale-up is refused (``GpusTaken``) and nothing is applied."""
    rt = replace(planned_rt, config=replace(planned_rt.config, gpu_inventory=True))
    kube.nodes = [gpu_node(catalog, "a100", "a100-80gb", 8),
                  *(gpu_node(catalog, f"gh{i}", "gh200", 1) for i in range(2))]  # fmt: skip
    roomy = {**SPEC, "budget": {"usdPerHour": 40}}  # the same mix, room for on-demand A100s
    plan = deployed_mix(rt, kube, roomy)
    assert {p.gpu for p in plan.pools} == {"a100-80gb", "gh200"}
    spec = parse_spec(roomy)
    ref = TargetRef.from_body(target_body(spec=roomy))
    price = loop.fleet_price(spec, catalog, plan)
    cfg = control.config_from_spec(spec, PlanTargetPlanner(spec, plan), price)
    start = control.initial_state(plan.replicas, plan.max_num_seqs)
    base = control.decide(start, Observation(), 0.0, cfg)

    def grow(pods: int) -> Plan:
        d = replace(base, replicas=pods, previous_replicas=plan.replicas)
        return loop._apply_scale(rt, ref, spec, plan, d, price)

    def replicas() -> dict[str, int]:
        return {n: o["spec"]["replicas"] for n, o in deployments(kube).items()}

    grow(3)
    assert replicas() == {"chat-engine-a100-80gb": 1, "chat-engine-gh200": 2}
    grown = grow(4)  # no GH200 left: the next pod is an on-demand A100 pod
    assert replicas() == {"chat-engine-a100-80gb": 2, "chat-engine-gh200": 2}
    assert grown.usd_per_hour == pytest.approx(sum(p.usd_per_hour for p in grown.pools))
    with pytest.raises(loop.GpusTaken, match="free GPUs now hold 4"):
        grow(5)
    assert replicas() == {"chat-engine-a100-80gb": 2, "chat-engine-gh200": 2}


def test_the_loop_prices_a_mix_by_its_cheapest_pods(
    planned_rt: Runtime, kube: FakeKube, catalog: Catalog
) -> None:
    """The budget limit and status price pods as the split places them: the owned A100
    pod first ($0), then GH200 pods."""
    plan = deployed_mix(planned_rt, kube)
    price = loop.fleet_price(parse_spec(SPEC), catalog, plan)
    gh200 = catalog.gpus["gh200"].usd_per_gpu_hour
    assert price.usd_per_hour(1) == 0.0
    assert price.usd_per_hour(3) == pytest.approx(2 * gh200)
    assert price.affordable(12.0, 8) == 1 + int(12.0 / gh200 + 1e-9)


def overloaded(rate: float, ready: int) -> Observation:
    """A window at ``rate`` req/s with TPOT ten times the SLO and a queue: scale up."""
    ok = MetricState.OK
    return Observation(
        tpot_ms=Reading(250.0, ok), ttft_ms=Reading(900.0, ok),
        requests_per_second=Reading(rate, ok), running=Reading(64.0, ok),
        waiting=Reading(64.0, ok), kv_usage_ratio=Reading(0.5, ok),
        step_ms=Reading(250.0, ok), ready_replicas=ready,
    )  # fmt: skip


def entry(name: str, replicas: int, ready: int, uid: str = UID) -> dict[str, Any]:
    """An engine Deployment as kopf's index and watch events hand it over."""
    owner = {"kind": "ServingTarget", "name": "chat", "uid": uid, "controller": True}
    return {"metadata": {"name": name, "namespace": NS, "generation": 1,
                         "ownerReferences": [owner],
                         "labels": {"rooftop.dev/servingtarget": "chat",
                                    "rooftop.dev/pool": name.split("engine-")[-1]}},
            "spec": {"replicas": replicas},
            "status": {"observedGeneration": 1, "replicas": replicas, "readyReplicas": ready,
                       "updatedReplicas": replicas}}  # fmt: skip


def test_pools_the_plan_no_longer_has_are_found_in_the_index(catalog: Catalog) -> None:
    """After a switch from one GPU type to pools, the old Deployment is obsolete (only
    this target's: another uid's is left alone)."""
    ref = TargetRef.from_body(target_body())
    names = ["chat-engine-a100-80gb", "chat-engine-gh200"]
    index: dict[tuple[str, str], list[dict[str, Any]]] = {(NS, n): [entry(n, 1, 1)] for n in names}
    assert loop.obsolete_engines(index, ref, names, catalog) == []
    index[(NS, "chat-engine")] = [entry("chat-engine", 3, 3)]
    index[(NS, "chat-engine-l4")] = [entry("chat-engine-l4", 1, 1, uid="someone-else")]
    assert loop.obsolete_engines(index, ref, names, catalog) == ["chat-engine"]


def test_a_mix_is_ready_when_every_pool_is(rt: Runtime, kube: FakeKube) -> None:
    kube.add(target_body())
    kube.add({"kind": "Deployment", **entry("chat-engine-a100-80gb", 1, 1)})
    kube.add({"kind": "Deployment", **entry("chat-engine-gh200", 2, 0)})
    readiness.sync_readiness(rt, entry("chat-engine-a100-80gb", 1, 1))
    status = kube.status()
    ready = next(c for c in status["conditions"] if c["type"] == "Ready")
    assert (ready["status"], status["replicas"], status["readyReplicas"]) == ("False", 3, 1)
    kube.add({"kind": "Deployment", **entry("chat-engine-gh200", 2, 2)})
    readiness.sync_readiness(rt, entry("chat-engine-gh200", 2, 2))
    ready = next(c for c in kube.status()["conditions"] if c["type"] == "Ready")
    assert (ready["status"], ready["message"]) == ("True", "3/3 engine replicas ready")


def test_a_pruned_pool_is_not_recreated(planned_rt: Runtime, kube: FakeKube) -> None:
    deployed_mix(planned_rt, kube)
    applied = len(kube.applied)
    assert not readiness.repair_deleted(planned_rt, entry("chat-engine", 3, 3))
    assert len(kube.applied) == applied
    kube.objects.pop(("Deployment", NS, "chat-engine-gh200"))
    assert readiness.repair_deleted(planned_rt, entry("chat-engine-gh200", 1, 1))
    assert ("Deployment", NS, "chat-engine-gh200") in kube.objects


async def test_a_busy_mix_is_scaled_by_the_loop_onto_its_cheapest_pool(
    planned_rt: Runtime, kube: FakeKube, monkeypatch: pytest.MonkeyPatch
) -> None:
    """One tick of the loop on a deployed mix under ten times the TPOT SLO: it reads every
    pool's Deployment from kopf's index, grows the fleet, and writes the pools' new
    counts to their Deployments and to ``status.plan.pools``."""
    from types import SimpleNamespace

    plan = deployed_mix(planned_rt, kube)
    index = {}
    for name, dep in deployments(kube).items():
        n = dep["spec"]["replicas"]
        ready = {**dep, "status": {"replicas": n, "readyReplicas": n, "updatedReplicas": n}}
        index[(NS, name)] = [readiness.index_entry(ready)]
    busy = overloaded(40.0, plan.replicas)

    async def observed(*_: Any) -> tuple[Observation, list[str]]:
        return busy, []

    monkeypatch.setattr(loop, "_observe", observed)
    body = kube.get_target(NS, "chat")
    assert body is not None
    await loop.feedback(body=body, memo=SimpleNamespace(runtime=planned_rt),
                        engine_deployments=index)  # fmt: skip
    stored = Plan.from_status(kube.status()["plan"])
    assert stored.replicas > plan.replicas
    counts = {p.gpu: p.replicas for p in stored.pools}
    assert sum(counts.values()) == stored.replicas
    assert {n.removeprefix("chat-engine-"): d["spec"]["replicas"]
            for n, d in deployments(kube).items()} == counts  # fmt: skip
    # the owned A100 pod stays; the pods added are the next cheapest, GH200 ones
    assert counts["a100-80gb"] == 1 and counts["gh200"] > 1
    assert kube.deleted == []  # both pools are the plan's


def test_the_fleets_step_time_weighs_each_pools_pods(planned_rt: Runtime, kube: FakeKube) -> None:
    """The calibration compares vLLM's mean inter-token latency over every pod with the
    fleet's predicted step: each pool's step at the window's batch, weighed by its ready
    pods (evenly spread, every pod decodes the same tokens per second). The sizing is
    the slowest pool's."""
    from rooftop_control.sizing import FleetPlanner, PlanTargetPlanner

    plan = deployed_mix(planned_rt, kube)
    spec = parse_spec(SPEC)
    fleet = FleetPlanner(spec, plan)
    alone = {p.gpu: PlanTargetPlanner(spec, p).step_ms(16, 1155, 211) for p in plan.pools}
    assert len(set(alone.values())) == 2  # the two GPU types step at different speeds
    fleet.counted({"a100-80gb": 1, "gh200": 3})
    want = (alone["a100-80gb"] + 3 * alone["gh200"]) / 4
    assert fleet.step_ms(16, 1155, 211) == pytest.approx(want)
    fleet.counted({"a100-80gb": 0, "gh200": 0})  # none ready: the last weights stand
    assert fleet.step_ms(16, 1155, 211) == pytest.approx(want)
    lead = PlanTargetPlanner(spec, plan)
    assert fleet.size(30.0, 1.0) == lead.size(30.0, 1.0)


async def test_growth_that_spills_onto_a_dearer_type_stays_within_the_budget(
    planned_rt: Runtime, kube: FakeKube, catalog: Catalog
) -> None:
    """Under a load that wants every pod maxReplicas allows, the loop's scale-up within
    the free GPUs (two GH200 pods, then on-demand A100 pods) is priced where the pods
    land, and never costs more than the budget."""
    rt = replace(planned_rt, config=replace(planned_rt.config, gpu_inventory=True))
    kube.nodes = [gpu_node(catalog, "a100", "a100-80gb", 16),
                  *(gpu_node(catalog, f"gh{i}", "gh200", 1) for i in range(2))]  # fmt: skip
    plan = deployed_mix(rt, kube)
    spec = parse_spec(SPEC)
    ref = TargetRef.from_body(target_body(spec=SPEC))
    price = loop.fleet_price(spec, catalog, plan)
    cfg = control.config_from_spec(spec, PlanTargetPlanner(spec, plan), price)
    busy = overloaded(60.0, plan.replicas)
    state = control.initial_state(plan.replicas, plan.max_num_seqs)
    wanted = control.decide(state, busy, 0.0, cfg)
    # priced as if every GH200 pod found a GPU: more pods than the free GPUs hold at it
    assert wanted.replicas > 1 + 2
    d = await loop._within_inventory(rt, ref, spec, plan, wanted, (state, busy, 0.0, cfg))
    grown = loop._apply_scale(rt, ref, spec, plan, d, price)
    assert plan.replicas < d.replicas < wanted.replicas
    assert grown.usd_per_hour <= SPEC["budget"]["usdPerHour"]
    assert d.usd_per_hour == pytest.approx(grown.usd_per_hour)
    assert {p.gpu: p.replicas for p in grown.pools}["gh200"] == 2  # the cheap pods first
    # a decision priced before a type's GPUs were taken is refused, not applied
    with pytest.raises(loop.GpusTaken, match="over the \\$12.00/h budget"):
        loop._apply_scale(rt, ref, spec, plan, replace(d, replicas=d.replicas + 1), price)


@pytest.mark.parametrize("counted", [False, True])
async def test_an_old_deployment_goes_before_its_replacement_serves_only_on_counted_gpus(
    planned_rt: Runtime, kube: FakeKube, monkeypatch: pytest.MonkeyPatch, counted: bool
) -> None:
    """The target switched from one GPU type to pools, and the new pods cannot be
    scheduled. With ``gpuInventory: nodes`` the plan fits the free GPUs counting the
    target's own, so the GPUs they wait for are the old pods': the old Deployment goes.
    Without, the new pods may wait for nodes that never come, and the old pods keep
    serving."""
    from types import SimpleNamespace

    rt = replace(planned_rt, config=replace(planned_rt.config, gpu_inventory=counted))
    kube.nodes = [gpu_node(rt.catalog, "a100", "a100-80gb", 8),
                  gpu_node(rt.catalog, "gh", "gh200", 1)]  # fmt: skip
    plan = deployed_mix(rt, kube)
    index = {(NS, n): [readiness.index_entry(d)] for n, d in deployments(kube).items()}
    index[(NS, "chat-engine")] = [entry("chat-engine", 3, 3)]
    body = kube.get_target(NS, "chat")
    assert body is not None
    stuck = {"type": "Ready", "status": "False", "reason": "Unschedulable",
             "message": "0/2 engine replicas ready; 1 pod(s) cannot be scheduled",
             "lastTransitionTime": "2026-12-06T00:00:00Z"}  # fmt: skip
    body["status"]["conditions"] = [
        c for c in body["status"]["conditions"] if c["type"] != "Ready"
    ] + [stuck]

    async def missing(*_: Any) -> tuple[Observation, list[str]]:
        return Observation(ready_replicas=0, pending_replicas=plan.replicas), []

    monkeypatch.setattr(loop, "_observe", missing)
    await loop.feedback(body=body, memo=SimpleNamespace(runtime=rt), engine_deployments=index)
    assert kube.deleted == (["chat-engine"] if counted else [])


def test_a_pool_slower_than_planned_gets_its_own_factor_and_more_pods(
    planned_rt: Runtime, kube: FakeKube
) -> None:
    """The pools' own series say the GH200 pods step 1.6x slower than predicted while
    the A100 pods step as predicted: the GH200's ratio to the pods' mean factor rises,
    the A100's falls, and at a rate the A100 pool alone would size for, the fleet now
    takes the pods the GH200 pool needs at its own factor."""
    from rooftop_control.sizing import FleetPlanner

    plan = deployed_mix(planned_rt, kube)
    spec = parse_spec(SPEC)
    fleet = FleetPlanner(spec, plan)
    before = fleet.size(40.0, 1.0)
    a100, gh200 = (fleet.pools[g].step_ms(24, 1155, 211) for g in ("a100-80gb", "gh200"))
    ok = MetricState.OK
    for _ in range(20):  # windows of the same news: the smoothed ratios settle
        fleet.observed(
            (("a100-80gb", Reading(a100, ok), Reading(24.0, ok)),
             ("gh200", Reading(1.6 * gh200, ok), Reading(24.0, ok))),
            1155, 211,
        )  # fmt: skip
    assert fleet.ratios["gh200"] > 1.2 > 0.9 > fleet.ratios["a100-80gb"]
    assert fleet.size(40.0, 1.0).replicas > before.replicas
    # one pool's reading alone says nothing about the ratio
    one = FleetPlanner(spec, plan)
    one.observed((("gh200", Reading(3 * gh200, ok), Reading(24.0, ok)),), 1155, 211)
    assert one.ratios == {"a100-80gb": 1.0, "gh200": 1.0}


def test_the_pools_own_readings_reach_the_observation() -> None:
    """Prometheus' per-pool answers (``pool_queries``) become the observation's
    ``pool_steps`` in the controller's units (ms, tokens per step)."""
    from rooftop_operator import metrics_client

    ok = MetricState.OK
    snap = metrics_client.TargetMetrics(
        {},
        pools={
            "step_s": {"gh200": Reading(0.02, ok), "a100-80gb": Reading(0.015, ok)},
            "step_batch": {"gh200": Reading(30.0, ok)},
        },
    )
    obs = loop.observation(snap, 3, 0)
    assert obs.pool_steps == (
        ("a100-80gb", Reading(15.0, ok), Reading()),
        ("gh200", Reading(20.0, ok), Reading(30.0, ok)),
    )
    queries = metrics_client.pool_queries("1m")
    assert set(queries) == {"step_s", "step_batch"}
    assert all("by (namespace, servingtarget, pool)" in q and 'pool!=""' in q
               for q in queries.values())  # fmt: skip


def test_a_snapshot_keeps_each_targets_pools_apart_and_fresh() -> None:
    from rooftop_operator import metrics_client
    from rooftop_operator.metrics_client import Answer, FleetMetrics

    ok = MetricState.OK
    body = {"status": "success", "data": {"resultType": "vector", "result": [
        {"metric": {"namespace": NS, "servingtarget": "chat", "pool": "gh200"},
         "value": [1000.0, "0.02"]},
        {"metric": {"namespace": NS, "servingtarget": "other", "pool": "gh200"},
         "value": [1000.0, "0.05"]},
    ]}}  # fmt: skip
    answers, error = metrics_client._parse_grouped(body, metrics_client.POOL_GROUP)
    assert error == "" and set(answers) == {(NS, "chat", "gh200"), (NS, "other", "gh200")}
    ages = {(NS, "chat"): Reading(5.0, ok), (NS, "other"): Reading(900.0, ok)}
    fleet = FleetMetrics(ages, {}, stale_after_s=60.0, pools={"step_s": answers})
    assert fleet.target(NS, "chat").pool("step_s", "gh200") == Reading(0.02, ok)
    assert fleet.target(NS, "other").pool("step_s", "gh200").state is MetricState.STALE
    assert fleet.target(NS, "chat").pool("step_s", "l4") == Reading()
    assert isinstance(answers[(NS, "chat", "gh200")], Answer)

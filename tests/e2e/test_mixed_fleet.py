"""A fleet of several GPU types on the local control plane, with the operator's
``gpuInventory: nodes``: fake nodes of two GPU types with a few GPUs each, a target whose
load outgrows one type's GPUs, and pools that spill onto the other type. Nothing stays
Pending."""

from __future__ import annotations

import uuid
from pathlib import Path
from typing import Any

import pytest
from kubernetes import client

from rooftop_api.spec import ServingTarget
from rooftop_planner.inventory import GpuInventory
from rooftop_planner.plan import Plan
from rooftop_planner.search import plan_target
from tests.cluster.handle import wait_until
from tests.cluster.nodes import GpuType, gpu_node
from tests.e2e import test_operator
from tests.e2e.test_operator import ENGINE, ROOT, TIMEOUT, Env, load, second_install

pytestmark = pytest.mark.e2e
# the chart installed with its operator, as test_operator.py's tests have it (per module)
env = test_operator.env

Obj = dict[str, Any]


def planned(doc: Obj, free: dict[str, tuple[int, ...]], catalog: Any) -> Plan:
    """What the planner deploys for ``doc`` on nodes with ``free`` GPUs per type."""
    spec = ServingTarget.model_validate(doc).spec
    shapes = {gpu: max(counts) for gpu, counts in free.items()}
    result = plan_target(spec, catalog=catalog, gpu_inventory=GpuInventory(shapes, free=free))
    assert result.deployed is not None, result.explain()
    return result.deployed


def test_load_past_one_types_gpus_spills_onto_a_second_pool(env: Env, tmp_path: Path) -> None:
    """One 1-GPU H200 node and two 4-GPU L40S nodes, labelled for this target only. At
    16 req/s one H200 replica serves; at 20 req/s the H200's one GPU is not enough and
    no single type's free GPUs serve, so the plan keeps the H200 pod and grows onto the
    L40S nodes: two pool Deployments behind the one Service, every pod bound to a node
    of its type. The one-type Deployment holds the only H200, so the new H200 pool's pod
    waits for it: the operator deletes the old Deployment, and then every pod runs."""
    core = client.CoreV1Api(env.api)
    # a letter first: a bare hex value such as "123e45" reads as a number in the
    # API server's YAML, and a node selector's values must be strings
    mark = {"e2e-mixed": f"m{uuid.uuid4().hex[:6]}"}
    doc = load(ROOT / "examples" / "simulated-chat.yaml", name="mix")
    doc["spec"]["mode"] = "vllm"  # a simulated engine needs no GPU node
    doc["spec"]["budget"] = {"usdPerHour": 40}
    doc["spec"]["constraints"] = {"gpuTypes": ["h200", "l40s"], "maxReplicas": 4,
                                  "nodeSelector": mark}  # fmt: skip
    free = {"h200": (1,), "l40s": (4, 4)}

    def add_node(gpu_id: str, gpus: int, index: int) -> None:
        gpu = env.catalog.gpu(gpu_id)
        flavour = GpuType(f"e2e-mix-{gpu_id}-{mark['e2e-mixed']}", gpu.node_label_value, gpus,
                          int(gpu.hbm_bytes / 2**20), "e2e", (9, 0), "e2e", "192", "2Ti",
                          arch=gpu.host_arch)  # fmt: skip
        node = gpu_node(flavour, index)
        node["metadata"]["labels"].update(mark)
        core.create_node(node)
        env.nodes.append(node["metadata"]["name"])

    add_node("h200", 1, 0)
    add_node("l40s", 4, 0)
    add_node("l40s", 4, 1)
    doc["spec"]["workload"]["requestsPerSecond"] = 16
    one = planned(doc, free, env.catalog)
    assert (one.gpu, one.replicas, one.pools) == ("h200", 1, ())
    doc["spec"]["workload"]["requestsPerSecond"] = 20
    mix = planned(doc, free, env.catalog)
    pools = {p.gpu: p for p in mix.pools}
    assert set(pools) == {"h200", "l40s"} and pools["h200"].replicas == 1
    with second_install(env, tmp_path, "operator.gpuInventory=nodes") as inv:
        inv.operator.start(ROOFTOP_GPU_INVENTORY="nodes", ROOFTOP_LOOP_INTERVAL_S="2")
        doc["spec"]["workload"]["requestsPerSecond"] = 16
        inv.apply(doc)
        inv.wait_condition("mix", "Ready", "True")
        assert inv.deployment("mix") is not None
        doc["spec"]["workload"]["requestsPerSecond"] = 20
        inv.apply(doc)

        def spilled() -> bool:
            deployments = {d["metadata"]["name"]: d for d in inv.listed("Deployment", ENGINE)}
            pods = inv.listed("Pod", ENGINE)
            running = [p for p in pods if p["status"].get("phase") == "Running"
                       and not p["metadata"].get("deletionTimestamp")]  # fmt: skip
            want = {f"mix-engine-{g}": p.replicas for g, p in pools.items()}
            return {n: d["spec"]["replicas"] for n, d in deployments.items()} == want and len(
                running
            ) == len(pods) == sum(want.values())

        wait_until(spilled, 3 * TIMEOUT, f"pools {pools}\n{inv.operator.tail()}")
        inv.wait_condition("mix", "Ready", "True", generation=2)
        status = inv.target("mix")["status"]
        assert status["gpu"] == "h200+l40s"
        assert {p["gpu"]: p["replicas"] for p in status["plan"]["pools"]} == {
            g: p.replicas for g, p in pools.items()
        }
        nodes = core.list_node(label_selector="e2e-mixed").items
        node_gpu = {n.metadata.name: n.metadata.labels["nvidia.com/gpu.product"] for n in nodes}
        for pod in inv.listed("Pod", ENGINE):
            gpu = pod["metadata"]["labels"]["rooftop.dev/pool"]
            assert node_gpu[pod["spec"]["nodeName"]] == env.catalog.gpu(gpu).node_label_value
        [service] = inv.listed("Service", "rooftop.dev/servingtarget=mix")
        assert "rooftop.dev/pool" not in service["spec"]["selector"]
        errors = [ln for ln in inv.operator.log_since_start().splitlines() if "[ERROR" in ln]
        assert not errors, "\n".join(errors)

"""The cluster's GPU inventory: read from Node objects, and what it lets the planner pick."""

from __future__ import annotations

import copy
import json
import re
from pathlib import Path
from typing import Any

import pytest

from rooftop_api.manifest import load_target
from rooftop_api.spec import ServingTargetSpec
from rooftop_cli.main import main
from rooftop_planner.catalog import Catalog, load_catalog
from rooftop_planner.inventory import (
    GpuInventory,
    InventoryError,
    Placement,
    held_gpus,
    inventory_from_nodes,
    load_cluster,
    tolerates,
)
from rooftop_planner.search import plan_target

EXAMPLE = Path(__file__).parents[3] / "examples" / "simulated-chat.yaml"
# The inventory tests need plans that shard over a few L4s: the example with a short
# chat's workload and budget pinned, so the example's own may follow its trace.
SHORT_CHAT = {
    "requestsPerSecond": 4,
    "promptTokens": {"mean": 512, "p90": 1024},
    "outputTokens": {"mean": 128, "p90": 256},
}


def short_chat_doc() -> dict[str, Any]:
    """The example's manifest with ``SHORT_CHAT`` as its workload and a $10/h budget."""
    doc = load_target(EXAMPLE).model_dump(by_alias=True, exclude_none=True)
    doc["spec"]["workload"] = dict(SHORT_CHAT)
    doc["spec"]["budget"] = {"usdPerHour": 10}
    return doc


def short_chat() -> ServingTargetSpec:
    return ServingTargetSpec.model_validate(short_chat_doc()["spec"])


@pytest.fixture(scope="module")
def catalog() -> Catalog:
    return load_catalog()


def node(
    name: str,
    product: str | None,
    gpus: Any = None,
    cordoned: bool = False,
    taints: tuple[str, ...] = (),
    labels: dict[str, str] | None = None,
) -> dict:
    """A Node; ``taints`` as ``key=value:Effect`` (or ``key:Effect``)."""
    all_labels = {"kubernetes.io/hostname": name, **(labels or {})}
    if product:
        all_labels["nvidia.com/gpu.product"] = product
    allocatable = {"cpu": "8"} if gpus is None else {"cpu": "8", "nvidia.com/gpu": gpus}
    spec: dict[str, Any] = {"unschedulable": True} if cordoned else {}
    if taints:
        spec["taints"] = [taint(t) for t in taints]
    return {
        "kind": "Node",
        "metadata": {"name": name, "labels": all_labels},
        "spec": spec,
        "status": {"allocatable": allocatable},
    }


def taint(text: str) -> dict[str, str]:
    pair, effect = text.rsplit(":", 1)
    key, _, value = pair.partition("=")
    return {"key": key, "effect": effect, **({"value": value} if value else {})}


def test_the_biggest_schedulable_node_per_gpu_type_counts(catalog: Catalog) -> None:
    nodes = [
        node("l4-small", "NVIDIA-L4", "1"),
        node("l4-big", "NVIDIA-L4", "4"),
        node("l4-cordoned", "NVIDIA-L4", "8", cordoned=True),
        node("h100", "NVIDIA-H100-80GB-HBM3", "8"),
        node("cpu-only", None),
    ]
    inv = inventory_from_nodes(nodes, catalog)
    assert inv.gpus_per_node == {"l4": 4, "h100-sxm": 8}
    assert inv.unknown_products == ()


@pytest.mark.parametrize("gpus", [None, "0", "two", "1.5"])
def test_a_node_without_a_whole_allocatable_gpu_offers_none(catalog: Catalog, gpus: Any) -> None:
    assert inventory_from_nodes([node("l4", "NVIDIA-L4", gpus)], catalog).gpus_per_node == {}


def test_unknown_products_are_named(catalog: Catalog) -> None:
    inv = inventory_from_nodes([node("x", "NVIDIA-Foo", "8")], catalog)
    assert inv.gpus_per_node == {} and inv.unknown_products == ("NVIDIA-Foo",)
    assert inv.describe() == "NVIDIA-Foo (not in the catalog)"
    assert GpuInventory().describe() == "no GPU nodes"


def test_problem_names_the_label_and_the_node_size(catalog: Catalog) -> None:
    inv = GpuInventory({"l4": 1})
    assert inv.problem(catalog.gpu("l4"), 1) == ""
    assert inv.problem(catalog.gpu("l4"), 2) == "the cluster's l4 nodes have at most 1 GPU(s) each"
    missing = inv.problem(catalog.gpu("h100-sxm"), 1)
    assert "nvidia.com/gpu.product=NVIDIA-H100-80GB-HBM3" in missing and "l4 x1/node" in missing


def l4_or_h100() -> ServingTargetSpec:
    """The example on L4 or H100 with a 30 ms TPOT bound: its cheapest plan shards over
    several L4s (four L4s cost less than one H100)."""
    spec = short_chat()
    gpus = {"gpu_types": ["l4", "h100-sxm"]}
    slo = spec.slo.model_copy(update={"tpot_ms": 30.0})
    constraints = spec.constraints.model_copy(update=gpus)
    return spec.model_copy(update={"constraints": constraints, "slo": slo})


def test_the_plan_fits_the_nodes_there_are(catalog: Catalog) -> None:
    spec = l4_or_h100()
    best = plan_target(spec, catalog=catalog).plan
    assert best is not None and (best.gpu, best.tp > 1) == ("l4", True)
    result = plan_target(
        spec, catalog=catalog, gpu_inventory=GpuInventory({"l4": 1, "h100-sxm": 8})
    )
    assert result.feasible and result.plan is not None
    assert (result.plan.gpu, result.plan.tp) == ("h100-sxm", 1)
    assert result.beyond_inventory is None


def test_no_node_big_enough_says_what_nodes_would_work(catalog: Catalog) -> None:
    spec = l4_or_h100()
    best = plan_target(spec, catalog=catalog).plan
    assert best is not None and best.tp > 1
    result = plan_target(spec, catalog=catalog, gpu_inventory=GpuInventory({"l4": 1}))
    assert not result.feasible
    assert result.beyond_inventory == best
    text = result.explain()
    assert "the cluster's GPU nodes offer l4 x1/node" in text
    fleet = f"1 replica of {best.tp}x l4 (TP{best.tp})"
    assert f"with nodes of {best.tp} l4 GPU(s) each, this would work: {fleet}" in text
    assert "not in cluster" in text


def test_a_target_no_gpu_can_meet_is_not_waiting_for_nodes(catalog: Catalog) -> None:
    spec = short_chat()
    spec = spec.model_copy(update={"slo": spec.slo.model_copy(update={"tpot_ms": 0.5})})
    result = plan_target(spec, catalog=catalog, gpu_inventory=GpuInventory({"l4": 1}))
    assert not result.feasible and result.beyond_inventory is None
    assert "no GPU in the catalog meets this target either" in result.explain()


# ---------------------------------------------------------------- where the pods may land


def placement(**constraints: Any) -> Placement:
    from rooftop_api.spec import Constraints

    return Placement.of(Constraints.model_validate(constraints))


def test_nodes_with_an_untolerated_taint_do_not_count(catalog: Catalog) -> None:
    nodes = [
        node("l4", "NVIDIA-L4", "1"),
        node("l4-team", "NVIDIA-L4", "4", taints=("team=ml:NoSchedule",)),
    ]
    inv = inventory_from_nodes(nodes, catalog, placement())
    assert inv.gpus_per_node == {"l4": 1}
    assert inv.unusable == {
        "l4": (4, "taint team=ml:NoSchedule not tolerated (spec.constraints.tolerations)")
    }
    assert inv.problem(catalog.gpu("l4"), 2).startswith("the cluster's 4-GPU l4 nodes are not")
    assert "l4 x4/node not usable: taint team=ml:NoSchedule" in inv.describe()
    tolerant = placement(tolerations=[{"key": "team", "operator": "Equal", "value": "ml"}])
    assert inventory_from_nodes(nodes, catalog, tolerant).gpus_per_node == {"l4": 4}
    assert inventory_from_nodes(nodes, catalog, tolerant).unusable == {}


@pytest.mark.parametrize(
    "taints",
    [
        ("nvidia.com/gpu=present:NoSchedule",),  # the pods' own GPU toleration
        ("team=ml:PreferNoSchedule",),  # steers, never blocks
        ("node.kubernetes.io/not-ready:NoSchedule", "node.kubernetes.io/unreachable:NoExecute"),
    ],
)
def test_gpu_preference_and_condition_taints_do_not_block(
    catalog: Catalog, taints: tuple[str, ...]
) -> None:
    nodes = [node("l4", "NVIDIA-L4", "4", taints=taints)]
    assert inventory_from_nodes(nodes, catalog, placement()).gpus_per_node == {"l4": 4}


def test_only_nodes_with_the_targets_node_selector_count(catalog: Catalog) -> None:
    nodes = [
        node("l4-a", "NVIDIA-L4", "4", labels={"zone": "a"}),
        node("l4-b", "NVIDIA-L4", "2", labels={"zone": "b"}),
    ]
    # the GPU label key is the plan's to set: a selector on it does not filter here
    zone_b = placement(nodeSelector={"zone": "b", "nvidia.com/gpu.product": "NVIDIA-H100"})
    inv = inventory_from_nodes(nodes, catalog, zone_b)
    assert inv.gpus_per_node == {"l4": 2}
    assert inv.unusable["l4"] == (4, "label zone=b (spec.constraints.nodeSelector) missing")
    assert inventory_from_nodes(nodes, catalog).gpus_per_node == {"l4": 4}  # no placement


@pytest.mark.parametrize(
    ("toleration", "tolerated"),
    [
        ({"operator": "Exists"}, True),  # empty key and effect: every taint
        ({"key": "team", "operator": "Exists"}, True),
        ({"key": "team", "value": "ml"}, True),  # operator defaults to Equal
        ({"key": "team", "value": "web"}, False),
        ({"key": "team", "operator": "Exists", "effect": "NoExecute"}, False),
        ({"key": "other", "operator": "Exists"}, False),
    ],
)
def test_tolerations_match_as_kubernetes_does(toleration: dict, tolerated: bool) -> None:
    assert tolerates(toleration, taint("team=ml:NoSchedule")) is tolerated


def test_a_plan_needing_tainted_nodes_says_which_toleration_is_missing(
    catalog: Catalog,
) -> None:
    spec = short_chat()
    spec = spec.model_copy(
        update={"constraints": spec.constraints.model_copy(update={"gpu_types": ["l4"]})}
    )
    nodes = [
        node("l4", "NVIDIA-L4", "1"),
        node("l4-x2", "NVIDIA-L4", "2", taints=("a=b:NoExecute",)),
    ]
    inv = inventory_from_nodes(nodes, catalog, Placement.of(spec.constraints))
    result = plan_target(spec, catalog=catalog, gpu_inventory=inv)
    assert not result.feasible and result.beyond_inventory is not None
    assert "taint a=b:NoExecute not tolerated" in result.explain()


# ---------------------------------------------------------------- node list files


def write(tmp_path: Path, text: str | bytes) -> Path:
    path = tmp_path / "nodes.json"
    path.write_bytes(text if isinstance(text, bytes) else text.encode())
    return path


def test_kubectl_json_yaml_and_a_single_node_load(tmp_path: Path) -> None:
    listing = {"apiVersion": "v1", "kind": "List", "items": [node("a", "NVIDIA-L4", "1")]}
    assert len(load_cluster(write(tmp_path, json.dumps(listing)))[0]) == 1
    nodes, pods = load_cluster(write(tmp_path, "kind: Node\nmetadata: {name: a}\n"))
    assert nodes[0]["kind"] == "Node" and pods == []


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("[1, 2]", "expected a node list object"),
        ('{"kind": "List"}', "expected `items`, a list of Node objects"),
        ('{"items": [{"kind": "Service"}]}', "items of kind Service, not Node or Pod"),
        ("{: nope", "not JSON or YAML"),
        (b"\xff\xfe\x00bad", "not UTF-8 text"),
    ],
)
def test_bad_node_files_say_how_to_write_one(
    tmp_path: Path, text: str | bytes, message: str
) -> None:
    with pytest.raises(InventoryError, match=message):
        load_cluster(write(tmp_path, text))


def test_plan_cli_takes_nodes(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    path = write(tmp_path, json.dumps({"kind": "List", "items": [node("a", "NVIDIA-L4", "1")]}))
    example = tmp_path / "target.json"
    example.write_text(json.dumps(short_chat_doc()))
    assert main(["plan", str(example), "--nodes", str(path)]) == 1
    out = capsys.readouterr().out
    best = plan_target(short_chat()).plan
    assert best is not None
    assert f"GPU nodes ({path}): l4 x1/node" in out
    assert f"with nodes of {best.tp} {best.gpu} GPU(s)" in out
    assert main(["plan", str(example), "--nodes", str(tmp_path / "absent.json")]) == 2
    assert "absent.json" in capsys.readouterr().err


def test_plan_cli_reads_the_targets_tolerations(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    tainted = [node(n, "NVIDIA-L4", "2", taints=("dedicated=llm:NoSchedule",)) for n in "ab"]
    path = write(tmp_path, json.dumps({"kind": "List", "items": tainted}))
    doc = short_chat_doc()
    doc["spec"]["constraints"]["gpuTypes"] = ["l4"]
    doc["spec"]["constraints"]["weightDtypes"] = ["bf16", "fp8"]  # fp8 fits a 2-L4 node
    target = tmp_path / "target.json"
    target.write_text(json.dumps(doc))
    assert main(["plan", str(target), "--nodes", str(path)]) == 1
    assert "l4 x2/node not usable: taint dedicated=llm:NoSchedule" in capsys.readouterr().out
    doc["spec"]["constraints"]["tolerations"] = [{"key": "dedicated", "operator": "Exists"}]
    target.write_text(json.dumps(doc))
    assert main(["plan", str(target), "--nodes", str(path)]) == 0
    assert re.search(r"Chosen: \d+ replicas? of ([12])x l4 \(TP\1\), ", capsys.readouterr().out)


def test_a_nodes_file_giving_a_key_twice_is_refused(tmp_path: Path) -> None:
    path = tmp_path / "nodes.yaml"
    path.write_text("kind: Node\nmetadata: {name: a}\nmetadata: {name: b}\n")
    with pytest.raises(InventoryError, match="line 3: duplicate key 'metadata'"):
        load_cluster(path)


# ---------------------------------------------------------------- counts


def pod(
    name: str,
    node_name: str | None,
    gpus: int,
    *,
    phase: str = "Running",
    selects: str | None = None,
    labels: dict[str, str] | None = None,
    init_gpus: int = 0,
) -> dict[str, Any]:
    """A pod asking for ``gpus`` GPUs, bound to ``node_name`` or, unbound, selecting the
    GPU product ``selects``."""
    spec: dict[str, Any] = {
        "containers": [{"name": "c", "resources": {"limits": {"nvidia.com/gpu": str(gpus)}}}]
    }
    if init_gpus:
        limits = {"nvidia.com/gpu": str(init_gpus)}
        spec["initContainers"] = [{"name": "i", "resources": {"requests": limits}}]
    if node_name:
        spec["nodeName"] = node_name
    if selects:
        spec["nodeSelector"] = {"nvidia.com/gpu.product": selects}
    meta = {"name": name, "namespace": "team", "labels": labels or {}}
    return {"kind": "Pod", "metadata": meta, "spec": spec, "status": {"phase": phase}}


L40S = "NVIDIA-L40S"


def test_free_gpus_are_allocatable_less_what_other_pods_hold(catalog: Catalog) -> None:
    nodes = [node("a", L40S, "4"), node("b", L40S, "4"), node("c", L40S, "4")]
    pods = [
        pod("job", "a", 3),
        pod("done", "b", 4, phase="Succeeded"),  # finished: its GPUs are free again
        pod("init", "c", 1, init_gpus=2),  # init containers run first: it takes 2
        pod("own", "b", 4, labels={"rooftop.dev/servingtarget": "chat"}),
        pod("queued", None, 2, phase="Pending", selects=L40S),
    ]
    held = held_gpus(pods, catalog, own=("team", "chat"))
    assert held.on_node == {"a": 3, "c": 2} and held.claimed == {"l40s": 2}
    inv = inventory_from_nodes(nodes, catalog, held=held)
    assert inv.free == {"l40s": (4, 2, 1)}
    assert inv.free_gpus("l40s") == 5
    # TP1: 7 slots less the 2 claimed; TP2: 3 slots less one claimed pod; TP4: b only
    assert [inv.replicas_fit("l40s", tp) for tp in (1, 2, 4)] == [5, 2, 0]
    assert "l40s x4/node (5 free on 3 nodes)" in inv.describe()


def test_a_shape_only_inventory_fits_any_number(catalog: Catalog) -> None:
    inv = GpuInventory({"l40s": 4})
    assert inv.replicas_fit("l40s", 2) > 1000 and inv.shortfall("l40s", 2, 1000) == ""


def two_l40s_nodes_chat(rate: float) -> ServingTargetSpec:
    """An 8B chat at ``rate`` req/s on any GPU, $200/h, up to 16 replicas."""
    doc = short_chat_doc()
    doc["spec"]["workload"]["requestsPerSecond"] = rate
    doc["spec"]["budget"] = {"usdPerHour": 200}
    doc["spec"]["constraints"] = {"maxReplicas": 16}
    return ServingTargetSpec.model_validate(doc["spec"])


@pytest.mark.parametrize("rate", [40, 80])
def test_never_more_gpus_than_the_nodes_have(catalog: Catalog, rate: float) -> None:
    """Two nodes of 4 L40S: a plan by node shapes alone needs more than their 8 GPUs; the
    counted search plans within them or says how many are missing."""
    spec = two_l40s_nodes_chat(rate)
    nodes = [node(n, L40S, "4") for n in "ab"]
    by_shape = plan_target(spec, catalog=catalog, gpu_inventory=GpuInventory({"l40s": 4})).plan
    counted = plan_target(spec, catalog=catalog, gpu_inventory=inventory_from_nodes(nodes, catalog))
    assert by_shape is not None
    if by_shape.replicas * by_shape.tp <= 8:
        assert counted.plan == by_shape
        return
    assert not counted.feasible and counted.beyond_inventory is not None
    need = by_shape.replicas * by_shape.tp
    assert (
        f"on them, {by_shape.replicas} replica(s) need {need} l40s GPUs ({by_shape.tp} per "
        f"node); the cluster's nodes have 8 free, room for {8 // by_shape.tp}: "
        f"{need - 8 // by_shape.tp * by_shape.tp} more l40s GPUs needed" in counted.reasons[0]
    )
    assert "not enough GPUs" in counted.explain()


def test_the_shortfall_case_is_not_vacuous(catalog: Catalog) -> None:
    """At 80 req/s the cheapest plan by node shapes needs more than the 8 L40S there
    are, so the case above checks the shortfall, not only a plan that fits."""
    spec = two_l40s_nodes_chat(80)
    by_shape = plan_target(spec, catalog=catalog, gpu_inventory=GpuInventory({"l40s": 4})).plan
    assert by_shape is not None and by_shape.replicas * by_shape.tp > 8


def test_plan_cli_subtracts_the_pods_listed_with_the_nodes(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """`kubectl get nodes,pods -A -o json`: a job holding 3 of a node's 4 L40S leaves
    room for fewer replicas than the nodes alone."""
    target = tmp_path / "target.json"
    doc = short_chat_doc()
    doc["spec"]["workload"]["requestsPerSecond"] = 40
    doc["spec"]["budget"] = {"usdPerHour": 200}
    doc["spec"]["constraints"] = {"maxReplicas": 16, "gpuTypes": ["l40s"]}
    target.write_text(json.dumps(doc))
    nodes = [node(n, L40S, "4") for n in "ab"]
    alone = write(tmp_path, json.dumps({"kind": "List", "items": nodes}))
    assert main(["plan", str(target), "--nodes", str(alone), "-o", "json"]) == 0
    plan = json.loads(capsys.readouterr().out)["plan"]
    assert plan["replicas"] * plan["tp"] <= 8
    busy = tmp_path / "busy.json"
    busy.write_text(json.dumps({"kind": "List", "items": [*nodes, pod("job", "a", 3)]}))
    main(["plan", str(target), "--nodes", str(busy)])
    out = capsys.readouterr().out
    assert "l40s x4/node (5 free on 2 nodes)" in out
    chosen = re.search(r"Chosen: (\d+) replicas? of (\d)x l40s", out)
    assert chosen is None or int(chosen[1]) * int(chosen[2]) <= 5


def engine_deployment(name: str, replicas: int, gpus_per_pod: int) -> dict[str, Any]:
    """Another target's engine Deployment on L40S nodes."""
    container = {"name": "vllm", "resources": {"limits": {"nvidia.com/gpu": str(gpus_per_pod)}}}
    template = {"nodeSelector": {"nvidia.com/gpu.product": L40S}, "containers": [container]}
    labels = {"rooftop.dev/servingtarget": name}
    return {
        "kind": "Deployment",
        "metadata": {"name": f"{name}-engine", "namespace": "team", "labels": labels},
        "spec": {"replicas": replicas, "template": {"spec": template}},
    }


def test_other_targets_deployments_claim_what_their_pods_do_not_hold_yet(
    catalog: Catalog,
) -> None:
    """Another target wants 3 pods of 2 GPUs; one is bound: 4 more GPUs are claimed.
    Its pending pods are not counted again, and the target's own Deployment not at all."""
    labels = {"rooftop.dev/servingtarget": "other"}
    pods = [
        pod("other-1", "a", 2, labels=labels),
        pod("other-2", None, 2, phase="Pending", selects=L40S, labels=labels),
    ]
    engines = [engine_deployment("other", 3, 2), engine_deployment("chat", 4, 2)]
    held = held_gpus(pods, catalog, own=("team", "chat"), engines=engines)
    assert held.on_node == {"a": 2} and held.claimed == {"l40s": 4}


def test_a_mixed_fleets_bound_pods_count_against_their_own_pool_only(
    catalog: Catalog,
) -> None:
    """Another target's two pools want 2 L40S pods and 2 L4 pods of one GPU each; its two
    bound L40S pods hold the L40S pool's, and the L4 pool still claims both its GPUs."""
    labels = {"rooftop.dev/servingtarget": "other"}
    l4 = catalog.gpu("l4")
    pods = [pod(f"other-{i}", "a", 1, selects=L40S, labels=labels) for i in range(2)]
    pool = engine_deployment("other", 2, 1)
    other = copy.deepcopy(pool)
    other["spec"]["template"]["spec"]["nodeSelector"] = {l4.node_label_key: l4.node_label_value}
    held = held_gpus(pods, catalog, own=("team", "chat"), engines=[pool, other])
    assert held.on_node == {"a": 2} and held.claimed == {"l4": 2}

"""The cluster's GPU inventory: read from Node objects, and what it lets the planner pick."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from rooftop_operator.cli import main
from rooftop_planner.catalog import Catalog, load_catalog
from rooftop_planner.inventory import (
    GpuInventory,
    InventoryError,
    inventory_from_nodes,
    load_nodes,
)
from rooftop_planner.manifest import load_target
from rooftop_planner.search import plan_target

EXAMPLE = Path(__file__).parents[3] / "examples" / "simulated-chat.yaml"


@pytest.fixture(scope="module")
def catalog() -> Catalog:
    return load_catalog()


def node(name: str, product: str | None, gpus: Any = None, cordoned: bool = False) -> dict:
    labels = {"kubernetes.io/hostname": name}
    if product:
        labels["nvidia.com/gpu.product"] = product
    allocatable = {"cpu": "8"} if gpus is None else {"cpu": "8", "nvidia.com/gpu": gpus}
    return {
        "kind": "Node",
        "metadata": {"name": name, "labels": labels},
        "spec": {"unschedulable": True} if cordoned else {},
        "status": {"allocatable": allocatable},
    }


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


def test_the_plan_fits_the_nodes_there_are(catalog: Catalog) -> None:
    spec = load_target(EXAMPLE).spec
    assert plan_target(spec, catalog=catalog).plan.tp == 2  # type: ignore[union-attr]
    result = plan_target(
        spec, catalog=catalog, gpu_inventory=GpuInventory({"l4": 1, "h100-sxm": 8})
    )
    assert result.feasible and result.plan is not None
    assert (result.plan.gpu, result.plan.tp) == ("h100-sxm", 1)
    assert result.beyond_inventory is None


def test_no_node_big_enough_says_what_nodes_would_work(catalog: Catalog) -> None:
    spec = load_target(EXAMPLE).spec
    result = plan_target(spec, catalog=catalog, gpu_inventory=GpuInventory({"l4": 1}))
    assert not result.feasible
    assert result.beyond_inventory is not None and result.beyond_inventory.tp == 2
    text = result.explain()
    assert "the cluster's GPU nodes offer l4 x1/node" in text
    assert "with nodes of 2 l4 GPU(s) each, this would work: 1x l4 TP2" in text
    assert "not in cluster" in text


def test_a_target_no_gpu_can_meet_is_not_waiting_for_nodes(catalog: Catalog) -> None:
    spec = load_target(EXAMPLE).spec
    spec = spec.model_copy(update={"slo": spec.slo.model_copy(update={"tpot_ms": 0.5})})
    result = plan_target(spec, catalog=catalog, gpu_inventory=GpuInventory({"l4": 1}))
    assert not result.feasible and result.beyond_inventory is None
    assert "no GPU in the catalog meets this target either" in result.explain()


# ---------------------------------------------------------------- node list files


def write(tmp_path: Path, text: str | bytes) -> Path:
    path = tmp_path / "nodes.json"
    path.write_bytes(text if isinstance(text, bytes) else text.encode())
    return path


def test_kubectl_json_yaml_and_a_single_node_load(tmp_path: Path) -> None:
    listing = {"apiVersion": "v1", "kind": "List", "items": [node("a", "NVIDIA-L4", "1")]}
    assert len(load_nodes(write(tmp_path, json.dumps(listing)))) == 1
    assert load_nodes(write(tmp_path, "kind: Node\nmetadata: {name: a}\n"))[0]["kind"] == "Node"


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("[1, 2]", "expected a node list object"),
        ('{"kind": "List"}', "expected `items`, a list of Node objects"),
        ('{"items": [{"kind": "Pod"}]}', "items of kind Pod, not Node"),
        ("{: nope", "not JSON or YAML"),
        (b"\xff\xfe\x00bad", "not UTF-8 text"),
    ],
)
def test_bad_node_files_say_how_to_write_one(
    tmp_path: Path, text: str | bytes, message: str
) -> None:
    with pytest.raises(InventoryError, match=message):
        load_nodes(write(tmp_path, text))


def test_plan_cli_takes_nodes(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    path = write(tmp_path, json.dumps({"kind": "List", "items": [node("a", "NVIDIA-L4", "1")]}))
    assert main(["plan", str(EXAMPLE), "--nodes", str(path)]) == 1
    out = capsys.readouterr().out
    assert f"GPU nodes ({path}): l4 x1/node" in out and "with nodes of 2 l4 GPU(s)" in out
    assert main(["plan", str(EXAMPLE), "--nodes", str(tmp_path / "absent.json")]) == 2
    assert "absent.json" in capsys.readouterr().err

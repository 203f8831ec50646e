"""The GPUs a cluster has, read from its Node objects (``kubectl get nodes -o json``).

An engine pod takes all its ``TP`` GPUs from one node, so what a cluster can run is, per
GPU type, the most GPUs one schedulable node offers: a TP4 plan on a cluster of 1-GPU
L4 nodes stays Pending forever. A node counts as a GPU of type ``g`` when its label
``g.node_label_key`` (``nvidia.com/gpu.product``, set by NVIDIA GPU Feature Discovery)
equals ``g.node_label_value``; its GPU count is ``status.allocatable[g.resource_name]``
(what the device plugin advertises, after any GPUs it withholds).

This module only reads plain dicts, so ``rooftop plan --nodes`` and the operator (which
lists Nodes through the API) share it; it never imports a Kubernetes client.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

from rooftop_planner.catalog import Catalog, CatalogError, GpuSpec

GPU_PRODUCT_LABEL = "nvidia.com/gpu.product"


class InventoryError(CatalogError):
    """A node list file cannot be read; the message names the file and the fix."""


@dataclass(frozen=True)
class GpuInventory:
    """What the cluster's schedulable nodes offer.

    Attributes:
        gpus_per_node: catalog GPU id -> the most GPUs of that type one node offers.
        unknown_products: GPU product labels no catalog GPU matches (said in messages,
            so a user sees why those nodes were not used).
    """

    gpus_per_node: Mapping[str, int] = field(default_factory=dict)
    unknown_products: tuple[str, ...] = ()

    def problem(self, gpu: GpuSpec, tp: int) -> str:
        """Why no node of this cluster can run a ``tp``-GPU pod of ``gpu``, else ""."""
        have = self.gpus_per_node.get(gpu.id, 0)
        if have == 0:
            label = f"{gpu.node_label_key}={gpu.node_label_value}"
            return (f"no schedulable node has {label} and allocatable {gpu.resource_name} "
                    f"(the cluster has: {self.describe()})")  # fmt: skip
        if tp > have:
            return f"the cluster's {gpu.id} nodes have at most {have} GPU(s) each"
        return ""

    def describe(self) -> str:
        """``l4 x1/node, h100-sxm x8/node`` (and unmatched products), or ``no GPU nodes``."""
        parts = [f"{g} x{n}/node" for g, n in sorted(self.gpus_per_node.items())]
        parts += [f"{p} (not in the catalog)" for p in self.unknown_products]
        return ", ".join(parts) or "no GPU nodes"


def inventory_from_nodes(nodes: Iterable[Mapping[str, Any]], catalog: Catalog) -> GpuInventory:
    """Per catalog GPU, the most allocatable GPUs on one schedulable node.

    Cordoned nodes (``spec.unschedulable``) are skipped: nothing new lands there.
    """
    best: dict[str, int] = {}
    unknown: set[str] = set()
    for node in nodes:
        if (node.get("spec") or {}).get("unschedulable"):
            continue
        labels = (node.get("metadata") or {}).get("labels") or {}
        allocatable = (node.get("status") or {}).get("allocatable") or {}
        matched = False
        for gpu in catalog.gpus.values():
            if labels.get(gpu.node_label_key) == gpu.node_label_value:
                matched = True
                count = _gpu_count(allocatable.get(gpu.resource_name))
                if count > 0:
                    best[gpu.id] = max(best.get(gpu.id, 0), count)
        product = labels.get(GPU_PRODUCT_LABEL)
        if not matched and product:
            unknown.add(str(product))
    return GpuInventory(best, tuple(sorted(unknown)))


def _gpu_count(quantity: Any) -> int:
    """An extended-resource quantity (``"8"``; GPUs are whole numbers) as an int, 0 if
    absent or not a plain count."""
    try:
        return max(int(str(quantity)), 0)
    except ValueError:
        return 0


def load_nodes(path: str | Path) -> list[Mapping[str, Any]]:
    """Nodes from ``kubectl get nodes -o json`` (or ``-o yaml``, or one Node)."""
    path = Path(path)
    try:
        doc = yaml.safe_load(path.read_text(encoding="utf-8-sig"))  # JSON is YAML
    except UnicodeDecodeError as err:
        raise InventoryError(f"{path}: not UTF-8 text ({err.reason})") from err
    except yaml.YAMLError as err:
        raise InventoryError(f"{path}: not JSON or YAML: {err}") from err
    hint = "write it with `kubectl get nodes -o json > FILE`"
    if not isinstance(doc, Mapping):
        raise InventoryError(f"{path}: expected a node list object; {hint}")
    if doc.get("kind") == "Node":
        return [doc]
    items = doc.get("items")
    if not isinstance(items, list) or not all(isinstance(i, Mapping) for i in items):
        raise InventoryError(f"{path}: expected `items`, a list of Node objects; {hint}")
    odd = sorted({str(i.get("kind")) for i in items if i.get("kind") not in (None, "Node")})
    if odd:
        raise InventoryError(f"{path}: items of kind {', '.join(odd)}, not Node; {hint}")
    return list(items)

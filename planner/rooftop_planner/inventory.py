"""The GPUs a cluster has, read from its Node objects (``kubectl get nodes -o json``).

An engine pod takes all its ``TP`` GPUs from one node, so what a cluster can run is, per
GPU type, the most GPUs one schedulable node offers: a TP4 plan on a cluster of 1-GPU
L4 nodes stays Pending forever. A node counts as a GPU of type ``g`` when its label
``g.node_label_key`` (``nvidia.com/gpu.product``, set by NVIDIA GPU Feature Discovery)
equals ``g.node_label_value``; its GPU count is ``status.allocatable[g.resource_name]``
(what the device plugin advertises, after any GPUs it withholds).

Only nodes a target's engine pods may land on count (``placement``): nodes carrying the
target's ``constraints.nodeSelector`` labels, with no NoSchedule/NoExecute taint the
pods do not tolerate. Engine pods tolerate the GPU resource taint (``gpu_toleration``)
plus the target's ``constraints.tolerations``. The ``node.kubernetes.io/`` taints are
not placement policy but node conditions the node lifecycle controller sets and clears
(not-ready, unreachable, memory-pressure, unschedulable), so they are ignored like a
NotReady node is: a flapping node must not make a resumed target re-plan onto another
shape. A cordoned node (``spec.unschedulable``) is skipped.

GPUs are counted too: a type's free GPUs on a node are its allocatable ones less what
the pods bound to that node request (other targets' engines and pods Rooftop does not
own alike; the target's own engine pods are not subtracted, since its new plan replaces
them). A ``tp``-GPU pod needs ``tp`` free GPUs on one node, so the replicas a type holds
are

    fit(g, tp) = Σ_nodes ⌊free_node / tp⌋ − ⌈claimed_g / tp⌉

where ``claimed_g`` is what waits for type ``g``: other targets' engine Deployments'
replicas beyond their bound pods (the operator's own view of its fleet, ahead of the
scheduler's), and other pods not yet bound to a node that select type ``g``. The planner
never plans more replicas of a shape than that (``replicas_fit``).

This module only reads plain dicts, so ``rooftop plan --nodes`` and the operator (which
lists Nodes and Pods through the API) share it; it never imports a Kubernetes client.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

from rooftop_api.manifest import StrictLoader
from rooftop_api.spec import TARGET_LABEL, Constraints
from rooftop_planner.catalog import Catalog, CatalogError, GpuSpec

GPU_PRODUCT_LABEL = "nvidia.com/gpu.product"
CONDITION_TAINT_PREFIX = "node.kubernetes.io/"
BLOCKING_EFFECTS = ("NoSchedule", "NoExecute")  # PreferNoSchedule only steers
FINISHED_PHASES = ("Succeeded", "Failed")  # a finished pod's GPUs are free again
UNCOUNTED = 1 << 30  # replicas that fit where GPUs are not counted: any number


class InventoryError(CatalogError):
    """A node list file cannot be read; the message names the file and the fix."""


@dataclass(frozen=True)
class Placement:
    """Where a target's engine pods may run, from its ``spec.constraints``.

    Attributes:
        node_selector: labels a node must carry (the GPU's own label key is left to
            the plan: the builder overrides it with the planned GPU's value).
        tolerations: the target's tolerations, as core/v1 Toleration dicts.
    """

    node_selector: Mapping[str, str] = field(default_factory=dict)
    tolerations: tuple[Mapping[str, Any], ...] = ()

    @classmethod
    def of(cls, constraints: Constraints | None) -> Placement:
        """From a ``spec.Constraints`` (or None: any node)."""
        if constraints is None:
            return cls()
        tolerations = tuple(
            t.model_dump(by_alias=True, exclude_none=True) for t in constraints.tolerations or []
        )
        return cls(dict(constraints.node_selector or {}), tolerations)

    def obstacle(self, node: Mapping[str, Any], gpu: GpuSpec) -> str:
        """Why an engine pod of ``gpu`` cannot land on ``node``, else ""."""
        labels = (node.get("metadata") or {}).get("labels") or {}
        for key, value in sorted(self.node_selector.items()):
            if key != gpu.node_label_key and labels.get(key) != value:
                return f"label {key}={value} (spec.constraints.nodeSelector) missing"
        own = (gpu_toleration(gpu.resource_name), *self.tolerations)
        for taint in (node.get("spec") or {}).get("taints") or []:
            if _blocks(taint) and not any(tolerates(t, taint) for t in own):
                return f"taint {_taint_text(taint)} not tolerated (spec.constraints.tolerations)"
        return ""


def gpu_toleration(resource_name: str) -> dict[str, str]:
    """The toleration every engine pod carries: GPU nodes are commonly tainted with the
    GPU resource name (NVIDIA GPU operator, GKE, EKS), to keep other pods off them."""
    return {"key": resource_name, "operator": "Exists", "effect": "NoSchedule"}


def tolerates(toleration: Mapping[str, Any], taint: Mapping[str, Any]) -> bool:
    """Kubernetes' ``Toleration.ToleratesTaint``: an empty effect or key matches any;
    ``Exists`` matches any value, ``Equal`` (the default) the same value."""
    effect, key = toleration.get("effect") or "", toleration.get("key") or ""
    if (effect and effect != taint.get("effect")) or (key and key != taint.get("key")):
        return False
    if (toleration.get("operator") or "Equal") == "Exists":
        return True
    return bool((toleration.get("value") or "") == (taint.get("value") or ""))


def _blocks(taint: Mapping[str, Any]) -> bool:
    key = str(taint.get("key") or "")
    return taint.get("effect") in BLOCKING_EFFECTS and not key.startswith(CONDITION_TAINT_PREFIX)


def _taint_text(taint: Mapping[str, Any]) -> str:
    value = taint.get("value")
    return f"{taint.get('key')}{'=' + str(value) if value else ''}:{taint.get('effect')}"


@dataclass(frozen=True)
class GpuInventory:
    """What the cluster's schedulable nodes offer one target.

    Attributes:
        gpus_per_node: catalog GPU id -> the most GPUs of that type one node offers.
        unknown_products: GPU product labels no catalog GPU matches (said in messages,
            so a user sees why those nodes were not used).
        unusable: catalog GPU id -> (GPUs on the biggest node the target's pods may not
            use, why), kept only where that node is bigger than every usable one.
        nodes: schedulable nodes read (None: not built from a node list).
        unlabelled: GPU resource name -> nodes that offer it with no label telling
            which GPU it is (no GPU Feature Discovery), so no catalog GPU matches them.
        free: catalog GPU id -> the free GPUs of each usable node of that type (its
            allocatable ones less what pods bound to it request), most first; None:
            not counted (shapes only), so any number of replicas fits.
        claimed: catalog GPU id -> GPUs requested by pods that select that type and
            wait for a node.
    """

    gpus_per_node: Mapping[str, int] = field(default_factory=dict)
    unknown_products: tuple[str, ...] = ()
    unusable: Mapping[str, tuple[int, str]] = field(default_factory=dict)
    nodes: int | None = None
    unlabelled: Mapping[str, int] = field(default_factory=dict)
    free: Mapping[str, tuple[int, ...]] | None = None
    claimed: Mapping[str, int] = field(default_factory=dict)

    def replicas_fit(self, gpu_id: str, tp: int) -> int:
        """How many ``tp``-GPU pods of ``gpu_id`` the free GPUs hold (``fit`` of the
        module docstring); ``UNCOUNTED`` where GPUs are not counted."""
        if self.free is None:
            return UNCOUNTED
        slots = sum(n // tp for n in self.free.get(gpu_id, ()))
        return max(slots - -(-self.claimed.get(gpu_id, 0) // tp), 0)

    def free_gpus(self, gpu_id: str) -> int:
        """Free GPUs of ``gpu_id`` over every usable node, less those claimed."""
        free = (self.free or {}).get(gpu_id, ())
        return max(sum(free) - self.claimed.get(gpu_id, 0), 0)

    def shortfall(self, gpu_id: str, tp: int, replicas: int) -> str:
        """Why ``replicas`` ``tp``-GPU pods of ``gpu_id`` do not fit, else ""."""
        fit = self.replicas_fit(gpu_id, tp)
        if replicas <= fit:
            return ""
        return (
            f"{replicas} replica(s) need {replicas * tp} {gpu_id} GPUs ({tp} per node); the "
            f"cluster's nodes have {self.free_gpus(gpu_id)} free, room for {fit}: "
            f"{(replicas - fit) * tp} more {gpu_id} GPUs needed"
        )

    def lacks_shape(self, gpu_id: str, tp: int) -> bool:
        """Whether no node of this cluster can hold a ``tp``-GPU pod of ``gpu_id``."""
        return tp > self.gpus_per_node.get(gpu_id, 0)

    def problem(self, gpu: GpuSpec, tp: int) -> str:
        """Why no node of this cluster can run a ``tp``-GPU pod of ``gpu``, else ""."""
        if not self.lacks_shape(gpu.id, tp):
            return ""
        have = self.gpus_per_node.get(gpu.id, 0)
        if (blocked := self.unusable.get(gpu.id)) and (blocked[0] >= tp or have == 0):
            return f"the cluster's {blocked[0]}-GPU {gpu.id} nodes are not usable: {blocked[1]}"
        if have == 0:
            label = f"{gpu.node_label_key}={gpu.node_label_value}"
            return (
                f"no schedulable node has {label} and allocatable {gpu.resource_name} "
                f"(the cluster has: {self.describe()})"
            )
        return f"the cluster's {gpu.id} nodes have at most {have} GPU(s) each"

    def _counted(self, gpu_id: str) -> str:
        """`` (6 free on 2 nodes)``, or "" where GPUs are not counted."""
        if self.free is None:
            return ""
        nodes = len(self.free.get(gpu_id, ()))
        return f" ({self.free_gpus(gpu_id)} free on {nodes} node{'' if nodes == 1 else 's'})"

    def describe(self) -> str:
        """``l4 x1/node, h100-sxm x8/node`` (and unmatched products, unusable nodes,
        unlabelled GPU nodes), or ``no GPU nodes (3 nodes, none with a GPU resource)``."""
        parts = [f"{g} x{n}/node{self._counted(g)}" for g, n in sorted(self.gpus_per_node.items())]
        parts += [
            f"{g} x{n}/node not usable: {why}" for g, (n, why) in sorted(self.unusable.items())
        ]
        parts += [f"{p} (not in the catalog)" for p in self.unknown_products]
        parts += [
            f"{n} node(s) with allocatable {res} but no GPU product label (is GPU Feature "
            "Discovery installed?)"
            for res, n in sorted(self.unlabelled.items())
        ]
        if parts:
            return ", ".join(parts)
        if self.nodes is None:
            return "no GPU nodes"
        nodes = f"{self.nodes} schedulable node{'' if self.nodes == 1 else 's'}"
        return f"no GPU nodes ({nodes}, none with a GPU resource)"


@dataclass(frozen=True)
class HeldGpus:
    """GPUs pods already hold or wait for (``held_gpus``).

    Attributes:
        on_node: node name -> GPUs requested by the pods bound to it.
        claimed: catalog GPU id -> GPUs requested by pods that select that GPU type and
            are not yet bound to a node.
    """

    on_node: Mapping[str, int] = field(default_factory=dict)
    claimed: Mapping[str, int] = field(default_factory=dict)


def held_gpus(
    pods: Iterable[Mapping[str, Any]],
    catalog: Catalog,
    own: tuple[str, str] | None = None,
    engines: Iterable[Mapping[str, Any]] = (),
) -> HeldGpus:
    """What ``pods`` (every namespace's) hold of the catalog's GPU resources, and what
    the other targets' engine Deployments (``engines``) claim beyond their bound pods,
    except the running target's own (``own``: its namespace and name) and pods that
    have finished.

    A Deployment just scaled up has pods the scheduler has not seen, or not even been
    created: the operator's own view of its fleet is each engine Deployment's
    ``spec.replicas``, so two targets planned one after the other never count the same
    free GPUs. Pods that are not engines claim a GPU type while they wait for a node."""
    resources = {g.resource_name for g in catalog.gpus.values()}
    on_node: dict[str, int] = {}
    claimed: dict[str, int] = {}
    # GPUs the engine pods of each target hold, per GPU type (a mixed fleet's pools)
    bound: dict[tuple[tuple[str, str], str], int] = {}
    for pod in pods:
        target = _target_of(pod)
        if _finished(pod) or (own is not None and target == own):
            continue
        spec = pod.get("spec") or {}
        gpus = _pod_gpus(spec, resources)
        if gpus <= 0:
            continue
        if node := spec.get("nodeName"):
            on_node[str(node)] = on_node.get(str(node), 0) + gpus
            if target is not None:
                key = (target, _selected_gpu(spec, catalog))
                bound[key] = bound.get(key, 0) + gpus
        elif target is None and (gpu := _selected_gpu(spec, catalog)):
            claimed[gpu] = claimed.get(gpu, 0) + gpus
    for engine in engines:
        target = _target_of(engine)
        if target is None or target == own:
            continue
        template = ((engine.get("spec") or {}).get("template") or {}).get("spec") or {}
        gpu = _selected_gpu(template, catalog)
        replicas = int((engine.get("spec") or {}).get("replicas") or 0)
        # bound pods of this pool (a pod that selects no GPU type: of any)
        held = bound.get((target, gpu), 0) + (bound.get((target, ""), 0) if gpu else 0)
        wanted = replicas * _pod_gpus(template, resources) - held
        if gpu and wanted > 0:
            claimed[gpu] = claimed.get(gpu, 0) + wanted
    return HeldGpus(on_node, claimed)


def _finished(pod: Mapping[str, Any]) -> bool:
    return (pod.get("status") or {}).get("phase") in FINISHED_PHASES


def _target_of(obj: Mapping[str, Any]) -> tuple[str, str] | None:
    """(namespace, name) of the target whose engine ``obj`` (a pod or Deployment) is,
    by the label only Rooftop's engines carry; None for anything else."""
    meta = obj.get("metadata") or {}
    name = (meta.get("labels") or {}).get(TARGET_LABEL)
    return None if name is None else (str(meta.get("namespace")), str(name))


def _pod_gpus(spec: Mapping[str, Any], resources: set[str]) -> int:
    """GPUs a pod takes: its containers' sum, or its largest init container's if more
    (init containers run one at a time, before the others, as the scheduler counts).
    An extended resource's request equals its limit, so either names it."""

    def of(container: Mapping[str, Any]) -> int:
        res = container.get("resources") or {}
        asked = {**(res.get("requests") or {}), **(res.get("limits") or {})}
        return sum(_gpu_count(asked.get(r)) for r in resources)

    main = sum(of(c) for c in spec.get("containers") or [])
    return max([main, *(of(c) for c in spec.get("initContainers") or [])])


def _selected_gpu(spec: Mapping[str, Any], catalog: Catalog) -> str:
    """The catalog GPU a pod's (or pod template's) nodeSelector asks for, else ""."""
    selector = spec.get("nodeSelector") or {}
    for gpu in catalog.gpus.values():
        if selector.get(gpu.node_label_key) == gpu.node_label_value:
            return gpu.id
    return ""


def inventory_from_nodes(
    nodes: Iterable[Mapping[str, Any]],
    catalog: Catalog,
    placement: Placement | None = None,
    held: HeldGpus | None = None,
) -> GpuInventory:
    """Per catalog GPU, the most allocatable GPUs on one schedulable node that the
    target's pods may use (``placement``; None: any node), and the free GPUs of each
    such node after what ``held`` says pods hold (None: every GPU free)."""
    placement = placement or Placement()
    held = held or HeldGpus()
    free: dict[str, list[int]] = {}
    best: dict[str, int] = {}
    blocked: dict[str, tuple[int, str]] = {}
    unknown: set[str] = set()
    unlabelled: dict[str, int] = {}
    schedulable = 0
    for node in nodes:
        if (node.get("spec") or {}).get("unschedulable"):
            continue  # cordoned: nothing new lands there
        schedulable += 1
        labels = (node.get("metadata") or {}).get("labels") or {}
        allocatable = (node.get("status") or {}).get("allocatable") or {}
        gpus = [
            g for g in catalog.gpus.values() if labels.get(g.node_label_key) == g.node_label_value
        ]
        if not gpus and (resource := _unlabelled_gpus(labels, allocatable, catalog)):
            unlabelled[resource] = unlabelled.get(resource, 0) + 1
        for gpu in gpus:
            count = _gpu_count(allocatable.get(gpu.resource_name))
            if count <= 0:
                continue
            if why := placement.obstacle(node, gpu):
                if count > blocked.get(gpu.id, (0, ""))[0]:
                    blocked[gpu.id] = (count, why)
            else:
                best[gpu.id] = max(best.get(gpu.id, 0), count)
                name = str((node.get("metadata") or {}).get("name") or "")
                free.setdefault(gpu.id, []).append(max(count - held.on_node.get(name, 0), 0))
        product = labels.get(GPU_PRODUCT_LABEL)
        if not gpus and product:
            unknown.add(str(product))
    unusable = {g: b for g, b in blocked.items() if b[0] > best.get(g, 0)}
    return GpuInventory(
        best,
        tuple(sorted(unknown)),
        unusable,
        schedulable,
        unlabelled,
        {g: tuple(sorted(f, reverse=True)) for g, f in free.items()},
        {g: n for g, n in held.claimed.items() if g in best},
    )


def _unlabelled_gpus(
    labels: Mapping[str, Any], allocatable: Mapping[str, Any], catalog: Catalog
) -> str:
    """The GPU resource a node offers without any label saying which GPU, else ""."""
    for gpu in catalog.gpus.values():
        if gpu.node_label_key not in labels and _gpu_count(allocatable.get(gpu.resource_name)):
            return gpu.resource_name
    return ""


def _gpu_count(quantity: Any) -> int:
    """An extended-resource quantity (``"8"``; GPUs are whole numbers) as an int, 0 if
    absent or not a plain count."""
    try:
        return max(int(str(quantity)), 0)
    except ValueError:
        return 0


def target_inventory(
    cluster: tuple[Sequence[Mapping[str, Any]], Sequence[Mapping[str, Any]]],
    catalog: Catalog,
    constraints: Constraints,
    own: tuple[str, str],
) -> GpuInventory:
    """The GPUs ``cluster``'s nodes (``load_cluster``) offer a target's pods: nodes its
    ``constraints`` let them land on, less what the listed pods hold, its own (``own``:
    namespace and name) excepted, since its plan replaces them. What ``rooftop plan
    --nodes`` and ``rooftop simulate --nodes`` plan for."""
    nodes, pods = cluster
    held = held_gpus(pods, catalog, own)
    return inventory_from_nodes(nodes, catalog, Placement.of(constraints), held)


def load_cluster(path: str | Path) -> tuple[list[Mapping[str, Any]], list[Mapping[str, Any]]]:
    """(Nodes, Pods) from ``kubectl get nodes,pods -A -o json`` (or ``-o yaml``, or
    ``kubectl get nodes`` alone, or one Node). Without Pods every GPU counts as free."""
    path = Path(path)
    try:
        text = path.read_text(encoding="utf-8-sig")  # JSON is YAML
        doc = yaml.load(text, Loader=StrictLoader)  # a key given twice is an error
    except UnicodeDecodeError as err:
        raise InventoryError(f"{path}: not UTF-8 text ({err.reason})") from err
    except yaml.YAMLError as err:
        raise InventoryError(f"{path}: not JSON or YAML: {err}") from err
    hint = "write it with `kubectl get nodes,pods -A -o json > FILE`"
    if not isinstance(doc, Mapping):
        raise InventoryError(f"{path}: expected a node list object; {hint}")
    if doc.get("kind") == "Node":
        return [doc], []
    items = doc.get("items")
    if not isinstance(items, list) or not all(isinstance(i, Mapping) for i in items):
        raise InventoryError(f"{path}: expected `items`, a list of Node objects; {hint}")
    kinds = {None, "Node", "Pod"}
    odd = sorted({str(i.get("kind")) for i in items if i.get("kind") not in kinds})
    if odd:
        raise InventoryError(f"{path}: items of kind {', '.join(odd)}, not Node or Pod; {hint}")
    pods = [i for i in items if i.get("kind") == "Pod"]
    return [i for i in items if i.get("kind") != "Pod"], pods

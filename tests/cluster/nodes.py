"""Fake GPU (and CPU) nodes managed by kwok.

Why: the planner picks a GPU type and the operator expresses it as a nodeSelector on
`nvidia.com/gpu.product` plus an `nvidia.com/gpu` request; with kwok nodes the real
kube-scheduler does the fitting, so "9 GPUs on an 8-GPU node stays Pending" is real.
Labels follow NVIDIA GPU Feature Discovery (the labels it puts on a GPU node); kwok keeps
the capacity/allocatable given at creation.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

KWOK_ANNOTATION = "kwok.x-k8s.io/node"


@dataclass(frozen=True)
class GpuType:
    """One GPU node flavour; `product` is the GFD label value the planner catalog uses."""

    prefix: str
    product: str
    gpus: int
    memory_mib: int
    family: str
    compute: tuple[int, int]
    machine: str
    cpu: str
    memory: str
    arch: str = "amd64"  # kubernetes.io/arch of the host (GH200: arm64)


H100 = GpuType(
    "h100", "NVIDIA-H100-80GB-HBM3", 8, 81559, "hopper", (9, 0), "p5.48xlarge", "192", "2Ti"
)
A100 = GpuType(
    "a100", "NVIDIA-A100-SXM4-80GB", 8, 81920, "ampere", (8, 0), "p4de.24xlarge", "96", "1152Gi"
)
L4 = GpuType("l4", "NVIDIA-L4", 1, 23034, "ada-lovelace", (8, 9), "g6.xlarge", "4", "16Gi")

# (type, node count): 2x8 H100, 2x8 A100, 4x1 L4.
DEFAULT_FLEET: tuple[tuple[GpuType, int], ...] = ((H100, 2), (A100, 2), (L4, 4))
CPU_NODES = 1


def default_nodes() -> list[dict[str, Any]]:
    """All Node manifests of the default fleet, GPU nodes first."""
    nodes = [gpu_node(t, i) for t, count in DEFAULT_FLEET for i in range(count)]
    nodes += [cpu_node(i) for i in range(CPU_NODES)]
    return nodes


def gpu_node(gpu: GpuType, index: int) -> dict[str, Any]:
    name = f"{gpu.prefix}-{index}"
    labels = {
        "node.kubernetes.io/instance-type": gpu.machine,
        "nvidia.com/gpu.present": "true",
        "nvidia.com/gpu.product": gpu.product,
        "nvidia.com/gpu.count": str(gpu.gpus),
        "nvidia.com/gpu.memory": str(gpu.memory_mib),
        "nvidia.com/gpu.family": gpu.family,
        "nvidia.com/gpu.compute.major": str(gpu.compute[0]),
        "nvidia.com/gpu.compute.minor": str(gpu.compute[1]),
        "nvidia.com/gpu.machine": gpu.machine,
    }
    resources = _resources(gpu.cpu, gpu.memory) | {"nvidia.com/gpu": str(gpu.gpus)}
    return _node(name, labels | {"kubernetes.io/arch": gpu.arch}, resources)


def cpu_node(index: int) -> dict[str, Any]:
    """A GPU-less node for operator-side pods (load generators, sidecars...)."""
    name = f"cpu-{index}"
    labels = {"node.kubernetes.io/instance-type": "m6i.4xlarge"}
    return _node(name, labels, _resources("16", "64Gi"))


def _resources(cpu: str, memory: str) -> dict[str, str]:
    return {"cpu": cpu, "memory": memory, "pods": "110", "ephemeral-storage": "1Ti"}


def _node(name: str, labels: dict[str, str], resources: dict[str, str]) -> dict[str, Any]:
    base = {
        "type": "kwok",
        "kubernetes.io/arch": "amd64",
        "kubernetes.io/os": "linux",
        "kubernetes.io/hostname": name,
    }
    return {
        "apiVersion": "v1",
        "kind": "Node",
        "metadata": {
            "name": name,
            "annotations": {KWOK_ANNOTATION: "fake", "node.alpha.kubernetes.io/ttl": "0"},
            "labels": base | labels,
        },
        "spec": {},
        "status": {"capacity": resources, "allocatable": dict(resources)},
    }

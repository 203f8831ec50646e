"""GPU names as benchmarks and node labels spell them map to one catalog GPU, by each
GPU's ``name_pattern`` in gpus.yaml: adding a GPU is one catalog entry, and two patterns
that could claim one name fail here rather than map a GPU to the wrong one by file order."""

from __future__ import annotations

import re

import pytest

from rooftop_planner.catalog import load_catalog, normalize_gpu_name

GPUS = load_catalog().gpus


def _spellings(gpu_id: str) -> set[str]:
    gpu = GPUS[gpu_id]
    return {gpu.id, gpu.name.lower(), gpu.node_label_value.lower()}


@pytest.mark.parametrize("gpu_id", sorted(GPUS))
def test_each_pattern_claims_its_own_spellings_and_no_other_gpus(gpu_id: str) -> None:
    pattern = GPUS[gpu_id].name_pattern
    assert pattern, f"{gpu_id}: give it a name_pattern in gpus.yaml"
    assert all(re.search(pattern, name) for name in _spellings(gpu_id) - {gpu_id}), gpu_id
    others = {name for other in GPUS if other != gpu_id for name in _spellings(other)}
    assert not [name for name in others if re.search(pattern, name)]


@pytest.mark.parametrize(
    ("name", "gpu_id"),
    [
        ("H100_SXM", "h100-sxm"),
        ("NVIDIA H100 NVL", "h100-nvl"),
        ("h100-pcie-80gb", "h100-pcie"),
        ("GH200-480GB", "gh200"),
        ("H200 SXM 141GB", "h200"),
        ("A100-SXM4-40GB", "a100-40gb"),
        ("a100_sxm", "a100-80gb"),
        ("NVIDIA-L40", "l40"),
        ("l40s", "l40s"),
        ("g2-standard-l4", "l4"),
        ("MI300X", "mi300x"),
        ("tpu-v5litepod", "tpu-v5e"),
        ("rtx4090", None),
    ],
)
def test_benchmark_spellings_map_as_before(name: str, gpu_id: str | None) -> None:
    assert normalize_gpu_name(name, GPUS) == gpu_id

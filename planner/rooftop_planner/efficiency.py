"""Fitted efficiency parameters: how far real engines fall short of the roofline.

Values live in ``catalog/efficiency.yaml``, written by ``python -m rooftop_planner.calibrate``
from shared/data/measured/calibration.csv (never edited by hand). Lookup order for a
(GPU, engine) pair: the GPU's own fit, else the fleet-wide default; then the engine's
multipliers on top (engines differ mostly in per-step overhead).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, fields, replace
from functools import lru_cache
from importlib import resources
from typing import Any

import yaml

ENGINES = ("vllm", "sglang", "trtllm", "nim")
# Engines without calibration rows of their own borrow a sibling's: SGLang schedules like
# vLLM (continuous batching, CUDA graphs); NIM for LLMs runs TensorRT-LLM underneath.
ENGINE_FAMILY = {"vllm": "vllm", "sglang": "vllm", "trtllm": "trtllm", "nim": "trtllm"}


@dataclass(frozen=True)
class Efficiency:
    """Achievable fractions of peak and fixed costs of one engine on one GPU.

    Attributes:
        bandwidth_efficiency: achieved / peak HBM bytes/s while streaming weights and KV.
        flops_efficiency: achieved / peak dense FLOP/s in large matmuls.
        step_overhead_s: fixed cost per engine step (scheduling, sampling, launch), seconds.
        layer_overhead_s: fixed cost per layer per step (small kernels, norms), seconds.
        allreduce_latency_s: latency of one TP all-reduce, seconds.
    """

    bandwidth_efficiency: float = 0.80
    flops_efficiency: float = 0.60
    step_overhead_s: float = 2.0e-3
    layer_overhead_s: float = 20.0e-6
    allreduce_latency_s: float = 15.0e-6

    def scaled(self, step_time_scale: float) -> Efficiency:
        """All step costs scaled by ``step_time_scale`` (online calibration: observed/predicted)."""
        return replace(
            self,
            bandwidth_efficiency=self.bandwidth_efficiency / step_time_scale,
            flops_efficiency=self.flops_efficiency / step_time_scale,
            step_overhead_s=self.step_overhead_s * step_time_scale,
            layer_overhead_s=self.layer_overhead_s * step_time_scale,
            allreduce_latency_s=self.allreduce_latency_s * step_time_scale,
        )

    @classmethod
    def from_mapping(cls, values: Mapping[str, Any]) -> Efficiency:
        known = {f.name for f in fields(cls)}
        return cls(**{k: float(v) for k, v in values.items() if k in known})


@dataclass(frozen=True)
class EfficiencyTable:
    default: Efficiency
    per_gpu: Mapping[str, Efficiency]
    engine_overhead_factor: Mapping[str, float]

    def lookup(self, gpu_id: str, engine: str = "vllm") -> Efficiency:
        """The efficiency for a GPU under an engine (vLLM when not given)."""
        base = self.per_gpu.get(gpu_id, self.default)
        factor = self.engine_overhead_factor.get(ENGINE_FAMILY.get(engine, "vllm"), 1.0)
        return replace(
            base,
            step_overhead_s=base.step_overhead_s * factor,
            layer_overhead_s=base.layer_overhead_s * factor,
        )


def table_from_mapping(data: Mapping[str, Any]) -> EfficiencyTable:
    return EfficiencyTable(
        default=Efficiency.from_mapping(data.get("default", {})),
        per_gpu={k: Efficiency.from_mapping(v) for k, v in (data.get("gpus") or {}).items()},
        engine_overhead_factor={
            k: float(v) for k, v in (data.get("engine_overhead_factor") or {}).items()
        },
    )


@lru_cache(maxsize=1)
def load_efficiency() -> EfficiencyTable:
    """The packaged fitted table, or the defaults if it has not been fitted yet."""
    path = resources.files("rooftop_planner").joinpath("catalog", "efficiency.yaml")
    if not path.is_file():
        return EfficiencyTable(Efficiency(), {}, {})
    return table_from_mapping(yaml.safe_load(path.read_text()) or {})

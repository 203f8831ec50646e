"""How one engine runs on one GPU: fitted kernel curves plus the engine's fixed costs.

Values live in ``catalog/kernel_curves.json``, written by ``python -m
rooftop_fit.kernel_fit --write`` from the measured kernel tables in ``data/ops/`` and the
end-to-end rows of ``data/measured/calibration.csv`` (never edited by hand).

Lookup for a (GPU, engine) pair: the engine's curves on the GPU's kernel table
(``GpuSpec.kernel_table``, from the catalog): its own where it was measured, else the
nearest architecture's, scaled by the ratio of its roofline to the measured GPU's
(``kernels``), and says so (``Efficiency.borrowed_from``). Engines without tables of their own
borrow a sibling's (NIM for LLMs runs TensorRT-LLM underneath).
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import dataclass, field, replace
from functools import lru_cache
from importlib import resources
from typing import Any

from rooftop_planner.catalog import GpuSpec
from rooftop_planner.kernels import KernelCurves

ENGINES = ("vllm", "sglang", "trtllm", "nim")
# Engines whose kernels were not timed use the engine they run on underneath.
ENGINE_CURVES = {"vllm": "vllm", "sglang": "sglang", "trtllm": "trtllm", "nim": "trtllm"}
# The accelerator family every kernel table in data/ops was timed on (NVIDIA GPUs). A GPU
# of another family borrows curves whose efficiency its own software stack may not reach:
# it is credited with at most the measured GPU's bandwidth and FLOP/s (``capped``).
MEASURED_FAMILY = "cuda"


@dataclass(frozen=True)
class EngineOverhead:
    """Engine costs the kernel tables do not see, fitted on end-to-end rows.

    Attributes:
        step_s: per engine step: scheduling, sampling, launch (seconds).
        layer_s: per layer per step: the fixed part of its small kernels (seconds).
        fitted_on: which rows (``calibration.csv:vllm``) or which engine it borrows.
        elementwise_mem_eff: the share of peak HBM bandwidth the elementwise kernels of a
            layer reach (norms, rotary, activation, residual adds, KV-cache writes:
            ``kernel_model.elementwise_bytes`` per token); 0 leaves them out.
    """

    step_s: float = 0.0
    layer_s: float = 0.0
    fitted_on: str = ""
    elementwise_mem_eff: float = 0.0


@dataclass(frozen=True)
class Efficiency:
    """One engine on one GPU. ``kernels`` None is the ideal roofline (every η = 1, no t0).

    Attributes:
        kernels: the fitted curves (measured GPU and engine inside).
        overhead: the engine's fixed costs per step and per layer.
        time_scale: online calibration: observed / predicted step time (1 = as fitted).
        borrowed_from: the measured GPU whose curves stand in, "" when the GPU's own.
        capped: the curves were timed on another vendor's GPU: kernels are priced at no
            more than that GPU's bandwidth and FLOP/s (``kernel_model.credited_rates``),
            so its datasheet cannot make it faster than the GPU that was measured.
        fp8_as_timed: fp8 GEMMs priced as the kernel tables timed them, each behind a
            dynamic quant of its own input (``KernelCurves.gemm_as_timed``), instead of
            with the fusions the engine's current source shows
            (``kernel_model.unfused_quant_inputs``): for runs of an engine build whose
            fusions are not known, such as the TensorRT-LLM 0.9 engines of the
            calibration rows.
    """

    kernels: KernelCurves | None = None
    overhead: EngineOverhead = EngineOverhead()
    time_scale: float = 1.0
    borrowed_from: str = ""
    capped: bool = False
    fp8_as_timed: bool = False

    def scaled(self, step_time_scale: float) -> Efficiency:
        """Every step cost times ``step_time_scale`` (the floor still holds, see perf)."""
        return replace(self, time_scale=self.time_scale * step_time_scale)

    def describe(self) -> str:
        """One line for explanations: which curves, which engine version."""
        if self.kernels is None:
            return "ideal roofline (no fitted curves)"
        k = self.kernels
        source = f"{k.engine} {k.engine_version} kernels timed on {k.table_gpu}"
        if self.capped:
            return source + (
                " (borrowed from another vendor's GPU: credited with at most its bandwidth "
                "and FLOP/s)"
            )
        return source + (" (borrowed: nearest measured GPU)" if self.borrowed_from else "")


@dataclass(frozen=True)
class EfficiencyTable:
    """All fitted curves: by (measured GPU, engine), plus per-engine overheads."""

    curves: Mapping[tuple[str, str], KernelCurves] = field(default_factory=dict)
    overheads: Mapping[str, EngineOverhead] = field(default_factory=dict)

    def lookup(self, gpu: GpuSpec, engine: str = "vllm") -> Efficiency:
        """The curves for ``gpu`` under ``engine`` (vLLM when not given). KeyError when
        its kernel table has none for the engine: planning it at the ideal roofline
        instead would look fine and be far too fast."""
        table, curves_of = gpu.kernel_table, ENGINE_CURVES.get(engine, "vllm")
        kernels = self.curves.get((table, curves_of))
        if kernels is None:
            raise KeyError(
                f"no fitted {curves_of} kernel curves for table {table!r} (gpu {gpu.id}); "
                "python -m rooftop_fit.kernel_fit --write fits them from data/ops"
            )
        borrowed = table if gpu.kernel_table_borrowed else ""
        capped = bool(borrowed) and gpu.family != MEASURED_FAMILY
        overhead = self.overheads.get(engine, EngineOverhead())
        return Efficiency(kernels, overhead, 1.0, borrowed, capped)


def table_from_mapping(data: Mapping[str, Any]) -> EfficiencyTable:
    curves = {}
    for entry in data.get("curves") or []:
        kc = KernelCurves.from_mapping(entry)
        curves[(kc.table_gpu, kc.engine)] = kc
    overheads = {
        engine: EngineOverhead(
            float(v["step_s"]),
            float(v["layer_s"]),
            str(v.get("fitted_on", "")),
            float(v.get("elementwise_mem_eff", 0.0)),
        )
        for engine, v in (data.get("engine_overhead") or {}).items()
    }
    return EfficiencyTable(curves, overheads)


@lru_cache(maxsize=1)
def load_efficiency() -> EfficiencyTable:
    """The packaged fitted curves, or the ideal roofline if they have not been fitted yet."""
    path = resources.files("rooftop_planner").joinpath("catalog", "kernel_curves.json")
    if not path.is_file():
        return EfficiencyTable()
    return table_from_mapping(json.loads(path.read_text()))

"""The planner against decode and prefill steps timed on a real H100 and H200.

``data/measured/gpu_decode_steps.csv`` holds Llama-3.1-8B (TP1) and Llama-3.1-70B (one
TP4 shard) decode steps, bf16 and fp8 weights, batches 1-256 and contexts 512-8192, each
timed as a CUDA graph by ``benchmarks/gpu_decode_steps.py`` with cuBLAS/cuBLASLt GEMMs and
PyTorch's fused attention over a contiguous cache (data/README.md says where it ran). The
planner's curves come from kernels timed inside vLLM, so the bounds below say what must
hold between the two: the same hardware's bf16 GEMMs agree closely; vLLM's fp8 GEMMs and
paged decode attention are never faster than those libraries' (the planner may be slower,
not faster); the floor is never beaten; and the planner's whole step, with its fitted fixed
costs, stays near the GPU's kernel time.

``data/measured/gpu_prefill_steps.csv`` holds one-prompt prefill steps on both GPUs, where
the GEMMs are compute-bound: the share of peak FLOP/s they sustained is the catalog's
``SUSTAINED_FLOP_FRACTION``, and with it the planner's bf16 GEMMs agree with them.
"""

from __future__ import annotations

import csv
import statistics
from dataclasses import dataclass

import pytest

from rooftop_fit.kernel_fit import REPO
from rooftop_planner.catalog import SUSTAINED_FLOP_FRACTION, load_catalog
from rooftop_planner.efficiency import load_efficiency
from rooftop_planner.kernel_model import gemm_s, layer_gemm_shapes
from rooftop_planner.perf import EngineShape, floor_s, step_breakdown

STEPS_CSV = REPO / "data" / "measured" / "gpu_decode_steps.csv"


@dataclass(frozen=True)
class Step:
    """One measured decode step (ms) and the planner's terms for it (ms)."""

    name: str
    weights: str
    gemms_ms: float
    attention_ms: float
    step_ms: float
    planner_gemms_ms: float
    planner_attention_ms: float
    planner_step_ms: float  # GEMMs + attention + fixed costs: the shard ran alone, no all-reduce
    floor_ms: float


def _steps() -> list[Step]:
    catalog, efficiency = load_catalog(), load_efficiency()
    out = []
    with STEPS_CSV.open() as handle:
        for row in csv.DictReader(handle):
            gpu, batch, context = row["gpu"], int(row["batch"]), int(row["context"])
            spec = catalog.gpu(gpu)
            eff = efficiency.lookup(spec, "vllm")
            dep = EngineShape(catalog.model(row["model"]), spec, int(row["tp"]), row["weights"],
                             "auto", eff)  # fmt: skip
            parts = step_breakdown(dep, batch, batch * context)
            step = min(float(row["bmm_step_ms"]), float(row["sdpa_step_ms"]))
            out.append(Step(
                f"{row['model']} {row['weights']} tp{row['tp']} {gpu} b{batch} c{context}",
                row["weights"], float(row["gemms_ms"]), step - float(row["none_step_ms"]), step,
                parts.gemm_s * 1e3, parts.attention_s * 1e3,
                (parts.gemm_s + parts.attention_s + parts.overhead_s + parts.elementwise_s)
                * 1e3,
                floor_s(dep, batch, batch * context) * 1e3,
            ))  # fmt: skip
    return out


STEPS = _steps()


def test_the_measurements_cover_both_gpus_both_dtypes_and_both_models() -> None:
    names = " ".join(s.name for s in STEPS)
    for part in ("h100-sxm", "h200", "bf16", "fp8", "llama-3.1-8b", "llama-3.1-70b"):
        assert part in names
    assert len(STEPS) >= 100


def test_bf16_gemms_agree_with_the_gpus_own_cublas() -> None:
    """Same hardware, same bf16 GEMMs: vLLM's tables and cuBLAS time them alike."""
    errors = [s.planner_gemms_ms / s.gemms_ms - 1 for s in STEPS if s.weights == "bf16"]
    assert statistics.median(abs(e) for e in errors) <= 0.05
    assert max(abs(e) for e in errors) <= 0.15


@pytest.mark.parametrize("step", STEPS, ids=lambda s: s.name)
def test_no_measured_step_beats_the_physical_floor(step: Step) -> None:
    assert step.step_ms >= step.floor_ms


@pytest.mark.parametrize("step", STEPS, ids=lambda s: s.name)
def test_the_planner_prices_no_kernel_faster_than_the_libraries_ran_it(step: Step) -> None:
    """fp8 GEMMs (vLLM's CUTLASS kernels against cuBLASLt) and paged decode attention
    (against FlashAttention on a contiguous cache) may be slower in vLLM, not faster.
    bf16 GEMMs are cuBLAS in both and are held to agree instead (test above)."""
    if step.weights == "fp8":
        assert step.planner_gemms_ms >= 0.95 * step.gemms_ms
    assert step.planner_attention_ms >= 0.95 * step.attention_ms


def test_the_planners_step_stays_near_the_gpus_kernel_time() -> None:
    """The planner's step adds fitted fixed costs (norms, element-wise kernels and the
    engine's CPU work) to its kernels; the measured step is the GPU's work alone, so the
    planner may run a little slower, never much faster."""
    errors = [s.planner_step_ms / s.step_ms - 1 for s in STEPS]
    assert statistics.median(abs(e) for e in errors) <= 0.12
    assert min(errors) >= -0.10
    assert max(errors) <= 0.35


# ---------------------------------------------------------------- prefill: compute-bound

PREFILL_CSV = REPO / "data" / "measured" / "gpu_prefill_steps.csv"


@dataclass(frozen=True)
class Prefill:
    """One prompt prefilled on a real GPU: its GEMMs measured and priced (ms)."""

    gpu: str
    weights: str
    tokens: int
    gemm_flops: float
    gemms_ms: float
    planner_gemms_ms: float
    peak_flops_per_s: float


def _prefills() -> list[Prefill]:
    catalog, efficiency = load_catalog(), load_efficiency()
    out = []
    with PREFILL_CSV.open() as handle:
        for row in csv.DictReader(handle):
            model, gpu, tp = catalog.model(row["model"]), catalog.gpu(row["gpu"]), int(row["tp"])
            dep = EngineShape(model, gpu, tp, row["weights"], "auto",
                             efficiency.lookup(gpu, "vllm"))  # fmt: skip
            p = int(row["prompt_tokens"])
            weights = sum(n * k for n, k in layer_gemm_shapes(model, tp)) * model.num_layers
            flops = 2.0 * p * weights + 2.0 * model.vocab_size / tp * model.hidden_size
            parts = step_breakdown(dep, 0, 0, p, p * (p + 1) / 2)
            out.append(Prefill(gpu.id, row["weights"], p, flops, float(row["gemms_ms"]),
                               parts.gemm_s * 1e3, gpu.flops_per_s(row["weights"])))  # fmt: skip
    return out


PREFILLS = _prefills()


def test_the_sustained_flop_fraction_is_the_plateau_the_gpus_held() -> None:
    """From 1,024 tokens up the GEMMs of a prefill step run at a plateau of the GPU's peak
    FLOP/s, alike on the H100 and the H200; the catalog keeps the highest share seen."""
    for dtype, kept in SUSTAINED_FLOP_FRACTION.items():
        highest = []
        for gpu in ("h100-sxm", "h200"):
            shares = [p.gemm_flops / (p.gemms_ms * 1e-3) / p.peak_flops_per_s for p in PREFILLS
                      if (p.gpu, p.weights) == (gpu, dtype) and p.tokens >= 1024]  # fmt: skip
            assert len(shares) >= 4, (gpu, dtype)
            assert max(shares) - min(shares) < 0.07  # a plateau, not a trend
            highest.append(max(shares))
        assert round(max(highest), 2) == kept
        assert max(highest) - min(highest) < 0.02  # the same on both GPUs


def test_bf16_prefill_gemms_agree_with_the_h100_and_h200() -> None:
    """Compute-bound bf16 GEMMs: the fitted curves alone ran up to 19 % fast on the H100
    (the tables time one kernel at a time); capped at the sustained share they agree."""
    errors = [p.planner_gemms_ms / p.gemms_ms - 1 for p in PREFILLS
              if p.weights == "bf16" and p.tokens >= 512]  # fmt: skip
    assert len(errors) == 19
    assert max(abs(e) for e in errors) <= 0.08


def test_no_gemm_is_priced_above_the_sustained_flop_rate() -> None:
    catalog, efficiency = load_catalog(), load_efficiency()
    gpu = catalog.gpu("h100-sxm")
    for dtype in ("bf16", "fp8"):
        dep = EngineShape(catalog.model("llama-3.1-8b"), gpu, 1, dtype, "auto",
                         efficiency.lookup(gpu, "vllm"))  # fmt: skip
        m, n, k = 8192, 28672, 4096
        rate = 2.0 * m * n * k / gemm_s(dep, m, n, k)
        assert rate <= SUSTAINED_FLOP_FRACTION[dtype] * gpu.flops_per_s(dtype) * 1.001

"""fp8 GEMMs as vLLM and TensorRT-LLM serve them: the input quantization the kernel tables
time in front of every fp8 GEMM is mostly fused into the kernel before it, and the LM head
is never quantized.

The vLLM collectors timed each fp8 GEMM as vLLM's ``Fp8LinearMethod`` runs it: a per-token
quantization of the bf16 input, then the CUTLASS GEMM. They timed the quantization alone
too (``data/ops/<gpu>/vllm/scale_matrix_perf`` and ``computescale_perf``). vLLM 0.24's
compiler fuses it into the RMSNorm before the QKV and gate/up projections and into
SiLU-and-mul before the down projection; the attention output, from an opaque op, keeps
its own.

TensorRT-LLM's collector timed each fp8 GEMM behind its dynamic per-tensor quant (its
weights carry no input scale); it serves static scales, with the quant fused into SwiGLU,
into the attention kernel when the KV cache is fp8, and into the all-reduce + RMSNorm with
tensor parallelism on models wider than 4,096; what is left runs the static quant kernel
(``data/ops/<gpu>/trtllm/scale_matrix_perf``).
"""

from __future__ import annotations

import math
from dataclasses import dataclass, replace
from pathlib import Path

import numpy as np
import pytest

from rooftop_fit import kernel_fit
from rooftop_planner import perf
from rooftop_planner.catalog import KERNEL_TABLE_GPUS, load_catalog
from rooftop_planner.efficiency import load_efficiency
from rooftop_planner.kernel_model import (
    lm_head_s,
    step_model,
    unfused_quant_inputs,
    unfused_quant_s,
)
from rooftop_sim.engine.kernels import Roofline, load_tables
from rooftop_sim.engine.truth import _kernels, gpu_spec

CATALOG = load_catalog()
TABLE = load_efficiency()


def deployment(
    gpu: str,
    weights: str,
    engine: str = "vllm",
    *,
    model: str = "llama-3.1-8b",
    tp: int = 1,
    kv: str = "auto",
) -> perf.EngineShape:
    spec = CATALOG.gpu(gpu)
    return perf.EngineShape(CATALOG.model(model), spec, tp, weights, kv, TABLE.lookup(spec, engine))


@dataclass(frozen=True)
class Fp8Rows:
    """One engine's fp8 GEMM rows on one measured GPU, as the fit reads them."""

    folder: Path
    bw: float
    peak: float
    alone: kernel_fit.Features
    as_timed: kernel_fit.Features


def fp8_rows(table_gpu: str, engine: str) -> Fp8Rows:
    """The rows less the dynamic quant timed alone, and as timed."""
    folder = kernel_fit.DEFAULT_OPS / table_gpu / engine
    gpu = CATALOG.gpus[KERNEL_TABLE_GPUS[table_gpu]]
    bw = gpu.hbm_bytes_per_s
    columns = kernel_fit.read_table(folder / "gemm_perf.csv.gz")
    shapes = kernel_fit.catalog_gemm_shapes(CATALOG)
    quant = kernel_fit.quant_seconds(folder)
    alone = kernel_fit.gemm_features(columns, "fp8", shapes, quant, bw)
    as_timed = kernel_fit.gemm_features(columns, "fp8", shapes)
    return Fp8Rows(folder, bw, gpu.flops_per_s("fp8"), alone, as_timed)


@pytest.mark.parametrize("table_gpu", ["h100_sxm", "h200_sxm", "b200_sxm", "l40s"])
def test_vllm_fp8_curves_are_the_gemm_alone(table_gpu: str) -> None:
    """The stored fp8 curve was fitted on the measured calls less their quant (its stored
    error is its error there; on the calls as timed it is 18-24 % on the HBM GPUs, 10 %
    on the L40S, whose GEMMs are slow enough to hide the quant);
    the quant has a curve of its own."""
    kc = TABLE.curves[(table_gpu, "vllm")]
    assert kc.quant is not None
    rows = fp8_rows(table_gpu, "vllm")
    bw, peak, alone, as_timed = rows.bw, rows.peak, rows.alone, rows.as_timed
    quant = kernel_fit.quant_seconds(rows.folder)
    curve = kc.gemm["fp8"]
    on_alone = kernel_fit.curve_error(curve, alone, bw, peak)
    assert on_alone == pytest.approx(curve.median_error, abs=0.002)
    assert abs(kernel_fit.curve_error(curve, as_timed, bw, peak) - on_alone) > 0.005
    assert quant is not None
    quant_error = kernel_fit.curve_error(kc.quant, kernel_fit.quant_features(quant), bw, peak)
    assert quant_error < 0.15


@pytest.mark.parametrize("gpu", ["h100-sxm", "h200", "l40s"])
def test_the_one_quant_vllm_keeps_is_the_output_projections(gpu: str) -> None:
    fp8, bf16 = deployment(gpu, "fp8"), deployment(gpu, "bf16")
    tokens = np.array([1.0, 64.0, 4096.0])
    kept = unfused_quant_s(fp8, tokens)
    # a kernel of a few microseconds per layer at small batches, growing with the input
    assert 1e-6 < kept[0] < 1e-5 and kept[0] <= kept[1] < kept[2]
    assert (unfused_quant_s(bf16, tokens) == 0.0).all()
    # SGLang's fp8 curve carries the quant it serves in front of every GEMM: nothing added
    assert (unfused_quant_s(deployment(gpu, "fp8", "sglang"), tokens) == 0.0).all()


@pytest.mark.parametrize("table_gpu", ["h100_sxm", "h200_sxm", "b200_sxm", "l40s"])
def test_trtllm_fp8_curves_are_the_gemm_alone_and_it_serves_the_static_quant(
    table_gpu: str,
) -> None:
    """The fp8 curve was fitted on the calls less the dynamic quant its collector timed in
    front of them, and the curve of the calls as timed is kept beside it (for the
    TensorRT-LLM 0.9 calibration rows); the quant it prices is the static one."""
    kc = TABLE.curves[(table_gpu, "trtllm")]
    assert kc.quant is not None and "fp8" in kc.gemm_as_timed
    rows = fp8_rows(table_gpu, "trtllm")
    bw, peak, folder = rows.bw, rows.peak, rows.folder
    dynamic = kernel_fit.quant_seconds(folder)
    fitted = ((kc.gemm["fp8"], rows.alone), (kc.gemm_as_timed["fp8"], rows.as_timed))
    for curve, features in fitted:
        error = kernel_fit.curve_error(curve, features, bw, peak)
        assert error == pytest.approx(curve.median_error, abs=0.002)
    static = kernel_fit.served_quant_seconds(folder, "trtllm", dynamic)
    assert dynamic is not None and static is not None
    # the dynamic quant adds a reduction over the whole input: dearer at nearly every
    # shape (the collector clips a negative difference to 0)
    assert all(dynamic[key] >= static[key] for key in static)
    assert sum(dynamic[key] > static[key] for key in static) > 0.9 * len(static)
    quant_error = kernel_fit.curve_error(kc.quant, kernel_fit.quant_features(static), bw, peak)
    assert quant_error < 0.15


def test_trtllms_unfused_quants_follow_its_fusions() -> None:
    """Llama-3.1-8B at TP1: the QKV and gate/up inputs, and the output projection's
    unless the KV cache is fp8 (the attention kernel writes fp8 then). Llama-3.1-70B at
    TP4 (8,192 wide): the all-reduce fuses the norm and quant, so only the first layer's
    QKV input keeps its own. Llama-3.1-8B at TP2 (4,096 wide) is not fused."""
    hidden, layers_70b = 4096.0, 80
    assert unfused_quant_inputs(deployment("h100-sxm", "fp8", "trtllm"), "trtllm") == [
        (hidden, 1.0),
        (hidden, 1.0),
        (hidden, 1.0),
    ]
    fp8_kv = deployment("h100-sxm", "fp8", "trtllm", kv="fp8")
    assert unfused_quant_inputs(fp8_kv, "trtllm") == [(hidden, 1.0), (hidden, 1.0)]
    wide = deployment("h100-sxm", "fp8", "trtllm", model="llama-3.1-70b", tp=4, kv="fp8")
    assert unfused_quant_inputs(wide, "trtllm") == [(8192.0, 1 / layers_70b)]
    narrow = deployment("h100-sxm", "fp8", "trtllm", tp=2, kv="fp8")
    assert len(unfused_quant_inputs(narrow, "trtllm")) == 2


def test_trtllms_fp8_decode_step_is_cheaper_than_the_calls_as_timed() -> None:
    """Served with its fusions, a TensorRT-LLM fp8 decode step's GEMMs cost over 10 % less
    than the same step priced as its collector timed every GEMM, each behind a dynamic
    quant (``Efficiency.fp8_as_timed``, how the TensorRT-LLM 0.9 calibration rows are
    priced): the dynamic quants it fuses away cost more than the 16-bit LM head adds."""
    served = deployment("h100-sxm", "fp8", "trtllm", kv="fp8")
    as_timed = replace(served, efficiency=replace(served.efficiency, fp8_as_timed=True))
    assert (unfused_quant_s(as_timed, np.array([1.0, 32.0])) == 0.0).all()
    for seqs in (1.0, 32.0):
        gemms = [step_model(d).parts(seqs, 2048.0, 0.0, 0.0)[0] for d in (served, as_timed)]
        assert gemms[0] < 0.9 * gemms[1]


def test_trtllms_lm_head_runs_in_16_bits_except_as_timed() -> None:
    fp8, bf16 = deployment("h100-sxm", "fp8", "trtllm"), deployment("h100-sxm", "bf16", "trtllm")
    assert lm_head_s(fp8, 32) == pytest.approx(lm_head_s(bf16, 32), rel=1e-12)
    as_timed = replace(fp8, efficiency=replace(fp8.efficiency, fp8_as_timed=True))
    assert lm_head_s(as_timed, 32) != pytest.approx(lm_head_s(bf16, 32), rel=1e-3)


@pytest.mark.parametrize("weights", ["fp8", "int4"])
def test_vllms_lm_head_runs_in_16_bits_whatever_the_weights(weights: str) -> None:
    quantized, bf16 = deployment("h100-sxm", weights), deployment("h100-sxm", "bf16")
    for rows in (1, 32, 256):
        assert lm_head_s(quantized, rows) == pytest.approx(lm_head_s(bf16, rows), rel=1e-12)


@pytest.mark.parametrize("tokens", [1.0, 32.0, 512.0, 4096.0])
def test_the_simulated_engine_takes_the_measured_quant_off_the_fused_gemms(tokens: float) -> None:
    """Llama-3.1-8B fp8 on an H100 in the engine simulator: the QKV projection is the
    measured call less the measured quant of its 4,096-wide input, the output projection
    the call as measured, the LM head the 16-bit one."""
    tables = load_tables()["h100_sxm"]
    gpu = gpu_spec("h100-sxm")
    roof = Roofline(gpu, gpu)
    kernels = _kernels("llama-3.1-8b", "h100-sxm", 1, "fp8", "auto")
    bf16 = _kernels("llama-3.1-8b", "h100-sxm", 1, "bf16", "auto")
    as_timed = tables.gemm["fp8"].curve(6144, 4096, "fp8", roof)
    assert tables.quant is not None
    quant = float(tables.quant.latencies(4096, [tokens])[0])
    assert kernels.qkv(tokens) == pytest.approx(as_timed(tokens) - quant, rel=0.02)
    assert kernels.o_proj(tokens) == tables.gemm["fp8"].curve(4096, 4096, "fp8", roof)(tokens)
    assert math.isclose(kernels.lm_head(tokens), bf16.lm_head(tokens))

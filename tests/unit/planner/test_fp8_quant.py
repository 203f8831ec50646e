"""fp8 GEMMs as vLLM serves them: the input quantization the kernel tables time in front of
every fp8 GEMM is fused into the kernel before it, except before the output projection,
and the LM head is never quantized.

The vLLM collectors timed each fp8 GEMM as vLLM's ``Fp8LinearMethod`` runs it: a per-token
quantization of the bf16 input, then the CUTLASS GEMM. They timed the quantization alone
too (``data/ops/<gpu>/vllm/scale_matrix_perf`` and ``computescale_perf``). vLLM 0.24's
compiler fuses it into the RMSNorm before the QKV and gate/up projections and into
SiLU-and-mul before the down projection; the attention output, from an opaque op, keeps
its own.
"""

from __future__ import annotations

import math

import numpy as np
import pytest

from rooftop_fit import kernel_fit
from rooftop_planner import perf
from rooftop_planner.catalog import KERNEL_TABLE_GPUS, load_catalog
from rooftop_planner.efficiency import load_efficiency
from rooftop_planner.kernel_model import lm_head_s, unfused_quant_s
from rooftop_sim.engine.kernels import Roofline, load_tables
from rooftop_sim.engine.truth import _kernels, gpu_spec

CATALOG = load_catalog()
TABLE = load_efficiency()


def deployment(gpu: str, weights: str, engine: str = "vllm") -> perf.EngineShape:
    spec = CATALOG.gpu(gpu)
    model = CATALOG.model("llama-3.1-8b")
    return perf.EngineShape(model, spec, 1, weights, "auto", TABLE.lookup(spec, engine))


@pytest.mark.parametrize("table_gpu", ["h100_sxm", "h200_sxm", "b200_sxm", "l40s"])
def test_vllm_fp8_curves_are_the_gemm_alone(table_gpu: str) -> None:
    """The stored fp8 curve was fitted on the measured calls less their quant (its stored
    error is its error there; on the calls as timed it is 18-24 % on the HBM GPUs, 10 %
    on the L40S, whose GEMMs are slow enough to hide the quant);
    the quant has a curve of its own."""
    kc = TABLE.curves[(table_gpu, "vllm")]
    assert kc.quant is not None
    folder = kernel_fit.DEFAULT_OPS / table_gpu / "vllm"
    gpu = CATALOG.gpus[KERNEL_TABLE_GPUS[table_gpu]]
    bw, peak = gpu.hbm_bytes_per_s, gpu.flops_per_s("fp8")
    columns = kernel_fit.read_table(folder / "gemm_perf.csv.gz")
    shapes = kernel_fit.catalog_gemm_shapes(CATALOG)
    quant = kernel_fit.quant_seconds(folder)
    alone = kernel_fit.gemm_features(columns, "fp8", shapes, quant, bw)
    as_timed = kernel_fit.gemm_features(columns, "fp8", shapes)
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
    # the other engines' fp8 curves still carry every GEMM's quant: nothing is added
    assert (unfused_quant_s(deployment(gpu, "fp8", "trtllm"), tokens) == 0.0).all()


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

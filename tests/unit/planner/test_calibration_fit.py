"""The stored kernel curves and engine overheads still explain the data they were fitted on.

``python -m rooftop_fit.kernel_fit`` prints the median error of every curve on its op
table and of the engine overheads on every calibration.csv source, and stores them with
the fit; these tests recompute both from the vendored data (``data/``) and fail when the
stored fit has drifted above what it printed (an edited curve, a changed model, new data).
"""

from __future__ import annotations

import json
import math
from pathlib import Path

import numpy as np
import pytest

from rooftop_fit import kernel_fit
from rooftop_planner.catalog import KERNEL_TABLE_GPUS, CatalogError, load_catalog
from rooftop_planner.efficiency import (
    ENGINES,
    load_efficiency,
    table_from_mapping,
)
from rooftop_planner.kernel_model import elementwise_bytes
from rooftop_planner.kernels import KernelCurves

DOC = json.loads(kernel_fit.OUTPUT.read_text())
CURVES = [KernelCurves.from_mapping(entry) for entry in DOC["curves"]]
SLACK = 0.002  # rounding of the stored figures


@pytest.mark.parametrize("kc", CURVES, ids=lambda kc: f"{kc.table_gpu}-{kc.engine}")
def test_every_curve_reproduces_its_table_within_its_printed_error(kc: KernelCurves) -> None:
    errors = kernel_fit.stored_curve_errors(kernel_fit.DEFAULT_OPS, kc)
    assert {"gemm.bf16", "decode_attention.bf16", "prefill_attention.bf16"} <= set(errors)
    for name, (curve, now) in errors.items():
        assert now <= curve.median_error + SLACK, f"{kc.table_gpu}/{kc.engine} {name}"
        assert curve.median_error < 0.40, f"{name}: a curve this poor explains nothing"


def test_the_engine_overheads_reproduce_calibration_csv_within_their_printed_error() -> None:
    table = table_from_mapping(DOC)
    measurements = kernel_fit.load_measurements(kernel_fit.DEFAULT_DATA, table)
    errors = kernel_fit.signed_errors(measurements, lambda e: table.overheads[e])
    now = kernel_fit.overhead_errors(measurements, errors)
    assert set(now) == set(DOC["calibration_error"])
    for key, stored in DOC["calibration_error"].items():
        assert now[key]["rows"] == stored["rows"], key
        assert now[key]["median_error"] <= stored["median_error"] + SLACK, key
    # the rows that time engine steps directly are explained to within 20 % (median)
    assert now["nvidia-dli:tpot_s"]["median_error"] < 0.20
    assert now["nvidia-dli:ttft_s"]["median_error"] < 0.20


def test_the_step_times_are_right_in_slope_over_batch_size() -> None:
    # the stored bias by batch band is what the stored fit gives, and no band of the rows
    # that time steps is biased by more than 10 % either way
    table = table_from_mapping(DOC)
    measurements = kernel_fit.load_measurements(kernel_fit.DEFAULT_DATA, table)
    errors = kernel_fit.signed_errors(measurements, lambda e: table.overheads[e])
    now = kernel_fit.bias_by_batch(measurements, errors)
    assert now == DOC["calibration_bias_by_batch"]
    assert set(now["nvidia-dli:tpot_s"]) == {band for _, band in kernel_fit.BATCH_BANDS}
    for key in ("nvidia-dli:tpot_s", "nvidia-dli:ttft_s"):
        for band, bias in now[key].items():
            assert abs(bias) <= 0.10, (key, band, bias)


def test_batch_bands() -> None:
    bands = [kernel_fit.batch_band(b) for b in (1, 2, 16, 17, 64, 65, 256, 257, 4096)]
    assert bands == ["1", "2-16", "2-16", "17-64", "17-64", "65-256", "65-256", ">256", ">256"]


def test_fitted_values_are_physical() -> None:
    for kc in CURVES:
        for curves in (kc.gemm, kc.decode_attention, kc.prefill_attention, kc.moe):
            for curve in curves.values():
                assert all(0.0 < v <= 1.0 for v in curve.mem_eff + curve.flop_eff)
                assert 0.0 <= curve.t0_s <= kernel_fit.T0_BOUNDS_S[1]
        assert all(len(a.seconds) > 5 for a in kc.allreduce.values())
    for engine, overhead in load_efficiency().overheads.items():
        assert 0.0 <= overhead.step_s <= 0.02 and 0.0 <= overhead.layer_s <= 1e-4, engine
        # the elementwise kernels stream their bytes at a physical share of HBM bandwidth
        low, high = kernel_fit.OVERHEAD_BOUNDS["elementwise_mem_eff"]
        assert low <= overhead.elementwise_mem_eff <= high, engine


def test_elementwise_bytes_of_llama_3_1_8b() -> None:
    # 2 norms x 4 H + rotary 2 (q + kv) + KV write 4 kv + SiLU-and-mul 3 I, 16-bit
    model = load_catalog().model("llama-3.1-8b")
    assert elementwise_bytes(model, 1) == 2 * (8 * 4096 + 2 * (4096 + 1024) + 4 * 1024 + 3 * 14336)
    # tensor parallelism splits heads and the MLP, not the norms
    assert elementwise_bytes(model, 2) == 2 * (8 * 4096 + 2 * (2048 + 512) + 4 * 512 + 3 * 7168)


def test_a_step_pays_the_elementwise_bytes_of_every_token() -> None:
    from rooftop_planner.perf import step_breakdown
    from rooftop_planner.scenarios import scenario_from_row

    row = {"model": "llama-3.1-8b", "gpu": "h100-sxm", "tp": "1", "isl": "1000",
           "osl": "1000", "batch": "1"}  # fmt: skip
    dep = scenario_from_row(row, load_catalog(), load_efficiency()).deployment
    share = dep.efficiency.overhead.elementwise_mem_eff
    assert share > 0
    small, large = (step_breakdown(dep, seqs, seqs * 1000.0) for seqs in (1.0, 257.0))
    assert large.overhead_s == small.overhead_s  # the fixed costs do not grow
    per_token = (large.elementwise_s - small.elementwise_s) / 256.0
    bytes_per_token = dep.model.num_layers * elementwise_bytes(dep.model, 1)
    assert per_token == pytest.approx(bytes_per_token / (dep.gpu.hbm_bytes_per_s * share))


def test_every_catalog_gpu_has_curves_and_borrowed_ones_say_so() -> None:
    table = load_efficiency()
    for gpu in load_catalog().gpus.values():
        for engine in ENGINES:
            eff = table.lookup(gpu, engine)
            assert eff.kernels is not None, (gpu.id, engine)
            own = KERNEL_TABLE_GPUS[gpu.kernel_table] == gpu.id
            assert bool(eff.borrowed_from) != own, gpu.id
            assert ("borrowed" in eff.describe()) != own, gpu.id
    # NIM runs TensorRT-LLM underneath: it uses TensorRT-LLM's kernel curves
    h100 = load_catalog().gpu("h100-sxm")
    assert table.lookup(h100, "nim").kernels == table.lookup(h100, "trtllm").kernels


def test_a_gpu_must_name_its_kernel_table(tmp_path: Path) -> None:
    """A GPU without a table would plan at the ideal roofline, far too fast, silently."""
    new_gpu = (
        "gpus:\n  x1:\n    hbm_bytes: 8.0e+10\n    hbm_bytes_per_s: 3.0e+12\n"
        "    dense_flops_per_s: {bf16: 1.0e+15}\n    interconnect_bytes_per_s: 4.5e+11\n"
        "    usd_per_gpu_hour: 2.0\n"
    )
    path = tmp_path / "catalog.yaml"
    path.write_text(new_gpu)
    with pytest.raises(CatalogError, match=r"gpus\.x1\.kernel_table: missing; .*h100_sxm"):
        load_catalog(str(path))
    path.write_text(new_gpu + "    kernel_table: h900\n")
    with pytest.raises(CatalogError, match=r"gpus\.x1\.kernel_table: unknown kernel table 'h900'"):
        load_catalog(str(path))
    path.write_text(new_gpu + "    kernel_table: h100_sxm\n")
    x1 = load_catalog(str(path)).gpu("x1")
    assert load_efficiency().lookup(x1).borrowed_from == "h100_sxm"


def test_attention_curves_fit_only_the_head_layouts_served_models_run() -> None:
    heads = kernel_fit.catalog_attention_heads(load_catalog())
    # Llama-3.1-70B: 64 query / 8 KV heads; at TP 8 one KV head per GPU
    assert {(64, 8), (32, 4), (8, 1)} <= heads
    # the tables also time 64 query heads on one KV head, which no served model runs
    assert (64, 1) not in heads
    columns = kernel_fit.read_table(
        kernel_fit.DEFAULT_OPS / "h100_sxm" / "trtllm" / "generation_attention_perf.csv.gz"
    )
    every = kernel_fit.decode_attention_features(
        columns, "bfloat16", {(q, k) for q in range(1, 257) for k in range(1, 257)}
    )
    kept = kernel_fit.decode_attention_features(columns, "bfloat16", heads)
    assert 0 < len(kept.seconds) < len(every.seconds)


@pytest.mark.parametrize(("table_gpu", "cached"), [("l40s", True), ("h100_sxm", False)])
def test_rows_faster_than_dram_are_left_out(table_gpu: str, cached: bool) -> None:
    """The L40S's tables time small operands re-read from its L2 cache (up to 3x its DRAM
    bandwidth); a forward pass reads them from DRAM, so the fit leaves those rows out."""
    catalog = load_catalog()
    columns = kernel_fit.read_table(
        kernel_fit.DEFAULT_OPS / table_gpu / "vllm" / "gemm_perf.csv.gz"
    )
    rows = kernel_fit.gemm_features(columns, "bfloat16", kernel_fit.catalog_gemm_shapes(catalog))
    bw = catalog.gpus[KERNEL_TABLE_GPUS[table_gpu]].hbm_bytes_per_s
    kept = kernel_fit.from_dram(rows, bw)
    assert (kept.moved / kept.seconds <= bw).all()
    assert (len(kept.seconds) < len(rows.seconds)) == cached


@pytest.mark.parametrize("table_gpu", ["h100_sxm", "h200_sxm"])
def test_fp8_gemm_curves_follow_the_tile_jump_at_each_power_of_two(table_gpu: str) -> None:
    """vLLM's fp8 GEMMs on Hopper time as a saw-tooth in m: one token past a power of
    two costs 1.5-2.5x as much, then time falls again. The stored curve follows
    the measured rows at the batches a power-of-two concurrency runs (within 8 % in the
    median over the served weight shapes), where a smooth curve was 17-33 % slow."""
    catalog = load_catalog()
    gpu = catalog.gpus[KERNEL_TABLE_GPUS[table_gpu]]
    bw, peak = gpu.hbm_bytes_per_s, gpu.flops_per_s("fp8")
    curve = load_efficiency().curves[(table_gpu, "vllm")].gemm["fp8"]
    columns = kernel_fit.read_table(
        kernel_fit.DEFAULT_OPS / table_gpu / "vllm" / "gemm_perf.csv.gz"
    )
    quant = kernel_fit.quant_seconds(kernel_fit.DEFAULT_OPS / table_gpu / "vllm")
    shapes = kernel_fit.catalog_gemm_shapes(catalog)
    rows = kernel_fit.gemm_features(columns, "fp8", shapes, quant, bw)  # the GEMMs alone
    ratio = curve.times_s(rows.moved, rows.flops, rows.driver, bw, peak, rows.items) / rows.seconds
    for m in (128, 129, 256, 257, 512, 513, 1024):
        assert abs(float(np.median(ratio[rows.driver == m])) - 1.0) < 0.08, m


def test_a_knot_needs_a_row_between_the_previous_knot_and_itself() -> None:
    """A table timed at 1,024 and 2,048 tokens and nothing between cannot place a knot
    at 1,025: the fit would leave it anywhere within its bounds."""
    knots = (0.0, 2.0, 10.0, math.log2(1025), 11.0, 14.0)
    measured = np.log2(np.array([1.0, 4.0, 1024.0, 2048.0, 8192.0]))
    kept = kernel_fit.supported_knots(knots, measured)
    assert list(kept) == [0.0, 2.0, 10.0, 11.0, 14.0]
    # measured one token past 1,024: the knot there stays
    with_jump = kernel_fit.supported_knots(knots, np.append(measured, math.log2(1025)))
    assert list(with_jump) == list(knots)
    # the first knot stays while rows lie below the second; the last needs rows up to it
    assert list(kernel_fit.supported_knots((0.0, 4.0, 14.0), np.array([1.0, 3.0]))) == [0.0, 4.0]


SERVED_SHAPES = ((4096, 4096), (28672, 4096), (4096, 14336), (8192, 8192), (10240, 8192))


@pytest.mark.parametrize("kc", CURVES, ids=lambda kc: f"{kc.table_gpu}-{kc.engine}")
def test_no_gemm_curve_jumps_where_its_table_does_not(kc: KernelCurves) -> None:
    """One token more never costs more than 2.5x (the largest jump measured is vLLM's
    fp8 saw-tooth on Hopper, about 2.2x at the served shapes), at any batch up to 16,384
    tokens. The A100 tables have no rows between 1,024 and 2,048 tokens; a knot placed
    there once priced 1,025 tokens 70x slower than 1,024."""
    gpu = load_catalog().gpus[KERNEL_TABLE_GPUS[kc.table_gpu]]
    m = np.arange(1, 16385, dtype=float)
    for dtype, curve in kc.gemm.items():
        weight_bytes = 1.0 if dtype == "fp8" else 2.0
        for n, k in SERVED_SHAPES:
            moved = n * k * weight_bytes + (m * k + m * n) * 2.0
            t = curve.times_s(moved, 2.0 * m * n * k, m, gpu.hbm_bytes_per_s,
                              gpu.flops_per_s(dtype), np.zeros_like(m))  # fmt: skip
            jump = t[1:] / t[:-1]
            worst = int(np.argmax(jump))
            assert jump[worst] < 2.5, f"{dtype} {n}x{k}: {jump[worst]:.1f}x at m={worst + 2}"


def spikes_of(times_by_m: dict[int, float], n: float = 8192.0, k: float = 8192.0) -> set[int]:
    """The token counts ``timing_spikes`` flags in one weight shape's rows."""
    m = np.array(list(times_by_m), dtype=float)
    latency = np.array(list(times_by_m.values()))
    flagged = kernel_fit.timing_spikes(m, np.full_like(m, n), np.full_like(m, k), latency)
    return {int(x) for x in m[flagged]}


def test_a_few_token_gemm_timed_at_twice_its_neighbours_is_a_spike() -> None:
    flat = {m: 0.0187 for m in (1, 2, 3, 4, 8, 16, 32, 64)}
    assert spikes_of(flat) == set()
    assert spikes_of({**flat, 1: 0.0334, 16: 0.0381}) == {1, 16}
    # the last row has nothing with more tokens to be held to
    assert spikes_of({**flat, 64: 0.0525}) == set()


def test_growing_times_and_one_fast_row_flag_nothing() -> None:
    """Compute-bound growth (the L40S at a few dozen tokens) is not a spike; nor does one
    row timed fast at more tokens make the rows before it spikes (the reference is the
    median of the rows with more tokens, not their minimum)."""
    assert spikes_of({m: 0.01 * (1.0 + m / 16.0) for m in (1, 2, 4, 8, 16, 32, 64)}) == set()
    flat = {m: 0.02 for m in (1, 2, 4, 8, 16, 32, 64)}
    assert spikes_of({**flat, 32: 0.008}) == set()


def test_the_saw_tooth_above_64_tokens_is_kept() -> None:
    """One token past a power of two really costs up to 2.5x on Hopper (fp8 tiles); the
    rule only reads rows up to 64 tokens."""
    assert spikes_of({64: 0.02, 128: 0.02, 129: 0.05, 192: 0.03, 256: 0.025}) == set()


def test_spikes_are_judged_within_one_weight_shape() -> None:
    m = np.array([1.0, 2.0, 4.0, 1.0, 2.0, 4.0])
    n = np.array([4096.0, 4096.0, 4096.0, 8192.0, 8192.0, 8192.0])
    latency = np.array([0.01, 0.01, 0.01, 0.04, 0.02, 0.02])
    flagged = kernel_fit.timing_spikes(m, n, np.full_like(m, 4096.0), latency)
    assert flagged.tolist() == [False, False, False, True, False, False]


def test_one_sequence_is_not_priced_slower_than_four_on_b200_fp8() -> None:
    """vLLM's B200 fp8 table times one token at about 2x for most weight shapes (timing
    spikes); fitted on, they priced Llama-3.1-70B fp8 TP4 at 13.4 ms a step for one
    sequence and 9.8 ms for four. More sequences read the same weights and more KV."""
    from rooftop_planner.scenarios import scenario_from_row

    def tpot_ms(clients: int) -> float:
        row = {
            "model": "llama-3.1-70b",
            "gpu": "b200",
            "tp": "4",
            "weight_dtype": "fp8",
            "isl": "1024",
            "osl": "1024",
            "concurrency": str(clients),
            "engine": "vllm",
        }
        return scenario_from_row(row, load_catalog(), load_efficiency()).predict().tpot_s * 1e3

    one, four = tpot_ms(1), tpot_ms(4)
    assert one <= four * 1.05, (one, four)

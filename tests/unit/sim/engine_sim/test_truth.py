"""The engine timing truth: measured kernel tables, their interpolation, and the step sum."""

from __future__ import annotations

import csv
import dataclasses
import json
import math
from typing import Any

import numpy as np
import pytest

from rooftop_fit.kernel_fit import REPO
from rooftop_planner.catalog import SUSTAINED_FLOP_FRACTION
from rooftop_sim.engine import kernels, truth, truth_fit
from rooftop_sim.engine.kernels import LatencyCurve, Roofline, bracket
from rooftop_sim.engine.truth import TruthModel

H100_8B = ("llama-3.1-8b", "h100-sxm", 1, "bf16", "auto")


@pytest.fixture(scope="module")
def regenerated() -> tuple[dict[str, Any], dict[str, Any]]:
    """(all measured rows, the cut package) regenerated from data/ops."""
    if not truth.DEFAULT_OPS.is_dir():
        pytest.skip("data/ops is not in this checkout")
    full = truth_fit.read_ops(truth.DEFAULT_OPS)
    return full, truth_fit.cut(full)


# --------------------------------------------------------------------------------------
# The packaged artefact
# --------------------------------------------------------------------------------------


def test_packaged_tables_are_current(regenerated: tuple[dict[str, Any], dict[str, Any]]) -> None:
    """What data/ops regenerates is what ships (python -m ...truth --fit --write)."""
    _, packed = regenerated
    assert json.loads(json.dumps(packed)) == kernels.load_document()
    assert kernels.TABLES_PATH.stat().st_size < 1.5e6
    assert set(packed["tables"]) == set(kernels.TABLE_GPU)


def test_package_interpolates_as_the_full_tables(
    regenerated: tuple[dict[str, Any], dict[str, Any]],
) -> None:
    """The cut keeps every row a catalog deployment reads: same step times either way."""
    full, packed = regenerated
    cases = [("llama-3.1-8b", "h100_sxm", 1), ("llama-3.1-70b", "l40s", 4),
             ("mixtral-8x7b", "h100_sxm", 2), ("qwen2.5-7b", "a100_sxm", 2)]  # fmt: skip
    for model, name, tp in cases:
        gpu = truth.gpu_spec(kernels.TABLE_GPU[name])
        roof = Roofline(gpu, gpu)
        steps = []
        for doc in (full, packed):
            tables = kernels.parse_tables(doc)[name]
            k = truth.build_kernels(
                truth.model_spec(model), tp, tables, "bfloat16", "bfloat16", roof
            )
            steps.append(
                [k.step_ms(b, b * 1500, p, p * p / 2, b + 1) for b, p in ((1, 0), (32, 512))]
            )
        assert steps[0] == steps[1], (model, name, tp)
    # and fewer rows than measured
    assert len(json.dumps(packed)) < len(json.dumps(full)) / 3


def test_fit_report_per_table(regenerated: tuple[dict[str, Any], dict[str, Any]]) -> None:
    full, packed = regenerated
    text = truth_fit.report(full, packed)
    for name in kernels.TABLE_GPU:
        assert f"{name} (vLLM" in text
    assert "reproduce the raw rows to 0.0%" in text
    for name, doc in full["tables"].items():
        for kernel, dtype, errs in truth_fit._heldout(doc):
            for axis, e in errs.items():
                # log-log interpolation between grid neighbours: typically a few percent
                assert len(e) and np.median(np.abs(e)) < 0.10, (name, kernel, dtype, axis)


def test_cli_exit_codes(tmp_path: Any) -> None:
    assert truth.main([]) == 2
    assert truth.main(["--fit", "--ops", str(tmp_path / "missing")]) == 1


# --------------------------------------------------------------------------------------
# Interpolation primitives
# --------------------------------------------------------------------------------------


def test_bracket_inside_exact_and_outside() -> None:
    grid = [1.0, 4.0, 16.0]
    b = bracket(grid, 2.0)
    assert [i for i, _ in b.points] == [0, 1] and b.factor == 1.0
    assert b.points[1][1] == pytest.approx(0.5)  # halfway in log
    assert bracket(grid, 4.0).points == ((1, 1.0),)
    assert bracket(grid, 32.0).factor == pytest.approx(2.0)  # linear in work above
    assert bracket(grid, 32.0, power=2.0).factor == pytest.approx(4.0)
    assert bracket(grid, 0.5).factor == 1.0  # clamped below
    assert bracket(grid, 0.5, scale_below=True).factor == pytest.approx(0.5)


def test_curve_is_exact_on_power_laws_and_skips_unmeasured_points() -> None:
    xs = [1.0, 2.0, 4.0, 8.0]
    c = LatencyCurve(xs, [3.0 * x**1.5 for x in xs])
    assert c(3.0) == pytest.approx(3.0 * 3.0**1.5)
    assert c(16.0) == pytest.approx(c(8.0) * 2)  # proportional beyond the grid
    assert c(0.1) == pytest.approx(3.0)  # launch-bound below
    gappy = LatencyCurve(xs, [1.0, math.nan, 4.0, math.nan])
    assert gappy(2.0) == pytest.approx(2.0) and gappy(8.0) == pytest.approx(8.0)


def test_unpackaged_gemm_shape_takes_the_nearest_scaled() -> None:
    gemm = kernels.load_tables()["h100_sxm"].gemm["bfloat16"]
    near = gemm.latencies(4096, 4096)
    odd = gemm.latencies(4000, 50000)  # no catalog model has it
    assert np.all(np.isfinite(odd[np.isfinite(near)])) and np.nanmin(odd) > 0


def test_roofline_floors_and_scales() -> None:
    h100, l4 = truth.gpu_spec("h100-sxm"), truth.gpu_spec("l4")
    nbytes, flops = np.array([1e9, 1e6]), np.array([1e6, 1e14])  # memory-, compute-bound
    own = Roofline(h100, h100).apply(np.array([0.1, 200.0]), nbytes, flops)
    assert own[0] == pytest.approx(1e9 / h100.hbm_bytes_per_s * 1e3)  # lifted to the floor
    assert own[1] == 200.0  # above the floor: as measured
    borrowed = Roofline(h100, l4).apply(np.array([0.1, 200.0]), nbytes, flops)
    assert borrowed[0] / own[0] == pytest.approx(h100.hbm_bytes_per_s / l4.hbm_bytes_per_s)
    bf16 = h100.dense_flops_per_s["bf16"] / l4.dense_flops_per_s["bf16"]
    assert borrowed[1] / own[1] == pytest.approx(bf16)


def test_a_borrowed_kernel_keeps_its_launch_latency() -> None:
    l40s, l4 = truth.gpu_spec("l40s"), truth.gpu_spec("l4")
    bw = l40s.hbm_bytes_per_s / l4.hbm_bytes_per_s
    # 10 µs measured for 1 MB (1.2 µs at the L40S's bandwidth): 5 µs launch, the rest is
    # the kernel's own work, which the L4 does at its bandwidth
    nbytes, flops = np.array([1e6]), np.array([1e3])
    borrowed = Roofline(l40s, l4).apply(np.array([0.010]), nbytes, flops, launch_ms=0.005)
    assert borrowed[0] == pytest.approx(0.005 + 0.005 * bw)
    # a call no longer than the launch latency is all launch: as measured
    assert Roofline(l40s, l4).apply(np.array([0.004]), nbytes, flops, launch_ms=0.005)[0] == (
        pytest.approx(0.004)
    )


def test_the_floor_streams_no_faster_than_the_tables_cold_rate() -> None:
    l40s = truth.gpu_spec("l40s")
    nbytes, flops = np.array([10e6]), np.array([1e6])
    cold = 0.8 * l40s.hbm_bytes_per_s
    # 10 MB in 4 µs is 2.5 TB/s: from the L2 cache, lifted to 10 MB at the cold rate
    lifted = Roofline(l40s, l40s).apply(np.array([0.004]), nbytes, flops, cold_bytes_per_s=cold)
    assert lifted[0] == pytest.approx(10e6 / cold * 1e3)
    plain = Roofline(l40s, l40s).apply(np.array([0.004]), nbytes, flops)
    assert plain[0] == pytest.approx(10e6 / l40s.hbm_bytes_per_s * 1e3)


def test_no_kernel_computes_faster_than_a_forward_pass_sustains() -> None:
    """A table's GEMM timed alone at 0.85 of peak FLOP/s is lifted to the sustained share
    (``catalog.SUSTAINED_FLOP_FRACTION``); memory-bound calls are not touched."""
    h100 = truth.gpu_spec("h100-sxm")
    flops = np.array([1e12, 1e6])
    nbytes = np.array([1e6, 1e9])
    alone_ms = np.array([1e12 / (0.85 * h100.flops_per_s("bf16")) * 1e3, 1.0])
    out = Roofline(h100, h100).apply(alone_ms, nbytes, flops, "bf16")
    sustained = SUSTAINED_FLOP_FRACTION["bf16"] * h100.flops_per_s("bf16")
    assert out[0] == pytest.approx(1e12 / sustained * 1e3)
    assert out[1] == 1.0


def test_the_simulated_bf16_prefill_gemms_take_what_the_gpus_took() -> None:
    """data/measured/gpu_prefill_steps.csv: one prompt's GEMMs on a real H100 and H200,
    512-8,192 tokens (the tables alone priced them up to 25 % fast on the H100)."""
    path = REPO / "data" / "measured" / "gpu_prefill_steps.csv"
    with path.open() as handle:
        rows = [r for r in csv.DictReader(handle) if r["weights"] == "bf16"]
    checked = 0
    for row in rows:
        tokens = int(row["prompt_tokens"])
        if tokens < 512:
            continue
        k = TruthModel.for_deployment(
            row["model"], row["gpu"], int(row["tp"]), "bf16", "auto"
        ).kernels
        assert k.gemms_ms(tokens, 1) == pytest.approx(float(row["gemms_ms"]), rel=0.1), row
        checked += 1
    assert checked == 19


@pytest.mark.parametrize(("name", "dtype", "cached"), [
    ("l40s", "fp8", True), ("l40s", "bfloat16", True),
    ("h100_sxm", "bfloat16", False), ("h200_sxm", "fp8", False),
])  # fmt: skip
def test_only_the_l40s_tables_hold_calls_served_from_its_cache(
    name: str, dtype: str, cached: bool
) -> None:
    """Calls of operands too large for any cache stream at up to 0.8-0.95x DRAM bandwidth;
    on the L40S, smaller ones reach past it (its tool reuses the operands, which stay in
    L2), which a forward pass never sees. The HBM GPUs' tables have no such calls."""
    table = kernels.load_tables()[name].gemm[dtype]
    gpu = truth.gpu_spec(kernels.TABLE_GPU[name])
    cold = table.cold_bytes_per_s
    assert 0.7 * gpu.hbm_bytes_per_s < cold < gpu.hbm_bytes_per_s
    ms, nbytes = table.memory_bound_calls(dtype)
    faster = np.isfinite(ms) & (nbytes / (ms * 1e-3) > cold)
    assert faster.any() == cached


def test_a_cache_served_gemm_is_priced_at_the_cold_rate() -> None:
    """Llama-3.1-70B's output projection at TP 8 (8 MB of fp8 weight) times faster than
    the L40S's DRAM in its table; the step prices it at the table's cold rate."""
    table = kernels.load_tables()["l40s"].gemm["fp8"]
    n, k = 8192, 1024
    measured = table.latencies(n, k)[0]
    weight_ms = n * k / table.cold_bytes_per_s * 1e3
    assert measured < weight_ms
    l40s = truth.gpu_spec("l40s")
    assert table.curve(n, k, "fp8", Roofline(l40s, l40s))(1) >= weight_ms


def test_one_sequence_decode_attention_on_a_borrowing_gpu_is_launch_bound() -> None:
    """An L4 borrows the L40S's tables: one sequence's decode attention reads a few
    hundred kB, so its time is the launch latency on both, not 2.9x (the bandwidth
    ratio); a long-context batch is bandwidth-bound and scales by the ratio."""
    args = ("llama-3.1-70b", 8, "fp8", "fp8")
    l40s = TruthModel.for_deployment(args[0], "l40s", *args[1:]).kernels.decode_attn
    l4 = TruthModel.for_deployment(args[0], "l4", *args[1:]).kernels.decode_attn
    bw = truth.gpu_spec("l40s").hbm_bytes_per_s / truth.gpu_spec("l4").hbm_bytes_per_s
    assert l4(1, 1300) / l40s(1, 1300) < 1.5
    assert 0.7 * bw < l4(256, 16000) / l40s(256, 16000) <= bw * 1.001


# --------------------------------------------------------------------------------------
# The step model
# --------------------------------------------------------------------------------------


def test_decode_step_is_physical_and_monotone() -> None:
    t = TruthModel.for_deployment(*H100_8B)
    step = t.decode_step_s(1, 1000)
    weights_s = t.dep.weight_bytes_per_gpu / t.dep.gpu.hbm_bytes_per_s  # ~4.8 ms
    assert step >= weights_s and 0.005 <= step <= 0.012
    batches = [t.decode_step_s(b, b * 1000) for b in (1, 2, 4, 8, 16, 32, 64, 128, 256)]
    assert batches == sorted(batches)
    contexts = [t.decode_step_s(32, 32 * c) for c in (100, 500, 1000, 4000, 16000, 64000)]
    assert contexts == sorted(contexts)
    assert t.decode_step_s(0, 0) == 0.0 and t.step_s(0, 0, 0, 0) == 0.0


def test_a_few_token_gemm_timed_at_twice_the_rest_is_not_packaged() -> None:
    """A call of up to 64 tokens slower than 1.5x the median of the same weight's calls
    with more tokens is a timing spike; growth with tokens and the saw-tooth above 64
    tokens stay as measured."""
    ms = [1, 2, 4, 8, 16, 32, 64, 128, 129, 256]
    row: list[float | None] = [0.04, 0.02, 0.02, None, 0.045, 0.02, 0.02, 0.02, 0.05, 0.03]
    cleaned = truth_fit._without_spikes(ms, row)
    assert cleaned == [None, 0.02, 0.02, None, None, 0.02, 0.02, 0.02, 0.05, 0.03]
    growing: list[float | None] = [0.01 * (1 + m / 16) for m in ms]
    assert truth_fit._without_spikes(ms, growing) == growing


def test_one_sequence_decodes_no_slower_than_four_on_b200_fp8() -> None:
    """vLLM's B200 fp8 table timed one token at about 2x for most weights; packaged as
    measured, Llama-3.1-70B fp8 at TP 4 decoded one sequence slower than four."""
    model = TruthModel.for_deployment("llama-3.1-70b", "b200", 4, "fp8", "fp8")
    one, four = model.decode_step_s(1, 1000), model.decode_step_s(4, 4000)
    assert one <= four * 1.02, (one, four)


def test_prefill_and_mixed_steps() -> None:
    t = TruthModel.for_deployment(*H100_8B)
    prompts = [t.prefill_s(n) for n in (128, 1024, 4096, 16384, 32768)]
    assert prompts == sorted(prompts) and prompts[0] > 0
    decode_only = t.step_s(16, 16 * 1000, 0, 0)
    mixed = t.step_s(16, 16 * 1000, 512, 512 * 513 / 2)
    assert decode_only == pytest.approx(t.decode_step_s(16, 16 * 1000))
    # one forward pass reads the weights once: cheaper than two separate steps
    assert decode_only < mixed < decode_only + t.prefill_s(512)
    # a chunk late in a long prompt attends more context than the same chunk first
    first = t.step_s(0, 0, 2048, 2048 * 2049 / 2)
    late = t.step_s(0, 0, 2048, 2048 * (8192 + 2049 / 2))
    assert late > first


def test_tensor_parallel_splits_the_work() -> None:
    steps = [TruthModel.for_deployment("llama-3.1-70b", "h100-sxm", tp, "bf16", "auto")
             for tp in (2, 4, 8)]  # fmt: skip
    decode = [t.decode_step_s(8, 8000) for t in steps]
    assert decode == sorted(decode, reverse=True)
    assert steps[0].kernels.allreduce is not None
    assert TruthModel.for_deployment(*H100_8B).kernels.allreduce is None


def test_measured_gpu_uses_its_tables_and_others_borrow() -> None:
    h100 = TruthModel.for_deployment(*H100_8B)
    assert h100.fit_source == "tables:h100_sxm"
    l40s = TruthModel.for_deployment("llama-3.1-8b", "l40s", 1, "bf16", "auto")
    l4 = TruthModel.for_deployment("llama-3.1-8b", "NVIDIA-L4", 1, "bf16", "auto")
    assert l4.fit_source.startswith("tables:l40s borrowed by l4")
    # batch-1 decode streams weights: the L4 is slower than the L40S by about their bandwidth
    bw = l40s.dep.gpu.hbm_bytes_per_s / l4.dep.gpu.hbm_bytes_per_s
    ratio = l4.decode_step_s(1, 100) / l40s.decode_step_s(1, 100)
    assert 0.8 * bw < ratio < 1.1 * bw
    assert (
        "borrowed"
        in TruthModel.for_deployment("llama-3.1-8b", "mi300x", 1, "bf16", "auto").fit_source
    )
    a100_40, gh200 = truth.gpu_spec("a100-40gb"), truth.gpu_spec("gh200")
    assert kernels.table_for(a100_40) == "a100_sxm" and kernels.table_for(gh200) == "h100_sxm"


def test_weight_and_kv_dtypes_pick_table_rows() -> None:
    bf16 = TruthModel.for_deployment(*H100_8B)
    fp8 = TruthModel.for_deployment("llama-3.1-8b", "h100-sxm", 1, "fp8", "auto")
    assert fp8.decode_step_s(1, 1000) < bf16.decode_step_s(1, 1000)  # fp8 GEMM rows
    int4 = TruthModel.for_deployment("llama-3.1-8b", "h100-sxm", 1, "int4", "auto")
    assert int4.decode_step_s(1, 1000) == bf16.decode_step_s(1, 1000)  # bf16 approximation
    a100 = [
        TruthModel.for_deployment("llama-3.1-8b", "a100-80gb", 1, w, "auto")
        for w in ("bf16", "fp8")
    ]
    assert a100[0].decode_step_s(1, 1000) == a100[1].decode_step_s(1, 1000)  # no FP8 on Ampere
    kv8 = TruthModel.for_deployment("llama-3.1-8b", "h100-sxm", 1, "bf16", "fp8")
    assert kv8.decode_step_s(64, 64 * 4000) < bf16.decode_step_s(64, 64 * 4000)


def test_moe_uses_the_moe_table_or_expert_gemms() -> None:
    h100 = TruthModel.for_deployment("mixtral-8x7b", "h100-sxm", 2, "bf16", "auto")
    assert h100.kernels.moe is not None
    a100 = TruthModel.for_deployment("mixtral-8x7b", "a100-80gb", 2, "bf16", "auto")
    assert a100.kernels.moe is None  # no vLLM MoE table for the A100: experts as GEMMs
    for t in (h100, a100):
        steps = [t.decode_step_s(b, b * 1000) for b in (1, 4, 32, 128)]
        assert steps == sorted(steps)
        # batch 1 touches 2 of 8 experts: more than the attention weights, less than all
        assert t.decode_step_s(1, 1000) < t.decode_step_s(128, 128_000)


def test_no_step_beats_streaming_the_weights() -> None:
    """Every GPU, every catalog TP degree: a decode step reads all weights (dense) at
    most at peak bandwidth, whatever the tables say (the roofline floor)."""
    for gpu in ("h100-sxm", "l40s", "l4", "a100-80gb", "b200"):
        for tp in (1, 2, 4):
            t = TruthModel.for_deployment("llama-3.1-8b", gpu, tp, "bf16", "auto")
            assert t.decode_step_s(1, 100) >= t.dep.weight_bytes_per_gpu / t.dep.gpu.hbm_bytes_per_s


def test_reality_factor_scales_and_noise_is_seeded_mean_one() -> None:
    base = TruthModel.for_deployment(*H100_8B)
    slow = TruthModel.for_deployment(*H100_8B, reality_factor=1.5)
    assert slow.decode_step_s(8, 8000) == pytest.approx(1.5 * base.decode_step_s(8, 8000))
    a = TruthModel.for_deployment(*H100_8B, noise=0.2, seed=7)
    b = TruthModel.for_deployment(*H100_8B, noise=0.2, seed=7)
    xs = np.array([a.decode_step_s(8, 8000) for _ in range(4000)])
    assert list(xs[:5]) == [b.decode_step_s(8, 8000) for _ in range(5)]
    assert xs.std() > 0
    assert xs.mean() == pytest.approx(base.decode_step_s(8, 8000), rel=0.03)
    with pytest.raises(ValueError):
        TruthModel.for_deployment(*H100_8B, reality_factor=0.0)


def test_kv_capacity() -> None:
    t = TruthModel.for_deployment(*H100_8B)
    cap = t.kv_capacity_tokens(0.9)
    # (72 GiB - 16 GB weights - 2 GiB overhead) / 128 KiB per token ~ 440k tokens
    assert 350_000 < cap < 520_000 and cap % 16 == 0
    assert t.kv_capacity_tokens(0.5) < cap
    fp8 = TruthModel.for_deployment("llama-3.1-8b", "h100-sxm", 1, "bf16", "fp8")
    assert fp8.kv_capacity_tokens(0.9) == pytest.approx(2 * cap, rel=0.01)
    with pytest.raises(ValueError):
        t.kv_capacity_tokens(0.0)


def test_names_resolve_through_the_catalog_and_unknowns_fail() -> None:
    assert truth.gpu_spec("NVIDIA-H100-80GB-HBM3").id == "h100-sxm"
    assert truth.gpu_spec("H100 NVL").id == "h100-nvl"
    assert truth.model_spec("meta-llama/Llama-3.1-8B-Instruct").id == "llama-3.1-8b"
    with pytest.raises(KeyError):
        TruthModel.for_deployment("llama-3.1-8b", "tpu-v9", 1, "bf16", "auto")
    with pytest.raises(KeyError):
        truth.model_spec("no-such-model-13b")
    with pytest.raises(ValueError):
        TruthModel.for_deployment("llama-3.1-8b", "h100-sxm", 0, "bf16", "auto")


def test_a_step_streams_every_tokens_elementwise_bytes_at_peak_bandwidth() -> None:
    """Norms, rotary, SiLU-and-mul and the KV-cache write are not in the tables: their
    bytes (Llama-3.1-8B: 2 · (8 · 4096 + 2 · (4096 + 1024) + 4 · 1024 + 3 · 14336) per
    token and layer) are added at the GPU's peak HBM bandwidth."""
    model, gpu = truth.model_spec("llama-3.1-8b"), truth.gpu_spec("h100-sxm")
    per_layer = 2 * (8 * 4096 + 2 * (4096 + 1024) + 4 * 1024 + 3 * 14336)
    assert truth.layer_elementwise_bytes(model, 1) == per_layer
    expected_ms = 1e3 * 32 * per_layer / gpu.hbm_bytes_per_s
    assert truth.elementwise_ms(model, 1, gpu) == pytest.approx(expected_ms)
    k = TruthModel.for_deployment(*H100_8B).kernels
    assert k.elementwise_ms_per_token == pytest.approx(expected_ms)
    without = dataclasses.replace(k, elementwise_ms_per_token=0.0)
    for batch, chunk in ((1, 0), (64, 0), (8, 2048)):
        added = k.step_ms(batch, batch * 1000, chunk, chunk * chunk / 2, batch) - without.step_ms(
            batch, batch * 1000, chunk, chunk * chunk / 2, batch
        )
        assert added == pytest.approx((batch + chunk) * expected_ms)
    # tensor parallelism splits heads and the MLP, not the norms
    per_gpu_tp2 = 2 * (8 * 4096 + 2 * (2048 + 512) + 4 * 512 + 3 * 7168)
    assert truth.layer_elementwise_bytes(model, 2) == per_gpu_tp2

"""Worked examples of LLM-serving arithmetic from public write-ups (KV bytes per token,
the largest batch that fits, the optimal batch) as tests against our formulas.

Each case quotes its example's number; tolerances reflect that example's own rounding.
"""

from __future__ import annotations

import math

import pytest

from rooftop_planner import perf
from rooftop_planner.catalog import load_catalog
from rooftop_planner.efficiency import Efficiency

CATALOG = load_catalog()
GB = 1e9


def test_seed000_llama7b_fp16_kv_is_about_2gb_per_4k_sequence() -> None:
    model = CATALOG.model("llama-2-7b")
    per_sequence = perf.kv_bytes_per_token(model, "fp16") * 4096
    assert per_sequence / GB == pytest.approx(2.0, rel=0.1)


@pytest.mark.parametrize(("hbm_gb", "expected"), [(24, 5), (80, 33)])
def test_seed000_max_batch_on_24gb_and_80gb(hbm_gb: int, expected: int) -> None:
    """Seed 000: 14 GB of fp16 weights leave room for ≈5 (24 GB) / ≈33 (80 GB) 4K sequences."""
    weights = 7e9 * 2  # the seed's "2 x 7 = 14 GB"
    per_sequence = perf.kv_bytes_per_token(CATALOG.model("llama-2-7b"), "fp16") * 4096
    fits = perf.max_sequences(hbm_gb * GB - weights, per_sequence)
    assert abs(fits - expected) <= 0.1 * expected + 1


@pytest.mark.parametrize(
    ("gpu", "expected"),
    [("a10g", 70e12 * 2 / (2 * 600e9)), ("a100-80gb", 312e12 * 2 / (2 * 2039e9))],
)
def test_seed001_optimal_batch_size(gpu: str, expected: float) -> None:
    """Seed 001: B* = peak FLOP/s · bytes per parameter / (2 · memory bandwidth)."""
    spec = CATALOG.gpu(gpu)
    b_star = perf.optimal_batch_size(spec.flops_per_s("bf16"), spec.hbm_bytes_per_s, 2.0)
    assert b_star == pytest.approx(expected)
    # Seed 000 rounds the FLOP:byte ratio of these GPUs to "about 400" (B* for 1-byte params x2).
    assert 100 < b_star < 400


def test_seed002_llama3_70b_int8_kv_is_160_kib_per_token() -> None:
    model = CATALOG.model("llama-3-70b")
    assert perf.kv_bytes_per_token(model, "int8") == 160 * 1024


@pytest.mark.parametrize(
    ("dtype", "bytes_per_param", "min_chips", "remaining_gb", "kv_caches"),
    [("bf16", 2.0, 16, 116, 43), ("int8", 1.0, 8, 68, 52), ("int4", 0.5, 4, None, None)],
)
def test_seed002_minimum_tpu_v5e_topology(
    dtype: str,
    bytes_per_param: float,
    min_chips: int,
    remaining_gb: float | None,
    kv_caches: int | None,
) -> None:
    """Seed 002's table: smallest power-of-two slice of 16 GB chips, and 8K KV caches.

    The KV-cache counts are checked from the seed's own "remaining HBM" column. Its int4
    row (19 GB left -> 67 caches) contradicts its 81 kB/token, so only the chip count is
    checked there.
    """
    hbm = CATALOG.gpu("tpu-v5e").hbm_bytes
    params = 70e9 * bytes_per_param
    assert 2 ** math.ceil(math.log2(params / hbm)) == min_chips
    if remaining_gb is None or kv_caches is None:
        return
    per_cache = perf.kv_bytes_per_token(CATALOG.model("llama-3-70b"), dtype) * 8192
    assert abs(perf.max_sequences(remaining_gb * GB, per_cache) - kv_caches) <= 2  # seed rounds


def test_seed002_step_time_with_hbm_full_is_about_19ms() -> None:
    """Seed 002: with HBM full, one step streams 16 GB at 8.2e11 B/s ≈ 19 ms per chip."""
    gpu = CATALOG.gpu("tpu-v5e")
    assert gpu.hbm_bytes / gpu.hbm_bytes_per_s * 1e3 == pytest.approx(19.5, abs=0.6)


def test_seed002_qps_per_chip_table() -> None:
    """Seed 002: QPS/chip = B / (step · median decode steps · N) with step 19 ms, 512 steps."""
    step_s, steps = 0.019, 512
    for chips, batch, qps in ((16, 43, 0.27), (8, 52, 0.66), (4, 67, 1.72)):
        assert batch / (step_s * steps * chips) == pytest.approx(qps, rel=0.25)


def test_pure_roofline_step_is_weights_over_bandwidth() -> None:
    """With ideal efficiency and no overheads, batch-1 decode = weight bytes / HBM bytes/s."""
    ideal = Efficiency()  # no fitted curves: every achieved fraction 1, no fixed costs
    dep = perf.EngineShape(
        CATALOG.model("llama-3-70b"), CATALOG.gpu("h100-sxm"), 1, "int8", "int8", ideal
    )
    expected = perf.weight_bytes(dep.model, "int8") / dep.gpu.hbm_bytes_per_s
    assert perf.decode_step_s(dep, 1, 1) == pytest.approx(expected, rel=0.01)

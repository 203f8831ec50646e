"""The KV-cache dtype calibration.csv's DLI rows are read with is the one they ran.

The source does not state it. Their peak memory does: it grows with batch × tokens by
the cache's bytes per token on one GPU. Rows with long answers (128-token prompts,
2,048-4,096-token answers) grow mostly by cache, so their growth tells an fp8 cache
(1 byte a value) from a 16-bit one (2 bytes).
"""

from __future__ import annotations

import csv
import math
import re
import statistics
from collections import defaultdict

import numpy as np
import pytest

from rooftop_fit import kernel_fit
from rooftop_planner.catalog import load_catalog
from rooftop_planner.perf import kv_bytes_per_token_per_gpu
from rooftop_planner.scenarios import normalize_dtype

ROWS = list(csv.DictReader(kernel_fit.DEFAULT_DATA.open(newline="")))
CATALOG = load_catalog()


def cache_bytes_per_token(model_name: str, tp: int, kv_dtype: str) -> float:
    """K and V of every layer for one token, on one of ``tp`` GPUs, bytes (``auto``:
    the 16-bit cache of these fp16 and fp8 checkpoints)."""
    cache_dtype = "bf16" if kv_dtype == "auto" else kv_dtype
    return kv_bytes_per_token_per_gpu(CATALOG.model(model_name), cache_dtype, tp)


def kv_bytes_per_token_from_peak_memory(
    rows: list[dict[str, str]],
) -> dict[tuple[str, str, str, str, int, int], float]:
    """Bytes per token by which the peak memory of one GPU grows, per group of DLI rows
    (model, GPU, TP, weight dtype, isl, osl) with three batch sizes or more: the slope of
    the ``peak mem`` in their notes over batch × (isl + osl) tokens, least squares."""
    groups: dict[tuple[str, str, str, str, int, int], list[tuple[float, float]]] = defaultdict(list)
    for row in rows:
        peak = re.search(r"peak mem ([\d.]+) GB", row.get("notes") or "")
        if kernel_fit.source_of(row) != "nvidia-dli" or not peak or not row.get("batch"):
            continue
        isl, osl = int(row["isl"]), int(row["osl"])
        key = (row["model"], row["gpu"], row["tp"], row["weight_dtype"], isl, osl)
        groups[key].append((int(row["batch"]) * (isl + osl), float(peak.group(1)) * 1e9))
    return {
        key: float(np.polyfit([t for t, _ in points], [m for _, m in points], 1)[0])
        for key, points in groups.items()
        if len({t for t, _ in points}) >= 3
    }


def long_answer_groups() -> list[tuple[dict[str, str], float]]:
    """A row of each long-answer group and its peak memory's growth per token."""
    growth = kv_bytes_per_token_from_peak_memory(ROWS)
    out = []
    for key, bytes_per_token in growth.items():
        model, gpu, tp, weights, isl, osl = key
        if isl == 128 and osl >= 2048:
            row = next(
                r
                for r in ROWS
                if (r["model"], r["gpu"], r["tp"], r["weight_dtype"]) == (model, gpu, tp, weights)
                and kernel_fit.source_of(r) == "nvidia-dli"
            )
            out.append((row, bytes_per_token))
    return out


GROUPS = long_answer_groups()


def test_there_are_groups_of_both_dtypes() -> None:
    fp8 = [row for row, _ in GROUPS if row["weight_dtype"].startswith("fp8")]
    assert len(fp8) >= 50 and len(GROUPS) - len(fp8) >= 30


def group_id(value: object) -> str:
    if not isinstance(value, dict):
        return ""
    return f"{value['model']}-{value['gpu']}-tp{value['tp']}-{value['weight_dtype'][:4]}"


@pytest.mark.parametrize("row, growth", GROUPS, ids=group_id)
def test_peak_memory_grows_by_the_cache_the_calibration_reads(
    row: dict[str, str], growth: float
) -> None:
    read = normalize_dtype(kernel_fit.with_kv_dtype_ran(row)["kv_dtype"], "kv_dtype", kv=True)
    other = "auto" if read == "fp8" else "fp8"
    tp = int(row["tp"])
    fits = abs(math.log(growth / cache_bytes_per_token(row["model"], tp, read)))
    alternative = abs(math.log(growth / cache_bytes_per_token(row["model"], tp, other)))
    assert fits < alternative, f"peak memory grows by {growth / 1e3:.0f} KB per token"


@pytest.mark.parametrize("fp8_weights", [True, False])
def test_the_growth_is_the_cache_within_ten_percent_at_the_median(fp8_weights: bool) -> None:
    ratios = []
    for row, growth in GROUPS:
        if row["weight_dtype"].startswith("fp8") != fp8_weights:
            continue
        read = normalize_dtype(kernel_fit.with_kv_dtype_ran(row)["kv_dtype"], "kv_dtype", kv=True)
        ratios.append(growth / cache_bytes_per_token(row["model"], int(row["tp"]), read))
    assert 0.9 < statistics.median(ratios) < 1.1


def test_only_unstated_dli_fp8_rows_change() -> None:
    changed = [r for r in ROWS if kernel_fit.with_kv_dtype_ran(r) != r]
    assert changed and all(kernel_fit.source_of(r) == "nvidia-dli" for r in changed)
    assert all(r["weight_dtype"].startswith("fp8") for r in changed)
    stated = {**changed[0], "kv_dtype": "fp16"}
    assert kernel_fit.with_kv_dtype_ran(stated) == stated

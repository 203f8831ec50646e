"""Fit the kernel curves on measured kernel tables, then the engines' fixed costs.

    python -m rooftop_fit.kernel_fit [--ops DIR] [--data CSV] [--write | --stored]

1. Per measured GPU and engine (``data/ops/<gpu>/<engine>/``), every kernel table gets a
   roofline curve (``kernels.Curve``): the achieved fractions of peak bandwidth and FLOP/s
   as piecewise-linear functions of log2 of what drives them, plus a fixed latency. The
   fit minimises log(predicted / measured) over the table's rows, so a 2x miss counts the
   same either way; the median |error| of each table is printed and stored. The rows are
   those the planner will price: GEMMs at catalog models' weight shapes, attention at
   their head layouts, and none faster than DRAM (``from_dram``).
2. With the curves fixed, what the kernel tables do not time is fitted per engine on the
   end-to-end static batches of ``data/measured/calibration.csv``: a cost per step
   (scheduling, launch), per layer (small fixed kernels), and the share of HBM bandwidth
   the elementwise kernels reach (norms, rotary, activation, residual adds, KV-cache
   writes: bytes that grow with the step's tokens). The error per source and metric is
   printed and stored.

``--write`` stores the result in ``rooftop_planner/catalog/kernel_curves.json``; only this
command writes it. On a terminal, stderr reports each table as it is fitted (the whole fit
takes minutes).
"""

from __future__ import annotations

import argparse
import csv
import gzip
import json
import math
import statistics
import sys
from collections import defaultdict
from collections.abc import Callable, Mapping, Sequence, Set
from dataclasses import dataclass, replace
from functools import partial
from pathlib import Path
from typing import Any

import numpy as np
import numpy.typing as npt

import rooftop_planner
from rooftop_api import exit_codes
from rooftop_planner.catalog import KERNEL_TABLE_GPUS, Catalog, load_catalog
from rooftop_planner.efficiency import (
    EfficiencyTable,
    EngineOverhead,
    table_from_mapping,
)
from rooftop_planner.kernel_model import layer_gemm_shapes, quant_bytes
from rooftop_planner.kernels import AllReduce, Curve, KernelCurves
from rooftop_planner.progress import Progress
from rooftop_planner.scenarios import Scenario, ScenarioError, normalize_dtype, scenario_from_row

Array = npt.NDArray[np.float64]
REPO = Path(__file__).resolve().parents[2]
DEFAULT_OPS = REPO / "data" / "ops"
DEFAULT_DATA = REPO / "data" / "measured" / "calibration.csv"
# The planner reads the fit from its own package (``efficiency.load_efficiency``).
OUTPUT = Path(rooftop_planner.__file__).resolve().parent / "catalog" / "kernel_curves.json"
FIT_ENGINES = ("vllm", "sglang", "trtllm")
HEAD_DIM = 128  # the vendored attention tables hold head_dim 128 only
FIT_ROWS = 6000  # rows per curve fit (a seeded sample); errors are reported on every row
EFF_BOUNDS = (0.01, 1.0)
T0_BOUNDS_S = (0.0, 2e-4)
ITEM_BOUNDS_S = (0.0, 2e-5)
OVERHEAD_BOUNDS = {
    "step_s": (0.0, 0.02),
    "layer_s": (0.0, 1e-4),
    "elementwise_mem_eff": (0.05, 1.0),
}
# A few-token GEMM row slower than this many times the median of the same weight with more
# tokens (up to this many) is a timing spike (``timing_spikes``).
SPIKE_RATIO = 1.5
SPIKE_MAX_TOKENS = 64
# GEMM curve knots, log2 m: every other power of two, and from 64 to 2048 tokens each power
# of two and the token after it. vLLM's and SGLang's fp8 GEMMs on the H100 and H200 time
# as a saw-tooth in m (their kernel configuration and tile count change there): one token
# past 128, 256, 512 or 1024 costs 1.5-2.5x as much (medians over the served weight
# shapes), and time then falls again towards the next power of two. A smooth curve through
# that is 17-33 % slow at exactly 128-1024 tokens, the batches a benchmark's power-of-two
# concurrency runs; a knot either side of each jump lets the fit follow it. A fraction
# whose term barely binds near a knot (the FLOP fraction of a few-token GEMM) is loosely
# determined, so neighbouring knots may differ widely; the fit error is on the times.
# A table fits only the knots its rows stand behind (``supported_knots``): the A100's
# tables time no batch between 1,024 and 2,048 tokens, nor 129, 257 or 513.
GEMM_KNOTS = (
    (0.0, 2.0, 4.0, 5.0)
    + tuple(x for j in range(6, 12) for x in (float(j), math.log2(2**j + 1)))
    + (12.0, 14.0)
)


# ---------------------------------------------------------------- reading tables


def read_table(path: Path) -> dict[str, Any]:
    """A vendored table as columns: numeric ones as float arrays, text ones as arrays."""
    with gzip.open(path, "rt", newline="") as handle:
        rows = list(csv.DictReader(handle))
    columns: dict[str, Any] = {}
    for name in rows[0]:
        values = [r[name] for r in rows]
        try:
            columns[name] = np.array([float(v) for v in values])
        except ValueError:
            columns[name] = np.array(values)
    return columns


def _select(columns: dict[str, Any], mask: npt.NDArray[np.bool_]) -> dict[str, Any]:
    return {k: v[mask] for k, v in columns.items()}


# ---------------------------------------------------------------- one curve


@dataclass(frozen=True)
class Features:
    """What a kernel does, per row: bytes moved, FLOPs, the driver, items; and its time."""

    moved: Array
    flops: Array
    driver: Array
    items: Array
    seconds: Array


def _curve_times(
    params: Array, f: Features, knots: Array, bw: float, peak: float, items: bool
) -> Array:
    n = len(knots)
    t0 = params[0]
    item = params[1] if items else 0.0
    offset = 2 if items else 1
    x = np.log2(np.maximum(f.driver, 1.0))
    mem = np.interp(x, knots, params[offset : offset + n])
    flop = np.interp(x, knots, params[offset + n : offset + 2 * n])
    memory, compute = f.moved / (bw * mem), f.flops / (peak * flop)
    result: Array = t0 + item * f.items + (memory**4 + compute**4) ** 0.25
    return result


def from_dram(f: Features, bw: float) -> Features:
    """The rows no faster than their bytes over the GPU's DRAM bandwidth ``bw`` (B/s).

    A timing tool calls one kernel on the same operands again and again, so an operand
    smaller than the L2 cache stays in it: on the L40S a tenth of the GEMM and
    decode-attention rows (operands up to about 64 MB) run at up to 3x its 0.86 TB/s of
    GDDR6. In a forward pass the rest of the model streams through the cache between
    two calls of one layer's kernel, so those operands come from DRAM; and the planner
    never predicts below that floor anyway. Such rows are left out of the fit and of the
    fit's error.
    """
    return _take(f, f.seconds >= f.moved / bw)


def fit_curve(
    f: Features, knots: Sequence[float], bw: float, peak: float, items: bool = False
) -> Curve:
    """Least squares on log(predicted/measured) of the roofline curve (``kernels.Curve``),
    on the rows a forward pass can see (``from_dram``)."""
    from scipy.optimize import least_squares  # type: ignore[import-untyped]

    f = from_dram(f, bw)
    grid = supported_knots(knots, np.log2(np.maximum(f.driver, 1.0)))
    sample = _sample(f)
    head = [1e-6, 1e-7] if items else [1e-6]
    lower = [T0_BOUNDS_S[0], ITEM_BOUNDS_S[0]][: len(head)] + [EFF_BOUNDS[0]] * 2 * len(grid)
    upper = [T0_BOUNDS_S[1], ITEM_BOUNDS_S[1]][: len(head)] + [EFF_BOUNDS[1]] * 2 * len(grid)
    start = np.array(head + [0.6] * 2 * len(grid))

    def residuals(p: Array) -> Array:
        out: Array = np.log(_curve_times(p, sample, grid, bw, peak, items) / sample.seconds)
        return out

    result = least_squares(residuals, start, bounds=(lower, upper), x_scale="jac")
    p = result.x
    errors = np.abs(_curve_times(p, f, grid, bw, peak, items) / f.seconds - 1.0)
    offset = len(head)
    return Curve(
        t0_s=_sig(p[0]),
        item_s=_sig(p[1]) if items else 0.0,
        knots=tuple(float(k) for k in grid),
        mem_eff=tuple(_sig(v) for v in p[offset : offset + len(grid)]),
        flop_eff=tuple(_sig(v) for v in p[offset + len(grid) :]),
        median_error=round(float(np.median(errors)), 4),
        rows=len(f.seconds),
    )


def supported_knots(knots: Sequence[float], x: Array) -> Array:
    """The knots the rows stand behind: those with a measured driver (``x``, the same
    log2 scale) above the previous knot and at most at the knot itself.

    A knot with no row near it is fitted on nothing or on rows far off: the least
    squares may leave it anywhere within the bounds. The A100 tables time GEMMs at
    1,024 and 2,048 tokens and none between, so their knot one token past 1,024 came
    out at 1 % of peak, and every chunked-prefill step of 1,025-2,047 tokens was priced
    up to 60x slow; their knots one token past 128, 256 and 512 made dips no row shows.
    Without such a knot the curve runs straight between the measured batches. The first
    knot holds the curve below the second, so it stays if any row lies below that.
    """
    points = np.asarray(x, dtype=float)
    grid = np.asarray(knots, dtype=float)
    keep = [grid[0]] if len(grid) > 1 and np.any(points < grid[1]) else []
    keep += [
        knot
        for knot, low in zip(grid[1:], grid[:-1], strict=True)
        if np.any((points > low) & (points <= knot))
    ]
    return np.array(keep, dtype=float)


def _sample(f: Features) -> Features:
    if len(f.seconds) <= FIT_ROWS:
        return f
    return _take(f, np.random.default_rng(0).choice(len(f.seconds), FIT_ROWS, replace=False))


def _take(f: Features, rows: npt.NDArray[Any]) -> Features:
    """The rows ``rows`` (a mask or indices) of every column."""
    return Features(*(getattr(f, name)[rows] for name in Features.__dataclass_fields__))


def _sig(value: float) -> float:
    return float(f"{float(value):.4g}")


# ---------------------------------------------------------------- per table


def catalog_gemm_shapes(catalog: Catalog) -> list[tuple[float, float]]:
    """(n, k) of every GEMM a catalog model runs at TP 1, 2, 4 or 8: its layers' dense
    GEMMs and its LM head."""
    shapes = []
    for model in catalog.models.values():
        for tp in (1, 2, 4, 8):
            shapes += layer_gemm_shapes(model, tp)
            shapes.append((model.vocab_size / tp, float(model.hidden_size)))
    return sorted(set(shapes))


def gemm_features(
    t: dict[str, Any],
    dtype: str,
    shapes: Sequence[tuple[float, float]],
    quant: Mapping[tuple[float, float], float] | None = None,
    bw: float = math.inf,
) -> Features:
    """GEMM rows of one dtype at the weight shapes the planner times (m ≤ 16384).

    ``shapes``: (n, k) of the GEMMs served models run (``catalog_gemm_shapes``); a row is
    kept when its n and k are both within √2 of one of them. One curve in m is fitted
    per dtype, so it should describe the shapes it will price: the tables also time
    weights a few hundred wide, where fp8 GEMMs reach a much smaller share of peak and
    would pull the curve down for the large weights served models run.

    bytes = n · k · weight bytes + (m · k + m · n) · 2; FLOPs = 2 · m · n · k; driver = m.

    ``quant``: seconds of the activation quantization each fp8 row timed in front of its
    GEMM, by (m, k) (``quant_seconds``); given, the fp8 rows are the GEMM alone: their
    time less the quant's, no less than their bytes at the GPU's DRAM rate ``bw`` (B/s;
    below it ``from_dram`` would drop them). That is what vLLM runs where the quant is
    fused into the kernel before the GEMM (``kernel_model``'s fp8 pricing).
    """
    t = _select(t, t["gemm_dtype"] == dtype)
    m, n, k = t["m"], t["n"], t["k"]
    keep = np.zeros(len(m), dtype=bool)
    for sn, sk in shapes:
        keep |= (np.abs(np.log2(n / sn)) <= 0.5) & (np.abs(np.log2(k / sk)) <= 0.5)
    keep &= (n >= 256) & (k >= 256) & (m <= 16384)
    keep &= ~timing_spikes(m, n, k, t["latency"])
    m, n, k, lat = m[keep], n[keep], k[keep], t["latency"][keep]
    weight_bytes = 1.0 if dtype == "fp8" else 2.0
    moved = n * k * weight_bytes + (m * k + m * n) * 2.0
    seconds = lat * 1e-3
    if quant is not None and dtype == "fp8":
        timed = np.array([quant.get((a, b), 0.0) for a, b in zip(m, k, strict=True)])
        seconds = np.maximum(seconds - timed, moved / bw)
    return Features(moved, 2.0 * m * n * k, m, np.zeros_like(m), seconds)


def quant_seconds(folder: Path) -> dict[tuple[float, float], float] | None:
    """Seconds of the dynamic fp8 quantization of an m × k bf16 input, by (m, k): the
    static per-tensor quant (``scale_matrix_perf``) plus what computing the scale adds
    (``computescale_perf``, at least 0; per token in vLLM, per tensor in TensorRT-LLM);
    None where the tables are missing. It is what both engines' collectors timed in front
    of every fp8 GEMM: their weights carry no input scale."""
    static = _static_quant(folder)
    extra_path = folder / "computescale_perf.csv.gz"
    if static is None or not extra_path.is_file():
        return None
    extra = read_table(extra_path)
    added = {
        (a, b): max(v, 0.0) * 1e-3
        for a, b, v in zip(extra["m"], extra["k"], extra["latency"], strict=True)
    }
    return {key: v + added.get(key, 0.0) for key, v in static.items()}


def _static_quant(folder: Path) -> dict[tuple[float, float], float] | None:
    """Seconds of the static per-tensor fp8 quant of an m × k bf16 input, by (m, k)."""
    path = folder / "scale_matrix_perf.csv.gz"
    if not path.is_file():
        return None
    t = read_table(path)
    return {(a, b): v * 1e-3 for a, b, v in zip(t["m"], t["k"], t["latency"], strict=True)}


# The fp8 quant each engine runs as a kernel of its own when serving: vLLM quantizes per
# token with a scale it computes (its fp8 checkpoints and ``--quantization fp8`` carry
# none), the dynamic quant its collector timed; TensorRT-LLM serves ModelOpt checkpoints,
# whose calibrated input scales make it the static per-tensor quant (``Linear``'s FP8
# QDQ path runs ``static_quantize_e4m3_per_tensor`` when the layer has an input scale).
SERVED_QUANT = {"vllm": "dynamic", "trtllm": "static"}


def served_quant_seconds(
    folder: Path, engine: str, dynamic: Mapping[tuple[float, float], float] | None
) -> Mapping[tuple[float, float], float] | None:
    """Seconds of the fp8 quant ``engine`` runs on its own when serving, by (m, k), given
    the dynamic quant its collector timed (``quant_seconds(folder)``); None where the
    engine has no quant tables or no such kernel."""
    if dynamic is None or engine not in SERVED_QUANT:
        return None
    return dynamic if SERVED_QUANT[engine] == "dynamic" else _static_quant(folder)


def quant_features(quant: Mapping[tuple[float, float], float]) -> Features:
    """The quant kernel as a curve's rows: bytes ``kernel_model.quant_bytes``; no FLOPs
    worth counting; driver = m."""
    keys = sorted(quant)
    m = np.array([a for a, _ in keys])
    k = np.array([b for _, b in keys])
    seconds = np.array([quant[key] for key in keys])
    return Features(quant_bytes(m, k), np.zeros_like(m), m, np.zeros_like(m), seconds)


def timing_spikes(m: Array, n: Array, k: Array, latency: Array) -> npt.NDArray[np.bool_]:
    """Rows of a few-token GEMM timed at over ``SPIKE_RATIO`` times the median of the same
    weight with more tokens (up to ``SPIKE_MAX_TOKENS``): timing spikes, not kernels.

    Up to 64 tokens a served weight's GEMM is bound by reading the whole weight once, so
    fewer tokens do not take longer than more. vLLM's B200 fp8 table breaks that at m = 1
    for 167 of the 232 weight shapes the fit reads (at 2.2x the shape's median time, the
    median over those rows); other tables at scattered m (at most 1.5 % of those rows).
    Fitted on, the B200 spike priced one sequence slower than four. The median of the
    rows with more tokens is the reference, so one row timed fast does not make its
    neighbours spikes. The saw-tooth above 128 tokens is real (``GEMM_KNOTS``) and is
    not touched.
    """
    spikes = np.zeros(len(m), dtype=bool)
    small = np.flatnonzero(m <= SPIKE_MAX_TOKENS)
    order = small[np.lexsort((m[small], k[small], n[small]))]
    starts = np.flatnonzero((np.diff(n[order]) != 0) | (np.diff(k[order]) != 0)) + 1
    for group in np.split(order, starts):
        times = latency[group]
        for i in range(len(group) - 1):
            spikes[group[i]] = times[i] > SPIKE_RATIO * np.median(times[i + 1 :])
    return spikes


def catalog_attention_heads(catalog: Catalog) -> set[tuple[int, int]]:
    """(query heads, KV heads) per GPU of every catalog model at TP 1, 2, 4 or 8 (KV
    heads are replicated, one per GPU, when there are fewer than GPUs)."""
    return {
        (model.num_heads // tp, max(model.num_kv_heads // tp, 1))
        for model in catalog.models.values()
        for tp in (1, 2, 4, 8)
        if model.num_heads % tp == 0
    }


def _attention_rows(t: dict[str, Any], kv: str, heads: Set[tuple[int, int]]) -> dict[str, Any]:
    """Rows of one KV dtype whose head layout a served model runs (``heads``).

    One curve is fitted per KV dtype; the tables also time layouts no served model has
    (64 query heads on one KV head, query heads fewer than KV heads), where the kernels
    pick other code paths, and those would bend the curve away from the layouts it will
    price (on TensorRT-LLM's tables, a fifth to a third of the error)."""
    pairs = np.array(
        [
            (int(q), int(k)) in heads
            for q, k in zip(t["num_heads"], t["num_key_value_heads"], strict=True)
        ],
        dtype=bool,
    )
    return _select(t, (t["kv_cache_dtype"] == kv) & pairs)


def decode_attention_features(t: dict[str, Any], kv: str, heads: Set[tuple[int, int]]) -> Features:
    """Decode attention: b sequences of isl + step cached tokens, heads per GPU, of the
    head layouts in ``heads`` (``catalog_attention_heads``).

    bytes = b · ctx · 2 · kv_heads · 128 · KV bytes; FLOPs = 4 · heads · 128 · b · ctx;
    driver = ctx; items = b (a per-sequence cost).
    """
    t = _attention_rows(t, kv, heads)
    b, ctx = t["batch_size"], t["isl"] + t["step"]
    kv_bytes = 1.0 if kv == "fp8" else 2.0
    moved = b * ctx * 2.0 * t["num_key_value_heads"] * HEAD_DIM * kv_bytes
    flops = 4.0 * t["num_heads"] * HEAD_DIM * b * ctx
    return Features(moved, flops, ctx, b, t["latency"] * 1e-3)


def prefill_attention_features(t: dict[str, Any], kv: str, heads: Set[tuple[int, int]]) -> Features:
    """Prefill attention: b prompts of isl tokens, causal, of the head layouts in ``heads``.

    FLOPs = 4 · heads · 128 · b · isl² / 2; bytes = b · isl · (heads + 2 · kv_heads) · 128 · 2;
    driver = isl.
    """
    t = _attention_rows(t, kv, heads)
    b, isl = t["batch_size"], t["isl"]
    q_heads, kv_heads = t["num_heads"], t["num_key_value_heads"]
    moved = b * isl * (q_heads + 2.0 * kv_heads) * HEAD_DIM * 2.0
    flops = 4.0 * q_heads * HEAD_DIM * b * isl * isl / 2.0
    return Features(moved, flops, isl, np.zeros_like(b), t["latency"] * 1e-3)


def moe_features(t: dict[str, Any], dtype: str) -> Features:
    """Fused MoE: tokens routed top-k over E experts, expert MLP split over moe_tp.

    bytes = experts touched · 3 · hidden · inter/tp · weight bytes, touched =
    min(E, tokens · k) under the tables' balanced routing;
    FLOPs = 2 · tokens · k · 3 · hidden · inter/tp; driver = tokens · k / E (tokens per expert).
    """
    t = _select(t, t["moe_dtype"] == dtype)
    tokens, k, experts = t["num_tokens"], t["topk"], t["num_experts"]
    expert = 3.0 * t["hidden_size"] * t["inter_size"] / t["moe_tp_size"]
    touched = np.minimum(experts, tokens * k)  # the tables route tokens evenly (balanced)
    weight_bytes = 1.0 if dtype == "fp8" else 2.0
    flops = 2.0 * tokens * k * expert
    return Features(
        touched * expert * weight_bytes,
        flops,
        tokens * k / experts,
        np.zeros_like(tokens),
        t["latency"] * 1e-3,
    )


def fit_allreduce(t: dict[str, Any]) -> dict[int, AllReduce]:
    """Per GPU count, the measured latency by message size (bf16: 2 bytes per element).

    Kept as measured and interpolated in log-log (``kernels.AllReduce``): 23 sizes per
    count, and the latency/bandwidth switch of the custom all-reduce follows no line.
    """
    out = {}
    for count in sorted(set(t["num_gpus"].astype(int).tolist())):
        rows = t["num_gpus"] == count
        order = np.argsort(t["message_size"][rows])
        sizes = t["message_size"][rows][order] * 2.0
        seconds = t["latency"][rows][order] * 1e-3
        out[count] = AllReduce(tuple(float(v) for v in sizes), tuple(_sig(v) for v in seconds))
    return out


DTYPE_KEYS = {"bfloat16": "bf16", "fp8": "fp8"}
QUANT_KNOTS = range(0, 17, 2)  # log2 tokens


def fit_engine_curves(
    ops: Path, table_gpu: str, engine: str, catalog: Catalog
) -> KernelCurves | None:
    """All curves of one engine on one measured GPU, or None when its tables are missing."""
    folder = ops / table_gpu / engine
    if not (folder / "gemm_perf.csv.gz").is_file():
        return None
    gpu = catalog.gpus[KERNEL_TABLE_GPUS[table_gpu]]
    bw, bf16 = gpu.hbm_bytes_per_s, gpu.flops_per_s("bf16")
    gemm_table = read_table(folder / "gemm_perf.csv.gz")
    shapes = catalog_gemm_shapes(catalog)
    quant = quant_seconds(folder)
    served = served_quant_seconds(folder, engine, quant)
    gemm = {
        DTYPE_KEYS[d]: fit_curve(
            gemm_features(gemm_table, d, shapes, quant, bw),
            GEMM_KNOTS,
            bw,
            gpu.flops_per_s(DTYPE_KEYS[d]),
        )
        for d in DTYPE_KEYS
        if (gemm_table["gemm_dtype"] == d).any()
    }
    quant_curve = fit_curve(quant_features(served), QUANT_KNOTS, bw, bf16) if served else None
    as_timed = {}
    if served is not None and served is not quant:  # the GEMMs were timed behind another
        timed = gemm_features(gemm_table, "fp8", shapes)
        as_timed["fp8"] = fit_curve(timed, GEMM_KNOTS, bw, gpu.flops_per_s("fp8"))
    decode, prefill = _attention_curves(folder, bw, bf16, catalog_attention_heads(catalog))
    moe: dict[str, Curve] = {}
    if (folder / "moe_perf.csv.gz").is_file():
        moe_table = read_table(folder / "moe_perf.csv.gz")
        for d, key in DTYPE_KEYS.items():
            if (moe_table["moe_dtype"] == d).sum() > 50:
                features = moe_features(moe_table, d)
                moe[key] = fit_curve(features, range(0, 13, 2), bw, gpu.flops_per_s(key))
    allreduce = fit_allreduce(read_table(folder / "custom_allreduce_perf.csv.gz"))
    version = _version(ops, table_gpu, engine)
    return KernelCurves(
        table_gpu=table_gpu,
        engine=engine,
        engine_version=version,
        gemm=gemm,
        decode_attention=decode,
        prefill_attention=prefill,
        allreduce=allreduce,
        moe=moe,
        interconnect_bytes_per_s=gpu.interconnect_bytes_per_s,
        hbm_bytes_per_s=bw,
        flops_per_s=dict(gpu.dense_flops_per_s),
        quant=quant_curve,
        gemm_as_timed=as_timed,
    )


def _attention_curves(
    folder: Path, bw: float, peak: float, heads: Set[tuple[int, int]]
) -> tuple[dict[str, Curve], dict[str, Curve]]:
    gen = read_table(folder / "generation_attention_perf.csv.gz")
    ctx = read_table(folder / "context_attention_perf.csv.gz")
    decode, prefill = {}, {}
    for d, key in DTYPE_KEYS.items():
        if (gen["kv_cache_dtype"] == d).any():
            f = decode_attention_features(gen, d, heads)
            decode[key] = fit_curve(f, range(0, 18, 2), bw, peak, items=True)
        if (ctx["kv_cache_dtype"] == d).any():
            f = prefill_attention_features(ctx, d, heads)
            prefill[key] = fit_curve(f, range(0, 15, 2), bw, peak)
    return decode, prefill


def curve_error(curve: Curve, f: Features, bw: float, peak: float) -> float:
    """Median |predicted / measured − 1| of a stored curve over a table's rows (those a
    forward pass can see, ``from_dram``)."""
    f = from_dram(f, bw)
    predicted = curve.times_s(f.moved, f.flops, f.driver, bw, peak, f.items)
    return float(np.median(np.abs(predicted / f.seconds - 1.0)))


def stored_curve_errors(ops: Path, kc: KernelCurves) -> dict[str, tuple[Curve, float]]:
    """Each stored curve of one engine/GPU and its median error on the vendored table now."""
    catalog = load_catalog()
    gpu = catalog.gpus[KERNEL_TABLE_GPUS[kc.table_gpu]]
    bw, bf16 = gpu.hbm_bytes_per_s, gpu.flops_per_s("bf16")
    folder = ops / kc.table_gpu / kc.engine
    dtypes = {v: k for k, v in DTYPE_KEYS.items()}
    heads = catalog_attention_heads(catalog)
    quant = quant_seconds(folder)
    out: dict[str, tuple[Curve, float]] = {}
    tables: dict[
        str, tuple[str, Callable[[dict[str, Any], str], Features], Mapping[str, Curve], bool]
    ] = {
        "gemm": (
            "gemm_perf",
            partial(
                gemm_features,
                shapes=catalog_gemm_shapes(catalog),
                quant=quant,
                bw=bw,
            ),
            kc.gemm,
            True,
        ),
        "gemm_as_timed": (
            "gemm_perf",
            partial(gemm_features, shapes=catalog_gemm_shapes(catalog)),
            kc.gemm_as_timed,
            True,
        ),
        "decode_attention": (
            "generation_attention_perf",
            partial(decode_attention_features, heads=heads),
            kc.decode_attention,
            False,
        ),
        "prefill_attention": (
            "context_attention_perf",
            partial(prefill_attention_features, heads=heads),
            kc.prefill_attention,
            False,
        ),
        "moe": ("moe_perf", moe_features, kc.moe, True),
    }
    for kind, (table, features, curves, dtype_peak) in tables.items():
        if not curves:
            continue
        columns = read_table(folder / f"{table}.csv.gz")
        for key, curve in curves.items():
            peak = gpu.flops_per_s(key) if dtype_peak else bf16
            f = features(columns, dtypes[key])
            out[f"{kind}.{key}"] = (curve, curve_error(curve, f, bw, peak))
    served = served_quant_seconds(folder, kc.engine, quant)
    if kc.quant is not None and served is not None:
        out["quant.fp8"] = (kc.quant, curve_error(kc.quant, quant_features(served), bw, bf16))
    return out


def _version(ops: Path, table_gpu: str, engine: str) -> str:
    with (ops / "versions.csv").open(newline="") as handle:
        for row in csv.DictReader(handle):
            if (row["gpu"], row["engine"], row["table"]) == (table_gpu, engine, "gemm_perf"):
                return row["engine_version"]
    return "unknown"


# ---------------------------------------------------------------- engine fixed costs


@dataclass(frozen=True)
class MeasuredMetric:
    """One metric measured on one benchmark row (a row gives up to three), to fit against."""

    scenario: Scenario
    metric: str  # tpot_s | ttft_s | output_tok_s
    measured: float
    source: str


def source_of(row: dict[str, str]) -> str:
    """``nvidia-dli`` or ``argonne-<engine>``: the groups the error report is given for."""
    if "argonne" not in row["source"]:
        return "nvidia-dli"
    return "argonne-vllm" if "vllm" in row["engine"].lower() else "argonne-trtllm"


def load_measurements(path: Path, table: EfficiencyTable) -> list[MeasuredMetric]:
    """Every measured metric of every NVIDIA row we can parse, as separate measurements.

    AMD rows are left out: the kernel tables are NVIDIA-only, so MI300X borrows H100
    curves and its rows would fit the engine's fixed costs to an architecture gap. So are
    the DLI MoE rows (``_fake_moe``).
    """
    catalog = load_catalog()
    measurements: list[MeasuredMetric] = []
    with path.open(newline="") as handle:
        for row in csv.DictReader(handle):
            if "mi300" in row["gpu"].lower() or _fake_moe(row):
                continue
            try:
                scenario = scenario_from_row(with_kv_dtype_ran(row), catalog, table)
            except ScenarioError:
                continue
            if source_of(row) == "nvidia-dli":
                scenario = with_fp8_as_timed(scenario)
            measurements += _row_measurements(row, scenario)
    return measurements


def with_fp8_as_timed(scenario: Scenario) -> Scenario:
    """The DLI rows ran TensorRT-LLM 0.9's TensorRT engines, whose fp8 fusions the source
    that the current fusion rules were read from does not describe: their fp8 GEMMs are
    priced as the kernel tables timed them, each behind a dynamic quant of its own input
    (``Efficiency.fp8_as_timed``), and the engine costs fitted on them are not bent by
    fusions those engines may not have made."""
    dep = scenario.deployment
    eff = replace(dep.efficiency, fp8_as_timed=True)
    return replace(scenario, deployment=replace(dep, efficiency=eff))


def with_kv_dtype_ran(row: dict[str, str]) -> dict[str, str]:
    """The row with the KV-cache dtype its run used where the source does not state it.

    The DLI set's fp8 rows ran an fp8 KV cache: their peak memory grows by the fp8 cache's
    bytes per token, half the 16-bit cache's (Llama-2-7B at 128/4,096 tokens: 266 KB
    per token, against 262 KB in fp8 and 524 KB in 16 bits; its fp16 rows grow by 527 KB;
    ``tests/unit/planner/test_dli_kv_dtype.py`` derives it for every group of rows). Read as
    a 16-bit cache, the decode attention of those rows was priced at twice the bytes it
    read. Its 16-bit rows ran a 16-bit cache, which is what an unstated dtype means
    anyway (``normalize_dtype``).
    """
    unstated = normalize_dtype(row.get("kv_dtype") or "", "kv_dtype", kv=True) == "auto"
    weights = row.get("weight_dtype") or ""
    fp8_weights = (
        normalize_dtype(weights, "weight_dtype", model_name=row.get("model") or "") == "fp8"
    )
    if source_of(row) == "nvidia-dli" and unstated and fp8_weights:
        return {**row, "kv_dtype": "fp8 (the run's peak memory grows by fp8 KV bytes)"}
    return row


def _fake_moe(row: dict[str, str]) -> bool:
    """DLI's Mixtral rows: run on fake weights, whose router sends every token to the
    same experts, so they time faster than any real routing can (below the floor of
    reading the experts that random routing touches)."""
    return "mixtral" in row["model"].lower() and source_of(row) == "nvidia-dli"


def _row_measurements(row: dict[str, str], scenario: Scenario) -> list[MeasuredMetric]:
    source = source_of(row)
    out = []
    for column, metric, scale in (
        ("tpot_ms", "tpot_s", 1e-3),
        ("ttft_ms", "ttft_s", 1e-3),
        ("output_tok_s_total", "output_tok_s", 1.0),
    ):
        # DLI rows give TPOT and TTFT; their tok/s is derived from the same two.
        if row.get(column) and not (source == "nvidia-dli" and metric == "output_tok_s"):
            out.append(MeasuredMetric(scenario, metric, float(row[column]) * scale, source))
    return out


def log_error(measurement: MeasuredMetric, overhead: EngineOverhead) -> float:
    scenario = measurement.scenario
    eff = replace(scenario.deployment.efficiency, overhead=overhead)
    prediction = replace(scenario, deployment=replace(scenario.deployment, efficiency=eff))
    value: float = getattr(prediction.predict(check_context=False), measurement.metric)
    if not math.isfinite(value) or value <= 0:
        return 3.0  # a row we claim does not fit but was measured: a large, bounded penalty
    return math.log(value / measurement.measured)


def fit_overhead(
    measurements: Sequence[MeasuredMetric], elementwise: bool = True
) -> EngineOverhead:
    """Per-step and per-layer costs (fitted in ms and µs) and the elementwise kernels'
    share of HBM bandwidth (fitted as its inverse, so that 0 means free), minimising the
    log error of these rows. ``elementwise=False`` leaves the elementwise kernels out
    (their share 0), to see what the term buys."""
    from scipy.optimize import least_squares

    def overhead_of(p: Array) -> EngineOverhead:
        inverse = p[2] if elementwise else 0.0
        return EngineOverhead(p[0] * 1e-3, p[1] * 1e-6, elementwise_mem_eff=_eff(inverse))

    def residuals(p: Array) -> Array:
        return np.array([log_error(o, overhead_of(p)) for o in measurements])

    low_eff, high_eff = OVERHEAD_BOUNDS["elementwise_mem_eff"]
    upper = [OVERHEAD_BOUNDS["step_s"][1] * 1e3, OVERHEAD_BOUNDS["layer_s"][1] * 1e6, 1 / low_eff]
    # no kernel moves bytes faster than the GPU's peak: the share is at most high_eff
    lower = [0.0, 0.0, 1 / high_eff]
    n = 3 if elementwise else 2
    r = least_squares(
        residuals,
        [1.0, 10.0, 1.0][:n],
        bounds=(lower[:n], upper[:n]),
        loss="soft_l1",
        f_scale=0.2,
    )
    fitted = overhead_of(r.x)
    return EngineOverhead(
        _sig(fitted.step_s),
        _sig(fitted.layer_s),
        elementwise_mem_eff=_sig(fitted.elementwise_mem_eff),
    )


def _eff(inverse: float) -> float:
    """The share of bandwidth from its fitted inverse (0 when the inverse is 0: free)."""
    return 1.0 / inverse if inverse > 0 else 0.0


def signed_errors(
    measurements: Sequence[MeasuredMetric], overhead_of: Callable[[str], EngineOverhead]
) -> list[float]:
    """predicted / measured − 1 of every measurement, with its engine's costs (one
    prediction each: ``overhead_errors`` and ``bias_by_batch`` both summarise these)."""
    return [math.exp(log_error(o, overhead_of(o.scenario.engine))) - 1.0 for o in measurements]


def overhead_errors(
    measurements: Sequence[MeasuredMetric], errors: Sequence[float]
) -> dict[str, dict[str, float]]:
    """Median and p90 |error| per source and metric (``errors``: ``signed_errors``)."""
    groups: dict[str, list[float]] = defaultdict(list)
    for o, error in zip(measurements, errors, strict=True):
        groups[f"{o.source}:{o.metric}"].append(abs(error))
    return {
        key: {
            "rows": len(v),
            "median_error": round(statistics.median(v), 4),
            "p90_error": round(float(np.percentile(v, 90)), 4),
        }
        for key, v in sorted(groups.items())
    }


BATCH_BANDS = ((1, "1"), (16, "2-16"), (64, "17-64"), (256, "65-256"), (math.inf, ">256"))


def batch_band(batch: float) -> str:
    """The band of batch sizes (or concurrencies) a row falls in: 1, 2-16, ..., >256."""
    return next(name for top, name in BATCH_BANDS if batch <= top)


def bias_by_batch(
    measurements: Sequence[MeasuredMetric], errors: Sequence[float]
) -> dict[str, dict[str, float]]:
    """Median signed error (``errors``: ``signed_errors``) per step-timing metric and
    batch band: whether the model is right in slope over batch size, not only in level."""
    groups: dict[str, dict[str, list[float]]] = defaultdict(lambda: defaultdict(list))
    for o, error in zip(measurements, errors, strict=True):
        if o.metric == "output_tok_s":
            continue
        batch = o.scenario.batch or o.scenario.concurrency or 1
        groups[f"{o.source}:{o.metric}"][batch_band(batch)].append(error)
    return {
        key: {
            band: round(statistics.median(bands[band]), 4)
            for _, band in BATCH_BANDS
            if bands.get(band)
        }
        for key, bands in sorted(groups.items())
    }


# ---------------------------------------------------------------- the whole fit


def fit_all(
    ops: Path, data: Path, progress: Progress | None = None, elementwise: bool = True
) -> dict[str, Any]:
    """The document ``--write`` stores: curves, engine overheads, and their errors.
    ``progress``: where each fitted table is reported as it is done (on a terminal);
    ``elementwise``: whether the engine costs include the elementwise kernels."""
    progress = progress or Progress()
    curves = fit_every_engine(ops, load_catalog(), progress)
    doc: dict[str, Any] = {"curves": [curves_to_mapping(kc) for kc in curves]}
    table = table_from_mapping(doc)
    progress.status(f"calibrate: reading {data.name}", force=True)
    measurements = load_measurements(data, table)
    progress.status(
        f"calibrate: fitting the engines' fixed costs on {len(measurements)} measurements",
        force=True,
    )
    overheads = _fit_overheads(measurements, elementwise)
    base = overheads["trtllm"]
    progress.line(
        f"calibrate: engine costs: {base.step_s * 1e3:.3f} ms per step, "
        f"{base.layer_s * 1e6:.1f} us per layer, elementwise kernels at "
        f"{base.elementwise_mem_eff:.0%} of HBM bandwidth"
    )
    doc["engine_overhead"] = {
        e: {
            "step_s": o.step_s,
            "layer_s": o.layer_s,
            "elementwise_mem_eff": o.elementwise_mem_eff,
            "fitted_on": o.fitted_on,
        }
        for e, o in overheads.items()
    }
    errors = signed_errors(measurements, lambda e: overheads[e])
    doc["calibration_error"] = overhead_errors(measurements, errors)
    doc["calibration_bias_by_batch"] = bias_by_batch(measurements, errors)
    return doc


def fit_every_engine(ops: Path, catalog: Catalog, progress: Progress) -> list[KernelCurves]:
    """The curves of every measured GPU and engine, one ``progress`` line per table."""
    curves = []
    for table_gpu in sorted(KERNEL_TABLE_GPUS):
        for engine in FIT_ENGINES:
            progress.status(f"calibrate: fitting {table_gpu}/{engine}", force=True)
            kc = fit_engine_curves(ops, table_gpu, engine, catalog)
            if kc is not None:
                curves.append(kc)
                for line in curve_lines(kc):
                    progress.line(line)
    progress.clear()
    return curves


def curve_lines(kc: KernelCurves) -> list[str]:
    """One line per fitted table of an engine/GPU: its rows and median error."""
    kinds = {
        "gemm": kc.gemm,
        "decode_attention": kc.decode_attention,
        "prefill_attention": kc.prefill_attention,
        "moe": kc.moe,
        "quant": {"fp8": kc.quant} if kc.quant else {},
        "gemm_as_timed": kc.gemm_as_timed,
    }
    return [
        f"calibrate: {kc.table_gpu}/{kc.engine} {kind}.{dtype}: {c.rows} rows, "
        f"median |error| {c.median_error:.1%}"
        for kind, fitted in kinds.items()
        for dtype, c in fitted.items()
    ]


def _fit_overheads(
    measurements: Sequence[MeasuredMetric], elementwise: bool = True
) -> dict[str, EngineOverhead]:
    """Fitted on the rows that time engine steps: the DLI set's TPOT and TTFT.

    Those are TensorRT-LLM's. The other engines borrow it: calibration.csv has no step
    times of theirs, only Argonne's 2024 end-to-end batch latencies (output tokens/s, with
    the harness around the engine inside), which the report keeps as a held-out check.
    """
    rows = [o for o in measurements if o.source == "nvidia-dli"]
    base = replace(
        fit_overhead(rows, elementwise), fitted_on="calibration.csv nvidia-dli TPOT/TTFT rows"
    )
    fitted = {"trtllm": base}
    for engine in ("vllm", "sglang", "nim"):
        fitted[engine] = replace(base, fitted_on="borrowed from trtllm (no step-time rows)")
    return fitted


def curves_to_mapping(kc: KernelCurves) -> dict[str, Any]:
    def curve(c: Curve) -> dict[str, Any]:
        return {
            "t0_s": c.t0_s,
            "item_s": c.item_s,
            "knots": list(c.knots),
            "mem_eff": list(c.mem_eff),
            "flop_eff": list(c.flop_eff),
            "median_error": c.median_error,
            "rows": c.rows,
        }

    return {
        "table_gpu": kc.table_gpu,
        "engine": kc.engine,
        "engine_version": kc.engine_version,
        "interconnect_bytes_per_s": kc.interconnect_bytes_per_s,
        "hbm_bytes_per_s": kc.hbm_bytes_per_s,
        "dense_flops_per_s": dict(kc.flops_per_s),
        "gemm": {k: curve(c) for k, c in kc.gemm.items()},
        "decode_attention": {k: curve(c) for k, c in kc.decode_attention.items()},
        "prefill_attention": {k: curve(c) for k, c in kc.prefill_attention.items()},
        "moe": {k: curve(c) for k, c in kc.moe.items()},
        **({"quant": curve(kc.quant)} if kc.quant else {}),
        **(
            {"gemm_as_timed": {k: curve(c) for k, c in kc.gemm_as_timed.items()}}
            if kc.gemm_as_timed
            else {}
        ),
        "allreduce": {
            str(n): {"message_bytes": list(a.message_bytes), "seconds": list(a.seconds)}
            for n, a in kc.allreduce.items()
        },
    }


def report(doc: dict[str, Any]) -> str:
    """The fit error of every op table and of every calibration source, as a table."""
    lines = [f"{'op table':<44} {'rows':>6} {'median |err| %':>15}"]
    for kc in doc["curves"]:
        prefix = f"{kc['table_gpu']}/{kc['engine']} {kc['engine_version']}"
        for kind in ("gemm", "decode_attention", "prefill_attention", "moe"):
            for dtype, c in kc[kind].items():
                name = f"{prefix} {kind}.{dtype}"
                lines.append(f"{name:<44} {c['rows']:>6} {c['median_error'] * 100:>15.1f}")
        if "quant" in kc:
            c = kc["quant"]
            name = f"{prefix} quant.fp8"
            lines.append(f"{name:<44} {c['rows']:>6} {c['median_error'] * 100:>15.1f}")
        for dtype, c in kc.get("gemm_as_timed", {}).items():
            name = f"{prefix} gemm_as_timed.{dtype}"
            lines.append(f"{name:<44} {c['rows']:>6} {c['median_error'] * 100:>15.1f}")
        for count, a in kc["allreduce"].items():
            name = f"{prefix} allreduce.tp{count} (as measured)"
            lines.append(f"{name:<44} {len(a['seconds']):>6} {0.0:>15.1f}")
    lines.append("")
    lines.append(
        f"{'engine':<8} {'step overhead ms':>17} {'per layer us':>13} "
        f"{'elementwise % of BW':>20}  fitted on"
    )
    for engine, o in doc["engine_overhead"].items():
        step, layer = o["step_s"] * 1e3, o["layer_s"] * 1e6
        share = o.get("elementwise_mem_eff", 0.0) * 100
        lines.append(f"{engine:<8} {step:>17.3f} {layer:>13.1f} {share:>20.1f}  {o['fitted_on']}")
    lines.append("")
    lines.append(f"{'calibration.csv source:metric':<34} {'rows':>5} {'median %':>9} {'p90 %':>7}")
    for key, e in doc["calibration_error"].items():
        median, p90 = e["median_error"] * 100, e["p90_error"] * 100
        lines.append(f"{key:<34} {e['rows']:>5} {median:>9.1f} {p90:>7.1f}")
    bias = doc.get("calibration_bias_by_batch") or {}
    if bias:
        lines.append("")
        lines.append("median signed error % (+: predicted slower) by batch")
        lines.append(f"{'source:metric':<34}" + "".join(f"{band:>9}" for _, band in BATCH_BANDS))
        for key, bands in bias.items():
            cells = "".join(
                f"{bands[b] * 100:>+9.1f}" if b in bands else f"{'':>9}" for _, b in BATCH_BANDS
            )
            lines.append(f"{key:<34}{cells}")
    return "\n".join(lines)


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m rooftop_fit.kernel_fit")
    parser.add_argument("--ops", type=Path, default=DEFAULT_OPS, help="kernel tables folder")
    parser.add_argument("--data", type=Path, default=DEFAULT_DATA, help="calibration.csv")
    parser.add_argument("--write", action="store_true", help="store the fit in the catalog")
    parser.add_argument(
        "--stored", action="store_true", help="print the stored fit's errors; fit nothing"
    )
    parser.add_argument(
        "--no-elementwise",
        action="store_true",
        help="leave the elementwise kernels out of the engine costs (to see what they buy)",
    )
    args = parser.parse_args(argv)
    if args.stored:
        print(report(json.loads(OUTPUT.read_text())))
        return exit_codes.OK
    for flag, path in (("--ops", args.ops / "versions.csv"), ("--data", args.data)):
        if not path.is_file():
            print(f"{flag}: {path} not found", file=sys.stderr)
            return exit_codes.BAD_INPUT
    doc = fit_all(args.ops, args.data, elementwise=not args.no_elementwise)
    print(report(doc))
    if args.write:
        OUTPUT.write_text(json.dumps(doc, indent=1) + "\n")
        print(f"wrote {OUTPUT}")
    return exit_codes.OK


if __name__ == "__main__":
    sys.exit(main())

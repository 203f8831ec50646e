"""Measured kernel latency tables, and interpolation in them: the engine truth's parts.

The tables are NVIDIA aiconfigurator's per-kernel timings measured inside vLLM on real
GPUs (github.com/ai-dynamo/aiconfigurator, Apache-2.0; vendored under ``data/ops`` with
their provenance). ``truth_tables.json.gz`` next to this module carries the rows the
catalog's models need (``truth_fit.py`` cuts it), so the engine simulator runs without the
repository. Latencies are milliseconds per call on one GPU, as measured.

Interpolation is direct, in each table's own grid, never through a fitted curve:

- between grid points: linear in (log size, log latency), i.e. a power law through the two
  neighbours on each axis, blended axis by axis (multilinear in the logs);
- above a table's largest size: the last measured point scaled by the work,
  ``latency = y_max * (x / x_max) ** power`` (power 1 for sizes that scale the work
  linearly, 2 for a prompt's length under causal attention): linear in bytes or FLOPs;
- below its smallest size: the smallest size's latency (a kernel is launch-bound there).

``Roofline`` then makes each interpolated time physical and carries it to the GPU asked for:
no kernel runs faster than its FLOPs at peak or its bytes at the rate its table streams
operands too large for any cache (on the L40S a fifth of the few-token calls beat that,
their operands left in L2 by the benchmark's repeated calls), and a GPU without tables
borrows another's, scaled by the ratio of the two GPUs' roofline times for the same work
(bandwidth ratio when memory-bound, peak-FLOPs ratio when compute-bound), except for
the kernel's launch latency, which is the host's and the driver's, not the memory's: the
quickest call a table measured carries over unscaled, as the smallest message's latency
does for all-reduce, whose bandwidth part is rescaled to the GPU's own links
(``allreduce_curve``).
"""

from __future__ import annotations

import bisect
import gzip
import itertools
import json
import math
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, replace
from functools import cached_property, lru_cache
from pathlib import Path
from typing import Any

import numpy as np
import numpy.typing as npt

from rooftop_planner.catalog import KERNEL_TABLE_GPUS, SUSTAINED_FLOP_FRACTION, GpuSpec

FloatArray = npt.NDArray[np.float64]
TABLES_PATH = Path(__file__).with_name("truth_tables.json.gz")
HEAD_DIM = 128  # the attention tables' head size (every model in the catalog)
ACT_BYTES = 2.0  # activations and all-reduce messages are bf16

# Measured table -> the catalog GPU it was measured on (whose specs scale a borrow); each
# catalog GPU names its table (GpuSpec.kernel_table), as the planner reads it too.
TABLE_GPU: Mapping[str, str] = KERNEL_TABLE_GPUS


def table_for(gpu: GpuSpec) -> str:
    """The measured table a catalog GPU uses: its own, or the one it borrows."""
    return gpu.kernel_table


# --------------------------------------------------------------------------------------
# Interpolation primitives
# --------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Bracket:
    """Where ``x`` falls on a grid: the neighbouring grid indices with log-linear weights
    (summing to 1), and the factor an extrapolation multiplies by (1 inside the grid)."""

    points: tuple[tuple[int, float], ...]
    factor: float


def bracket(
    grid: Sequence[float], x: float, power: float = 1.0, scale_below: bool = False
) -> Bracket:
    """Bracket ``x`` on an increasing ``grid``.

    Inside: neighbours ``i, i+1`` with weights ``1-w, w``, ``w = log(x/g_i) / log(g_i+1/g_i)``.
    Above: the last point with factor ``(x / g_max) ** power``. Below: the first point, with
    factor 1, or ``(x / g_min) ** power`` when ``scale_below`` (a fraction of the smallest
    measured work, e.g. part of one prompt).
    """
    last = len(grid) - 1
    if x >= grid[last]:
        return Bracket(((last, 1.0),), math.pow(x / grid[last], power))
    if x <= grid[0]:
        return Bracket(((0, 1.0),), math.pow(x / grid[0], power) if scale_below else 1.0)
    j = bisect.bisect_right(grid, x)
    lo, hi = grid[j - 1], grid[j]
    if x == lo:
        return Bracket(((j - 1, 1.0),), 1.0)
    w = math.log(x / lo) / math.log(hi / lo)
    return Bracket(((j - 1, 1.0 - w), (j, w)), 1.0)


def blend(
    brackets: Sequence[Bracket], value: Callable[[tuple[int, ...]], FloatArray | None]
) -> FloatArray | None:
    """Multilinear interpolation in log latency over several axes, times the extrapolation
    factors: ``exp(sum_corners weight * log value) * prod(factor)``. None if a corner is
    missing (not in the packaged table); NaN where a corner was not measured."""
    total: FloatArray | None = None
    for corner in itertools.product(*(b.points for b in brackets)):
        v = value(tuple(i for i, _ in corner))
        if v is None:
            return None
        term = math.prod(w for _, w in corner) * np.log(v)
        total = term if total is None else total + term
    assert total is not None
    return np.asarray(np.exp(total) * math.prod(b.factor for b in brackets))


class LatencyCurve:
    """Latency (ms) against one size, log-log interpolated between measured points.

    Unmeasured (NaN) points are skipped; above the last measured point the latency grows
    as ``size ** power``; below the first it is clamped (or scaled, ``scale_below``).
    """

    def __init__(
        self,
        xs: Iterable[float],
        ys: Iterable[float],
        power: float = 1.0,
        scale_below: bool = False,
    ) -> None:
        keep = [(float(x), float(y)) for x, y in zip(xs, ys, strict=True) if y > 0]  # NaN fails
        if not keep:
            raise ValueError("a kernel curve needs at least one measured point")
        self.xs = [x for x, _ in keep]
        self.ys = [y for _, y in keep]
        self._lx = [math.log(x) for x in self.xs]
        self._ly = [math.log(y) for y in self.ys]
        self.power = power
        self.scale_below = scale_below

    def __call__(self, x: float) -> float:
        xs, last = self.xs, len(self.xs) - 1
        if x >= xs[last]:
            return self.ys[last] * math.pow(x / xs[last], self.power)
        if x <= xs[0]:
            return self.ys[0] * (math.pow(x / xs[0], self.power) if self.scale_below else 1.0)
        j = bisect.bisect_right(xs, x)
        lx, ly = self._lx, self._ly
        w = (math.log(x) - lx[j - 1]) / (lx[j] - lx[j - 1])
        return math.exp(ly[j - 1] + w * (ly[j] - ly[j - 1]))


class Grid:
    """Latency (ms) against (batch, tokens): one ``LatencyCurve`` over tokens per measured batch
    size, log-log interpolated across batch sizes.

    A row's curve extends past its own last measured point (the tables stop where the
    GPU's memory ran out) proportionally to the work, ``tokens ** token_power``. Never
    below the fastest measured call (a kernel launch), even for a fraction of a batch.
    """

    def __init__(
        self,
        batch: Sequence[float],
        tokens: Sequence[float],
        values: FloatArray,
        token_power: float = 1.0,
        scale_below_batch: bool = False,
    ) -> None:
        rows = [(b, row) for b, row in zip(batch, values, strict=True) if np.any(row > 0)]
        self.batch = [float(b) for b, _ in rows]
        self.rows = [LatencyCurve(tokens, row, token_power) for _, row in rows]
        self.floor = float(np.nanmin(values))
        self.scale_below_batch = scale_below_batch

    def __call__(self, batch: float, tokens: float) -> float:
        br = bracket(self.batch, batch, 1.0, self.scale_below_batch)
        log_ms = sum(w * math.log(self.rows[i](tokens)) for i, w in br.points)
        return max(self.floor, math.exp(log_ms) * br.factor)


# --------------------------------------------------------------------------------------
# The roofline: a physical floor, and borrowing another GPU's tables
# --------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Roofline:
    """Kernel times measured on ``src``, made physical and carried over to ``dst``.

    Floor: no kernel beats its roofline, ``max(B / bw, F / (peak · s))`` for B bytes it
    must move and F FLOPs, on the GPU that measured it, where ``bw`` is the lower of the
    GPU's DRAM bandwidth and the fastest its table ever streams operands too large for any
    cache (``cold_rate``). Some L40S entries beat that by up to 3x: the timing
    tool calls one kernel on the same small operands again and again, so they stay in
    the L2 cache. A real model streams different weights every layer, so those entries
    are lifted to the floor, the speed the table shows for operands that come from DRAM.
    ``s`` is the share of peak FLOP/s a GPU sustains through whole forward passes, as
    measured on an H100 and an H200 (``catalog.SUSTAINED_FLOP_FRACTION``): the tables
    time one kernel at a time, and their largest GEMMs run faster than a forward pass of
    them back to back.

    Borrowing (``dst`` is another GPU): a kernel's launch latency carries over as it is,
    the rest of its time scales by ``roofline_dst / roofline_src``, the bandwidth ratio
    for a memory-bound kernel, the peak-FLOPs ratio for a compute-bound one (its
    efficiency carries over):

        t_dst = L + (t_src − L) · roofline_dst / roofline_src,  L = min(launch, t_src)

    Scaling L too would price a one-sequence decode attention on an L4 (11 µs a layer on
    the L40S, all launch: its KV read takes a microsecond) at 2.9x, the two GPUs'
    bandwidth ratio, as if launching a kernel waited on HBM.
    """

    src: GpuSpec
    dst: GpuSpec

    @staticmethod
    def time_ms(
        gpu: GpuSpec,
        nbytes: FloatArray,
        flops: FloatArray,
        compute: str,
        cap_bytes_per_s: float = math.inf,
        flop_fraction: float = 1.0,
    ) -> FloatArray:
        """Roofline time (ms) of B bytes and F FLOPs on ``gpu`` at its peaks, the bytes
        moving at no more than ``cap_bytes_per_s``, the FLOPs at ``flop_fraction`` of
        peak."""
        bw = min(gpu.hbm_bytes_per_s, cap_bytes_per_s)
        t = np.maximum(nbytes / bw, flops / (gpu.flops_per_s(compute) * flop_fraction))
        return np.asarray(t * 1e3)

    def apply(
        self,
        ms: FloatArray,
        nbytes: FloatArray,
        flops: FloatArray,
        compute: str = "bf16",
        launch_ms: float = 0.0,
        cold_bytes_per_s: float = math.inf,
    ) -> FloatArray:
        """Measured ``ms`` (NaN: unmeasured) floored at src's roofline, carried to dst;
        ``launch_ms``: the table's launch latency (its quickest call), kept as measured;
        ``cold_bytes_per_s``: the table's fastest stream from DRAM (``cold_rate``)."""
        floor = self.time_ms(
            self.src,
            nbytes,
            flops,
            compute,
            cold_bytes_per_s,
            SUSTAINED_FLOP_FRACTION.get(compute, 1.0),
        )
        out = np.maximum(ms, floor)  # NaN stays NaN
        if self.src.id == self.dst.id:
            return out
        fixed = np.minimum(launch_ms, out)
        src = self.time_ms(self.src, nbytes, flops, compute)
        dst = self.time_ms(self.dst, nbytes, flops, compute)
        return np.asarray(fixed + (out - fixed) * dst / src)


# A call moving this many bytes streams them from DRAM: the tables show no cache effect
# this large (on the L40S, calls under about 32 MB reach up to 3x its DRAM bandwidth,
# larger ones level off below 0.9x).
COLD_BYTES = 256e6
# Fewer tokens than this leave a GEMM or fused MoE memory-bound on every GPU here: at most
# 2 * 16 FLOPs per fp8 weight byte, against ridge points above 150.
MEMORY_BOUND_TOKENS = 16
COLD_KEY = "cold_bytes_per_s"  # a packaged table's stored ``cold_rate``


def cold_rate(ms: FloatArray, nbytes: FloatArray) -> float:
    """The fastest rate (bytes/s) at which memory-bound calls moving at least
    ``COLD_BYTES`` streamed their operands, ``max(B / t)``: no call of the same kernel
    reads DRAM faster. Infinite (no cap) where the table has no such call.

    ``ms`` and ``nbytes`` are matching arrays of memory-bound calls (NaN: unmeasured).
    """
    cold = np.isfinite(ms) & (nbytes >= COLD_BYTES) & (ms > 0)
    if not cold.any():
        return math.inf
    return float(np.max(nbytes[cold] / (ms[cold] * 1e-3)))


def stored_cold_rate(
    d: Mapping[str, Any], calls: Callable[[], tuple[FloatArray, FloatArray]]
) -> float:
    """A table document's cold rate: the one the packaging cut stored (computed on every
    measured row, so cutting rows cannot change it), else ``cold_rate`` of ``calls()``,
    the (ms, bytes) of the memory-bound calls the document holds."""
    stored = d.get(COLD_KEY)
    return float(stored) if stored is not None else cold_rate(*calls())


def quickest_ms(rows: Iterable[FloatArray]) -> float:
    """The smallest latency (ms) measured in a table's rows (NaN: unmeasured): a call
    that small is all launch, the latency a borrowing GPU keeps (``Roofline``)."""
    values = np.concatenate([np.ravel(row) for row in rows] or [np.zeros(0)])
    measured = values[np.isfinite(values) & (values > 0)]
    return float(measured.min()) if measured.size else 0.0


def _compute_dtype(table_dtype: str) -> str:
    return "fp8" if table_dtype == "fp8" else "bf16"


def _dtype_bytes(table_dtype: str) -> float:
    return 1.0 if table_dtype == "fp8" else 2.0


def _decode_bytes(
    b: FloatArray, t: FloatArray, kv: float, head_dim: float, kv_dtype: str
) -> FloatArray:
    """Decode attention's bytes: K and V of every cached token of every sequence, for
    ``b`` sequences of ``t`` tokens and ``kv`` KV heads."""
    return np.asarray(2.0 * b * t * kv * head_dim * _dtype_bytes(kv_dtype))


# --------------------------------------------------------------------------------------
# The tables
# --------------------------------------------------------------------------------------


def _array(row: Sequence[float | None]) -> FloatArray:
    """A JSON row (None: not measured) as floats with NaN."""
    return np.array([math.nan if v is None else v for v in row], dtype=np.float64)


def _grid(rows: Sequence[Sequence[float | None]]) -> FloatArray:
    """A JSON grid (None: not measured) as a 2-D float array with NaN."""
    return np.array([_array(row) for row in rows])


def _log_distance(a: Sequence[float], b: Sequence[float]) -> float:
    return sum(math.log(x / y) ** 2 for x, y in zip(a, b, strict=True))


def _nearest(keys: Sequence[str], want: Sequence[float]) -> tuple[str, list[float]]:
    """The packaged key nearest to ``want`` in log space (for shapes the catalog lacks)."""
    parsed = [(k, [float(v) for v in k.split(",")]) for k in keys]
    return min(parsed, key=lambda kv: (_log_distance(kv[1], want), kv[0]))


@dataclass(frozen=True)
class GemmTable:
    """``gemm_perf`` for one dtype: latency (ms) over m for each packaged (n, k).

    ``n`` and ``k`` are the full measured grids (so brackets match the raw table); ``rows``
    holds only the packaged ``"n,k"`` pairs, each a list over ``m``.
    """

    m: tuple[float, ...]
    n: tuple[float, ...]
    k: tuple[float, ...]
    rows: Mapping[str, list[float | None]]
    cold_bytes_per_s: float = math.inf  # ``cold_rate`` of its few-token calls

    @classmethod
    def from_doc(cls, d: Mapping[str, Any], dtype: str) -> GemmTable:
        """``dtype``: the table's weight dtype (its key in the document)."""
        table = cls(tuple(d["m"]), tuple(d["n"]), tuple(d["k"]), d["rows"])
        return replace(
            table, cold_bytes_per_s=stored_cold_rate(d, lambda: table.memory_bound_calls(dtype))
        )

    def _row(self, n: float, k: float) -> FloatArray | None:
        row = self.rows.get(f"{int(n)},{int(k)}")
        return None if row is None else _array(row)

    def latencies(self, n: float, k: float) -> FloatArray:
        """Latency (ms) at each grid m for an [m, k] x [k, n] GEMM: interpolated in log n and
        log k between the four neighbouring measured (n, k), linear in FLOPs beyond the grid.
        A shape whose neighbours were not packaged (a model outside the catalog) takes the
        nearest packaged (n0, k0) scaled by n*k / (n0*k0)."""
        brackets = (bracket(self.n, n), bracket(self.k, k))
        out = blend(brackets, lambda ij: self._row(self.n[ij[0]], self.k[ij[1]]))
        if out is not None:
            return out
        key, (n0, k0) = _nearest(sorted(self.rows), (n, k))
        return _array(self.rows[key]) * (n * k / (n0 * k0))

    def curve(
        self, n: float, k: float, dtype: str, roof: Roofline, less: FloatArray | None = None
    ) -> LatencyCurve:
        """Latency (ms) against m for this (n, k); ``dtype`` is the table's (weight bytes).
        ``less``: ms at each grid m the measured calls spent on something vLLM runs
        elsewhere (the fp8 input's quantization, where it is fused into the kernel before
        the GEMM), taken off before the roofline floor."""
        m = np.array(self.m)
        nbytes, flops = self._bytes(m, n, k, dtype), 2.0 * m * n * k
        measured = self.latencies(n, k)
        if less is not None:
            measured = np.maximum(measured - less, 0.0)
        ms = roof.apply(
            measured,
            nbytes,
            flops,
            _compute_dtype(dtype),
            self.launch_ms,
            self.cold_bytes_per_s,
        )
        return LatencyCurve(self.m, ms)

    @staticmethod
    def _bytes(m: FloatArray, n: float, k: float, dtype: str) -> FloatArray:
        """Activations in and out (bf16) and the weight (``dtype``)."""
        return np.asarray((m * k + m * n) * ACT_BYTES + n * k * _dtype_bytes(dtype))

    @cached_property
    def launch_ms(self) -> float:
        """The table's quickest call (ms), once per table (``quickest_ms``)."""
        return quickest_ms(_array(row) for row in self.rows.values())

    def memory_bound_calls(self, dtype: str) -> tuple[FloatArray, FloatArray]:
        """The calls of few tokens (``MEMORY_BOUND_TOKENS``); ``dtype``: weight bytes."""
        m = np.array(self.m)
        few = m <= MEMORY_BOUND_TOKENS
        ms, nbytes = [], []
        for key, row in self.rows.items():
            n, k = (float(v) for v in key.split(","))
            ms.append(_array(row)[few])
            nbytes.append(self._bytes(m[few], n, k, dtype))
        return np.concatenate(ms), np.concatenate(nbytes)


@dataclass(frozen=True)
class AttentionTable:
    """Decode or prefill attention for one KV dtype: latency (ms) over (batch, tokens) for
    each packaged (query heads, KV heads) per GPU, head size 128.

    tokens: decode, the cached tokens each sequence attends to (the table's isl + step);
    prefill, the prompt length (no cached prefix). ``heads`` maps each measured KV-head
    count to the query-head counts measured with it (the full grid).
    """

    batch: tuple[float, ...]
    tokens: tuple[float, ...]
    heads: Mapping[str, list[int]]
    rows: Mapping[str, list[list[float | None]]]
    cold_bytes_per_s: float = math.inf  # decode: ``cold_rate`` of its calls; prefill: none

    @classmethod
    def from_doc(cls, d: Mapping[str, Any], dtype: str, decode: bool) -> AttentionTable:
        """``dtype``: the table's KV dtype (its key in the document); prefill attention
        is compute-bound, so only decode tables get a DRAM cap."""
        table = cls(tuple(d["batch"]), tuple(d["tokens"]), d["heads"], d["rows"])
        if not decode:
            return table
        return replace(
            table, cold_bytes_per_s=stored_cold_rate(d, lambda: table.memory_bound_calls(dtype))
        )

    def _row(self, h: int, kv: int) -> FloatArray | None:
        row = self.rows.get(f"{h},{kv}")
        return None if row is None else _grid(row)

    @cached_property
    def launch_ms(self) -> float:
        """The table's quickest call (ms), once per table (``quickest_ms``)."""
        return quickest_ms(_grid(row) for row in self.rows.values())

    def latencies(self, h: float, kv: float, decode: bool) -> FloatArray:
        """Latency grid [batch, tokens] (ms) for ``h`` query and ``kv`` KV heads per GPU.

        Interpolated in log KV heads at a constant group size ``h/kv`` (query heads
        ``h * kv_i / kv`` at each neighbour ``kv_i``), then in log query heads; beyond the
        grid linear in the heads. Unpackaged heads take the nearest packaged pair scaled by
        the work: KV heads for decode (it streams the KV cache), query heads for prefill.
        """
        kvs = sorted(int(k) for k in self.heads)
        kb = bracket(kvs, kv)
        out = blend([kb], lambda i: self._at_kv(h * kvs[i[0]] / kv, kvs[i[0]]))
        return self._nearest(h, kv, decode) if out is None else out

    def _at_kv(self, h: float, kv: int) -> FloatArray | None:
        """Interpolated in log query heads among those measured with ``kv`` KV heads."""
        hs = self.heads[str(kv)]
        return blend([bracket(hs, h)], lambda j: self._row(hs[j[0]], kv))

    def _nearest(self, h: float, kv: float, decode: bool) -> FloatArray:
        key, (h0, kv0) = _nearest(sorted(self.rows), (h, kv))
        grid = np.array([_array(r) for r in self.rows[key]])
        return grid * (kv / kv0 if decode else h / h0)

    def grid(
        self, h: float, kv: float, head_dim: int, dtype: str, decode: bool, roof: Roofline
    ) -> Grid:
        """A ``Grid`` for this head configuration; ``dtype`` is the table's KV dtype.

        Other head sizes scale linearly from 128 (bytes and FLOPs both do)."""
        ms = self.latencies(h, kv, decode) * (head_dim / HEAD_DIM)
        b, t = self._batch_tokens()
        if decode:  # reads K and V of every cached token, one query per sequence
            nbytes = _decode_bytes(b, t, kv, head_dim, dtype)
            flops = 4.0 * b * t * h * head_dim
        else:  # Q, K, V in and O out; causal QK^T and PV over t^2/2 pairs
            nbytes = b * t * (2.0 * h + 2.0 * kv) * head_dim * ACT_BYTES
            flops = 2.0 * b * t * t * h * head_dim
        ms = roof.apply(
            ms, nbytes, flops, _compute_dtype(dtype), self.launch_ms, self.cold_bytes_per_s
        )
        # prefill: attention work grows as the prompt length squared; a chunk of a prompt
        # is a fraction of one batch entry (scale_below_batch)
        return Grid(self.batch, self.tokens, ms, 1.0 if decode else 2.0, not decode)

    def _batch_tokens(self) -> tuple[FloatArray, FloatArray]:
        b, t = np.meshgrid(np.array(self.batch), np.array(self.tokens), indexing="ij")
        return b, t

    def memory_bound_calls(self, dtype: str) -> tuple[FloatArray, FloatArray]:
        """(ms, bytes) of every measured call, flat, as decode (a few FLOPs per KV byte);
        ``dtype``: the KV's."""
        b, t = self._batch_tokens()
        ms = [np.ravel(_grid(rows)) for rows in self.rows.values()]
        nbytes = [
            np.ravel(_decode_bytes(b, t, int(key.split(",")[1]), HEAD_DIM, dtype))
            for key in self.rows
        ]
        return np.concatenate(ms), np.concatenate(nbytes)


@dataclass(frozen=True)
class MoeTable:
    """``moe_perf`` for one dtype: the fused MoE layer's latency (ms) over tokens for each
    packaged ``"hidden,inter,topk,experts,tp"`` (balanced routing, no expert parallelism)."""

    tokens: tuple[float, ...]
    rows: Mapping[str, list[float | None]]
    cold_bytes_per_s: float = math.inf  # ``cold_rate`` of its few-token calls

    @classmethod
    def from_doc(cls, d: Mapping[str, Any], dtype: str) -> MoeTable:
        """``dtype``: the table's weight dtype (its key in the document)."""
        table = cls(tuple(d["tokens"]), d["rows"])
        return replace(
            table, cold_bytes_per_s=stored_cold_rate(d, lambda: table.memory_bound_calls(dtype))
        )

    def curve(
        self,
        hidden: int,
        inter: int,
        topk: int,
        experts: int,
        tp: int,
        dtype: str,
        roof: Roofline,
    ) -> LatencyCurve | None:
        """Latency (ms) against tokens, or None when the shape was not measured."""
        row = self.rows.get(f"{hidden},{inter},{topk},{experts},{tp}")
        if row is None:
            return None
        t = np.array(self.tokens)
        nbytes = self._bytes(hidden, inter, topk, experts, tp, dtype)
        flops = 2.0 * t * topk * 3.0 * hidden * inter / tp
        ms = roof.apply(
            _array(row), nbytes, flops, _compute_dtype(dtype), self.launch_ms, self.cold_bytes_per_s
        )
        return LatencyCurve(self.tokens, ms)

    def _bytes(
        self, hidden: int, inter: int, topk: int, experts: int, tp: int, dtype: str
    ) -> FloatArray:
        """The experts' weights the tokens touch (uniform routing) and the activations,
        per measured token count."""
        t = np.array(self.tokens)
        touched = experts * (1.0 - (1.0 - topk / experts) ** t)
        weights = 3.0 * hidden * inter / tp
        return np.asarray(touched * weights * _dtype_bytes(dtype) + 2.0 * t * hidden * ACT_BYTES)

    def memory_bound_calls(self, dtype: str) -> tuple[FloatArray, FloatArray]:
        """The calls of few tokens (``MEMORY_BOUND_TOKENS``); ``dtype``: weight bytes."""
        few = np.array(self.tokens) <= MEMORY_BOUND_TOKENS
        ms, nbytes = [], []
        for key, row in self.rows.items():
            hidden, inter, topk, experts, tp = (int(v) for v in key.split(","))
            ms.append(_array(row)[few])
            nbytes.append(self._bytes(hidden, inter, topk, experts, tp, dtype)[few])
        return np.concatenate(ms), np.concatenate(nbytes)

    @cached_property
    def launch_ms(self) -> float:
        """The table's quickest call (ms), once per table (``quickest_ms``)."""
        return quickest_ms(_array(row) for row in self.rows.values())


@dataclass(frozen=True)
class QuantTable:
    """vLLM's dynamic per-token fp8 quantization of an m × k bf16 input: latency (ms)
    over m for each measured k (``truth_fit._quant``)."""

    m: tuple[float, ...]
    rows: Mapping[str, list[float | None]]

    @classmethod
    def from_doc(cls, d: Mapping[str, Any]) -> QuantTable:
        return cls(tuple(d["m"]), d["rows"])

    def latencies(self, k: float, m: Sequence[float]) -> FloatArray:
        """Latency (ms) at each of ``m`` for an input of width ``k``: log-log between the
        two measured widths around it (proportional to k beyond them), then along m."""
        ks = sorted(float(v) for v in self.rows)
        out = blend((bracket(ks, k),), lambda ij: _array(self.rows[f"{int(ks[ij[0]])}"]))
        row = _array(self.rows[f"{int(ks[0])}"]) * (k / ks[0]) if out is None else out
        curve = LatencyCurve(self.m, row)
        return np.array([curve(x) for x in m])


@dataclass(frozen=True)
class GpuTables:
    """One GPU's measured tables (one engine): GEMM and MoE by weight dtype, attention by KV
    dtype (``bfloat16``, ``fp8`` where measured), all-reduce by GPU count."""

    name: str
    versions: Mapping[str, str]
    gemm: Mapping[str, GemmTable]
    decode: Mapping[str, AttentionTable]
    prefill: Mapping[str, AttentionTable]
    allreduce: Mapping[int, LatencyCurve]
    moe: Mapping[str, MoeTable]
    quant: QuantTable | None = None

    @classmethod
    def from_doc(cls, name: str, d: Mapping[str, Any]) -> GpuTables:
        return cls(
            name,
            d["versions"],
            {k: GemmTable.from_doc(v, k) for k, v in d["gemm"].items()},
            {k: AttentionTable.from_doc(v, k, True) for k, v in d["decode_attention"].items()},
            {k: AttentionTable.from_doc(v, k, False) for k, v in d["context_attention"].items()},
            {int(k): LatencyCurve(v["elements"], v["latency"]) for k, v in d["allreduce"].items()},
            {k: MoeTable.from_doc(v, k) for k, v in d.get("moe", {}).items()},
            QuantTable.from_doc(d["quant"]) if "quant" in d else None,
        )

    def allreduce_curve(self, gpus: int, roof: Roofline) -> LatencyCurve:
        """Latency (ms) against message elements for ``gpus`` GPUs (nearest measured count).

        The part above the smallest message's latency is bandwidth: it is rescaled from
        the measuring host's rate (largest message over its time) to ``dst``'s ring rate,
        link bytes/s · n / (2 · (n − 1)). Hosts differ most in links: the L40S tables come
        from one whose PCIe all-reduce reaches ~2.4 GB/s, a seventh of a PCIe 4 server's.
        """
        n = min(self.allreduce, key=lambda g: (abs(math.log(g / gpus)), g))
        c = self.allreduce[n]
        latency = c.ys[0]
        measured = c.xs[-1] * 2.0 / (c.ys[-1] * 1e-3)  # bf16 bytes per second
        ring = roof.dst.link_bytes_per_s(gpus) * n / (2.0 * (n - 1))
        return LatencyCurve(c.xs, [latency + (y - latency) * measured / ring for y in c.ys])


def parse_tables(doc: Mapping[str, Any]) -> dict[str, GpuTables]:
    """Every GPU's tables from an artefact document."""
    return {name: GpuTables.from_doc(name, d) for name, d in doc["tables"].items()}


@lru_cache(maxsize=1)
def load_document(path: Path = TABLES_PATH) -> dict[str, Any]:
    """The packaged artefact (gzipped JSON next to this module)."""
    with gzip.open(path, "rt", encoding="utf-8") as fh:
        doc: dict[str, Any] = json.load(fh)
    return doc


@lru_cache(maxsize=1)
def load_tables() -> dict[str, GpuTables]:
    """The packaged tables, parsed once per process."""
    return parse_tables(load_document())

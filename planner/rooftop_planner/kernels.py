"""Kernel curves: the achieved fraction of the roofline, per kernel, as data.

Every kernel of a forward pass keeps the roofline's form, bytes over bandwidth and FLOPs
over peak, so a prediction still explains itself; what is fitted (``rooftop_fit.kernel_fit``,
on the measured kernel tables in ``data/ops/``) is the share of peak a real engine's kernel
reaches, as a function of what drives it:

    t = t0 + n_items · t_item + smoothmax( bytes / (BW · η_mem(x)), FLOPs / (peak · η_flop(x)) )

where x = log2 of the driver (GEMM: tokens m; decode attention: cached tokens per
sequence; prefill attention: prompt length; MoE: tokens per expert), η are piecewise
linear in x between knots, t0 is the kernel's fixed latency (s) and t_item a cost per
sequence (decode attention). η_flop counts at most the share of peak a whole forward pass
sustains (``sustained``, ``catalog.SUSTAINED_FLOP_FRACTION``): the tables time one kernel
at a time, faster than back to back. All-reduce is latency plus bytes over a fitted bus
bandwidth per GPU count. Times in seconds, bytes, FLOP.

A GPU without tables of its own borrows another's curves (``measured_on``): its kernel
takes the measured GPU's time, scaled by the ratio of the two rooflines,

    t = t0 + n_items · t_item + smoothmax(…on the measured GPU…) · R,
    R = max(bytes / BW, FLOPs / peak) / max(bytes / BW_measured, FLOPs / peak_measured),

so what transfers is the kernel's efficiency against its roofline at that driver. The
fractions alone do not transfer where a table never pins one down: a few-token GEMM is
memory-bound on the L40S whatever its fitted FLOP fraction, and the same fraction on an
A10G (a fifth of the FLOP/s per byte) would make it compute-bound at twice its time.
"""

from __future__ import annotations

import math
from bisect import bisect_right
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import numpy.typing as npt

FloatArray = npt.NDArray[np.float64]


def column(values: Sequence[float]) -> FloatArray:
    """``values`` as a D × 1 column: one per deployment, broadcast over its grid."""
    out: FloatArray = np.array(values, dtype=np.float64)[:, None]
    return out


SOFTMAX_SHARPNESS = 4.0


def smooth_max(a: float, b: float) -> float:
    """(a⁴ + b⁴)^¼: real kernels do not switch abruptly from memory- to compute-bound."""
    return float((a**SOFTMAX_SHARPNESS + b**SOFTMAX_SHARPNESS) ** (1.0 / SOFTMAX_SHARPNESS))


Rates = tuple[FloatArray | float, FloatArray | float]  # (HBM bytes/s, FLOP/s)


def roofline_ratio(
    bytes_moved: FloatArray | float, flops: FloatArray | float, gpu: Rates, measured: Rates
) -> FloatArray:
    """R = max(bytes / BW, FLOPs / peak) on ``gpu`` over the same on ``measured``: what
    a borrowed curve's kernel time is scaled by (module docstring)."""
    here = np.maximum(np.divide(bytes_moved, gpu[0]), np.divide(flops, gpu[1]))
    there = np.maximum(np.divide(bytes_moved, measured[0]), np.divide(flops, measured[1]))
    out: FloatArray = here / np.maximum(there, 1e-30)
    return out


def interp(x: float, xs: Sequence[float], ys: Sequence[float]) -> float:
    """Piecewise-linear interpolation, flat beyond the ends (numpy.interp for one value)."""
    if x <= xs[0]:
        return ys[0]
    if x >= xs[-1]:
        return ys[-1]
    i = bisect_right(xs, x)
    frac = (x - xs[i - 1]) / (xs[i] - xs[i - 1])
    return ys[i - 1] + frac * (ys[i] - ys[i - 1])


@dataclass(frozen=True)
class Curve:
    """One kernel's fitted achieved fractions (see the module docstring for the formula).

    Attributes:
        t0_s: fixed latency of one call, seconds.
        item_s: extra latency per item (decode attention: per sequence), seconds.
        knots: log2 of the driver at which the fractions are given.
        mem_eff: achieved / peak HBM bandwidth at each knot.
        flop_eff: achieved / peak FLOP/s at each knot.
        median_error: median |predicted / measured − 1| over the table it was fitted on.
        rows: measured rows it was fitted on.
    """

    t0_s: float
    knots: tuple[float, ...]
    mem_eff: tuple[float, ...]
    flop_eff: tuple[float, ...]
    item_s: float = 0.0
    median_error: float = 0.0
    rows: int = 0

    def time_s(
        self,
        bytes_moved: float,
        flops: float,
        driver: float,
        hbm_bytes_per_s: float,
        flops_per_s: float,
        items: float = 0.0,
        measured_on: tuple[float, float] | None = None,
        sustained: float = 1.0,
    ) -> float:
        """Seconds on a GPU with these peaks; ``measured_on``: the (HBM bytes/s, FLOP/s)
        of the GPU the curve was fitted on, when that is another GPU; ``sustained``: the
        share of peak FLOP/s a whole forward pass keeps, a cap on the fitted fraction."""
        bw, peak = measured_on or (hbm_bytes_per_s, flops_per_s)
        x = _log2(driver)
        memory = bytes_moved / (bw * interp(x, self.knots, self.mem_eff))
        compute = flops / (peak * min(interp(x, self.knots, self.flop_eff), sustained))
        scale = 1.0
        if measured_on is not None:
            scale = float(
                roofline_ratio(bytes_moved, flops, (hbm_bytes_per_s, flops_per_s), measured_on)
            )
        return self.t0_s + items * self.item_s + smooth_max(memory, compute) * scale

    def times_s(
        self,
        bytes_moved: FloatArray,
        flops: FloatArray,
        driver: FloatArray,
        hbm_bytes_per_s: FloatArray | float,
        flops_per_s: FloatArray | float,
        items: FloatArray | float = 0.0,
        measured_on: Rates | None = None,
        sustained: FloatArray | float = 1.0,
    ) -> FloatArray:
        """``time_s`` over arrays (the search evaluates its batch grids at once; the GPU's
        rates, the measured GPU's and ``sustained`` may vary along the first axis)."""
        bw, peak = measured_on or (hbm_bytes_per_s, flops_per_s)
        x = np.log2(np.maximum(driver, 1.0))
        memory = bytes_moved / (bw * np.interp(x, self.knots, self.mem_eff))
        compute = flops / (peak * np.minimum(np.interp(x, self.knots, self.flop_eff), sustained))
        kernel = (memory**4 + compute**4) ** 0.25
        if measured_on is not None:
            kernel = kernel * roofline_ratio(
                bytes_moved, flops, (hbm_bytes_per_s, flops_per_s), measured_on
            )
        out: FloatArray = self.t0_s + items * self.item_s + kernel
        return out

    @classmethod
    def from_mapping(cls, data: Mapping[str, Any]) -> Curve:
        return cls(
            t0_s=float(data["t0_s"]),
            item_s=float(data.get("item_s", 0.0)),
            knots=tuple(float(v) for v in data["knots"]),
            mem_eff=tuple(float(v) for v in data["mem_eff"]),
            flop_eff=tuple(float(v) for v in data["flop_eff"]),
            median_error=float(data.get("median_error", 0.0)),
            rows=int(data.get("rows", 0)),
        )


@dataclass(frozen=True)
class AllReduce:
    """One TP all-reduce over a fixed GPU count: the measured latency by message size.

    Between measured sizes the time is interpolated in log-log (the protocol switches from
    latency- to bandwidth-bound, which no two-parameter line follows); beyond the largest
    it grows in proportion to the bytes. Below the smallest it is that size's latency.
    """

    message_bytes: tuple[float, ...]
    seconds: tuple[float, ...]

    def time_s(self, message_bytes: float) -> float:
        sizes, times = self.message_bytes, self.seconds
        if message_bytes <= sizes[0]:
            return times[0]
        if message_bytes >= sizes[-1]:
            return times[-1] * message_bytes / sizes[-1]
        return float(self.times_s(np.array([message_bytes]))[0])

    def times_s(self, message_bytes: FloatArray) -> FloatArray:
        """``time_s`` over an array of message sizes."""
        sizes, times = np.array(self.message_bytes), np.array(self.seconds)
        inside = np.exp(
            np.interp(np.log(np.maximum(message_bytes, sizes[0])), np.log(sizes), np.log(times))
        )
        out: FloatArray = np.where(
            message_bytes >= sizes[-1], times[-1] * message_bytes / sizes[-1], inside
        )
        return out


def _log2(value: float) -> float:
    return math.log2(max(value, 1.0))


@dataclass(frozen=True)
class KernelCurves:
    """All curves of one engine on one measured GPU.

    Attributes:
        table_gpu: the measured GPU the curves come from (``h100_sxm``).
        engine / engine_version: the engine whose kernels were timed.
        gemm: by compute dtype (``bf16``, ``fp8``).
        decode_attention / prefill_attention: by KV dtype (``bf16``, ``fp8``).
        allreduce: by GPU count.
        moe: fused MoE layer by compute dtype (absent where the engine has no table).
        interconnect_bytes_per_s: its GPU-to-GPU bandwidth (all-reduce is rescaled by it).
        hbm_bytes_per_s / flops_per_s: the measured GPU's peaks the fractions refer to
            (dense FLOP/s by compute dtype); 0 / empty in curves stored without them.
        quant: the fp8 quantization of a GEMM's bf16 input that the engine runs as a
            kernel of its own when serving (driver: tokens), where it was timed on its
            own; then ``gemm["fp8"]`` is the GEMM alone
            (``rooftop_fit.kernel_fit.gemm_features``). None: the fp8 curve includes it.
        gemm_as_timed: fp8 GEMM curves fitted on the calls as the collector timed them,
            each behind a dynamic quant of its input, where the engine serves another
            quant (TensorRT-LLM, which serves static scales); empty otherwise.
    """

    table_gpu: str
    engine: str
    engine_version: str
    gemm: Mapping[str, Curve]
    decode_attention: Mapping[str, Curve]
    prefill_attention: Mapping[str, Curve]
    allreduce: Mapping[int, AllReduce]
    moe: Mapping[str, Curve] = field(default_factory=dict)
    interconnect_bytes_per_s: float = 0.0
    hbm_bytes_per_s: float = 0.0
    flops_per_s: Mapping[str, float] = field(default_factory=dict)
    quant: Curve | None = None
    gemm_as_timed: Mapping[str, Curve] = field(default_factory=dict)

    def measured_on(self, compute_dtype: str) -> tuple[float, float] | None:
        """(HBM bytes/s, FLOP/s) of the measured GPU for ``compute_dtype``; None when
        these curves do not record them."""
        peak = self.flops_per_s.get(compute_dtype)
        if not self.hbm_bytes_per_s or peak is None:
            return None
        return self.hbm_bytes_per_s, peak

    def gemm_curve(self, dtype: str, as_timed: bool = False) -> Curve:
        """The GEMM curve of ``dtype``; ``as_timed``: the one fitted on the calls as
        timed, quant included, where the engine has one (``gemm_as_timed``)."""
        timed = self.gemm_as_timed.get(dtype) if as_timed else None
        return timed or self.gemm.get(dtype) or self.gemm["bf16"]

    def attention_curves(self, kv_dtype: str) -> tuple[Curve, Curve]:
        key = "fp8" if kv_dtype in ("fp8", "int8") else "bf16"
        return (
            self.decode_attention.get(key) or self.decode_attention["bf16"],
            self.prefill_attention.get(key) or self.prefill_attention["bf16"],
        )

    def allreduce_for(self, tp: int) -> AllReduce:
        """The measured GPU count nearest above ``tp`` (all-reduce time grows with GPUs)."""
        counts = sorted(self.allreduce)
        return self.allreduce[next((n for n in counts if n >= tp), counts[-1])]

    @classmethod
    def from_mapping(cls, data: Mapping[str, Any]) -> KernelCurves:
        def curves(key: str) -> dict[str, Curve]:
            return {k: Curve.from_mapping(v) for k, v in (data.get(key) or {}).items()}

        return cls(
            table_gpu=str(data["table_gpu"]),
            engine=str(data["engine"]),
            engine_version=str(data["engine_version"]),
            gemm=curves("gemm"),
            decode_attention=curves("decode_attention"),
            prefill_attention=curves("prefill_attention"),
            allreduce={
                int(k): AllReduce(
                    tuple(float(b) for b in v["message_bytes"]),
                    tuple(float(t) for t in v["seconds"]),
                )
                for k, v in (data.get("allreduce") or {}).items()
            },
            moe=curves("moe"),
            interconnect_bytes_per_s=float(data.get("interconnect_bytes_per_s", 0.0)),
            hbm_bytes_per_s=float(data.get("hbm_bytes_per_s", 0.0)),
            flops_per_s={
                str(k): float(v) for k, v in (data.get("dense_flops_per_s") or {}).items()
            },
            quant=Curve.from_mapping(data["quant"]) if data.get("quant") else None,
            gemm_as_timed=curves("gemm_as_timed"),
        )

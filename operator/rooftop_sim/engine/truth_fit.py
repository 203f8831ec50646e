"""Cut the engine truth's packaged kernel tables from ``data/ops``, and say how well they fit.

``python -m rooftop_sim.engine.truth --fit [--write]`` runs ``run``:

1. read every GPU's vLLM tables (``data/ops/<gpu>/vllm/*.csv.gz``, schema in
   ``data/vendor_ops.py``) into one document, all rows;
2. build the kernels of every catalog model at TP 1, 2, 4 and 8 (those the planner's TP
   rule allows) with every table dtype, recording which shape rows the interpolation
   reads: GEMM (n, k) pairs, attention (heads, KV heads) pairs, MoE shapes;
3. keep only those rows (whole along their size axes: m, batch, tokens, elements), so
   every catalog deployment interpolates exactly as it would in the full tables;
4. report per table: the values kept, that they are reproduced exactly, and the error of
   the interpolation itself: each interior grid point left out and predicted log-log from
   its two neighbours, along every axis of the raw table.

The document is deterministic (sorted keys, gzip without a timestamp), so a test can check
that the packaged file is what the data regenerates.
"""

from __future__ import annotations

import csv
import gzip
import io
import json
import math
from collections import defaultdict
from collections.abc import Iterable, Iterator, Mapping
from pathlib import Path
from typing import Any

import numpy as np

from rooftop_api import exit_codes
from rooftop_planner.catalog import load_catalog
from rooftop_planner.parallelism import TP_DEGREES, tp_problem
from rooftop_sim.engine import kernels
from rooftop_sim.engine.kernels import FloatArray, GpuTables, Roofline, parse_tables
from rooftop_sim.engine.truth import (
    build_kernels,
    gemm_dtype,
    gpu_spec,
    kv_table_dtype,
    model_spec,
)

ENGINE = "vllm"
SOURCE = (
    "NVIDIA aiconfigurator kernel timings measured in vLLM "
    "(github.com/ai-dynamo/aiconfigurator @ 095f58a51c4ca8e61b66ec108d86f223f8d559ce, "
    "Apache-2.0), reduced by data/vendor_ops.py; rows cut by engine_sim/truth_fit.py"
)
Doc = dict[str, Any]


# --------------------------------------------------------------------------------------
# Reading data/ops
# --------------------------------------------------------------------------------------


def _rows(path: Path) -> Iterator[dict[str, str]]:
    with gzip.open(path, "rt", newline="") as fh:
        yield from csv.DictReader(fh)


def _grid(values: Iterable[float]) -> list[int]:
    return sorted({int(v) for v in values})


def _gemm(path: Path) -> Doc:
    """gemm_perf: per dtype, latency lists over m for every measured "n,k"."""
    by_dtype: dict[str, dict[tuple[int, int, int], float]] = defaultdict(dict)
    for r in _rows(path):
        by_dtype[r["gemm_dtype"]][int(r["m"]), int(r["n"]), int(r["k"])] = float(r["latency"])
    out: Doc = {}
    for dtype, cells in sorted(by_dtype.items()):
        ms = _grid(m for m, _, _ in cells)
        pairs = sorted({(n, k) for _, n, k in cells})
        rows = {
            f"{n},{k}": _without_spikes(ms, [cells.get((m, n, k)) for m in ms]) for n, k in pairs
        }
        out[dtype] = {
            "m": ms,
            "n": _grid(n for n, _ in pairs),
            "k": _grid(k for _, k in pairs),
            "rows": rows,
        }
    return out


# A GEMM call of up to SPIKE_TOKENS tokens timed at over SPIKE_RATIO times the median of
# the same weight's calls with more tokens (up to SPIKE_TOKENS) is a timing spike.
SPIKE_TOKENS = 64
SPIKE_RATIO = 1.5


def _without_spikes(ms: list[int], row: list[float | None]) -> list[float | None]:
    """One weight's latencies over m, timing spikes marked not measured (None).

    Up to 64 tokens a GEMM is bound by reading its weight once, so fewer tokens do not
    take longer; calls that did are spikes of the timing, not of the kernel. vLLM's B200
    fp8 table has one at m = 1 for most weights (about 2x the rest). A None cell takes
    its neighbours' interpolation (below the first measured m, the first one's time).
    """
    small = [
        (i, v)
        for i, (m, v) in enumerate(zip(ms, row, strict=True))
        if m <= SPIKE_TOKENS and v is not None
    ]
    out = list(row)
    for j, (i, value) in enumerate(small[:-1]):
        if value > SPIKE_RATIO * float(np.median([v for _, v in small[j + 1 :]])):
            out[i] = None
    return out


def _attention(path: Path, decode: bool) -> Doc:
    """Attention: per KV dtype, [batch][tokens] latency grids for every "heads,kv_heads".

    Decode tokens are the cached tokens a sequence attends to: the table's isl + step."""
    by_dtype: dict[str, dict[tuple[int, int, int, int], float]] = defaultdict(dict)
    for r in _rows(path):
        cached = int(r["isl"]) + (int(r["step"]) if decode else 0)
        key = (int(r["num_heads"]), int(r["num_key_value_heads"]), int(r["batch_size"]), cached)
        by_dtype[r["kv_cache_dtype"]][key] = float(r["latency"])
    out: Doc = {}
    for dtype, cells in sorted(by_dtype.items()):
        batch, tokens = _grid(c[2] for c in cells), _grid(c[3] for c in cells)
        pairs = sorted({(h, kv) for h, kv, _, _ in cells})
        heads: dict[str, list[int]] = defaultdict(list)
        for h, kv in pairs:
            heads[str(kv)].append(h)
        rows = {
            f"{h},{kv}": [[cells.get((h, kv, b, t)) for t in tokens] for b in batch]
            for h, kv in pairs
        }
        out[dtype] = {"batch": batch, "tokens": tokens, "heads": dict(heads), "rows": rows}
    return out


def _allreduce(path: Path) -> Doc:
    """custom_allreduce_perf: per GPU count, latency over message elements (bf16)."""
    series: dict[str, list[tuple[int, float]]] = defaultdict(list)
    for r in _rows(path):
        series[r["num_gpus"]].append((int(r["message_size"]), float(r["latency"])))
    return {
        g: {"elements": [e for e, _ in sorted(s)], "latency": [y for _, y in sorted(s)]}
        for g, s in sorted(series.items())
    }


def _moe(path: Path) -> Doc:
    """moe_perf: per dtype, latency over tokens for every "hidden,inter,topk,experts,tp"."""
    by_dtype: dict[str, dict[tuple[str, int], float]] = defaultdict(dict)
    for r in _rows(path):
        shape = ",".join(
            r[c] for c in ("hidden_size", "inter_size", "topk", "num_experts", "moe_tp_size")
        )
        by_dtype[r["moe_dtype"]][shape, int(r["num_tokens"])] = float(r["latency"])
    out: Doc = {}
    for dtype, cells in sorted(by_dtype.items()):
        tokens = _grid(t for _, t in cells)
        shapes = sorted({s for s, _ in cells})
        out[dtype] = {
            "tokens": tokens,
            "rows": {s: [cells.get((s, t)) for t in tokens] for s in shapes},
        }
    return out


def _quant(folder: Path) -> Doc | None:
    """vLLM's dynamic per-token fp8 quantization of an m × k bf16 input: latency lists
    over m for every k, the static quant (``scale_matrix_perf``) plus what the per-token
    scale adds (``computescale_perf``, at least 0); None where not measured."""
    static_path, extra_path = (
        folder / "scale_matrix_perf.csv.gz",
        folder / "computescale_perf.csv.gz",
    )
    if not (static_path.exists() and extra_path.exists()):
        return None
    extra = {(int(r["m"]), int(r["k"])): float(r["latency"]) for r in _rows(extra_path)}
    cells = {
        (int(r["m"]), int(r["k"])): float(r["latency"])
        + max(extra.get((int(r["m"]), int(r["k"])), 0.0), 0.0)
        for r in _rows(static_path)
    }
    ms, ks = _grid(m for m, _ in cells), _grid(k for _, k in cells)
    return {"m": ms, "rows": {str(k): [cells.get((m, k)) for m in ms] for k in ks}}


def _versions(ops: Path, gpu: str) -> dict[str, str]:
    with (ops / "versions.csv").open(newline="") as fh:
        return {
            r["table"]: r["engine_version"]
            for r in csv.DictReader(fh)
            if r["gpu"] == gpu and r["engine"] == ENGINE
        }


def read_ops(ops: Path) -> Doc:
    """Every measured GPU's vLLM tables, all rows, as an artefact-shaped document."""
    tables: Doc = {}
    for gpu in sorted(kernels.TABLE_GPU):
        d = ops / gpu / ENGINE
        doc: Doc = {
            "versions": _versions(ops, gpu),
            "gemm": _gemm(d / "gemm_perf.csv.gz"),
            "decode_attention": _attention(d / "generation_attention_perf.csv.gz", True),
            "context_attention": _attention(d / "context_attention_perf.csv.gz", False),
            "allreduce": _allreduce(d / "custom_allreduce_perf.csv.gz"),
        }
        if (d / "moe_perf.csv.gz").exists():
            doc["moe"] = _moe(d / "moe_perf.csv.gz")
        quant = _quant(d)
        if quant is not None:
            doc["quant"] = quant
        tables[gpu] = doc
    return {
        "version": 1,
        "engine": ENGINE,
        "source": SOURCE,
        "latency_unit": "ms",
        "tables": tables,
    }


# --------------------------------------------------------------------------------------
# Cutting: keep the shape rows the catalog's deployments read
# --------------------------------------------------------------------------------------


class _Recorder(dict[str, Any]):
    """A rows mapping that remembers which keys were read (``get`` or ``[]``)."""

    def __init__(self, rows: Mapping[str, Any]) -> None:
        super().__init__(rows)
        self.read: set[str] = set()

    def get(self, key: str, default: Any = None) -> Any:
        if key in self:
            self.read.add(key)
        return super().get(key, default)

    def __getitem__(self, key: str) -> Any:
        self.read.add(key)
        return super().__getitem__(key)


def _row_tables(doc: Doc) -> Iterator[Doc]:
    """Every table (dict with "rows") inside one GPU's document."""
    for kind in ("gemm", "decode_attention", "context_attention", "moe"):
        yield from doc.get(kind, {}).values()


def _catalog_shapes() -> list[tuple[str, int]]:
    """(model id, tp) for every catalog model at every TP the planner allows."""
    cat = load_catalog()
    return [(m.id, tp) for m in cat.models.values() for tp in TP_DEGREES if not tp_problem(m, tp)]


def _record(name: str, tables: GpuTables) -> None:
    """Build every catalog deployment's kernels on one GPU's tables (rows get recorded)."""
    gpu = gpu_spec(kernels.TABLE_GPU[name])
    gemm_dts = {gemm_dtype(w, gpu, tables) for w in ("bf16", "fp8")}
    kv_dts = {kv_table_dtype(k, tables) for k in ("auto", "fp8")}
    for model, tp in _catalog_shapes():
        for g in sorted(gemm_dts):
            for k in sorted(kv_dts):
                build_kernels(model_spec(model), tp, tables, g, k, Roofline(gpu, gpu))


def _store_cold_rates(name: str, doc: Doc) -> None:
    """Keep each memory-bound table's cold rate, computed on all its rows, in the
    document about to be cut (``kernels.stored_cold_rate``)."""
    tables = parse_tables({"tables": {name: doc}})[name]
    rates = {("gemm", k): t.cold_bytes_per_s for k, t in tables.gemm.items()}
    rates |= {("decode_attention", k): t.cold_bytes_per_s for k, t in tables.decode.items()}
    rates |= {("moe", k): t.cold_bytes_per_s for k, t in tables.moe.items()}
    for (kind, dtype), rate in rates.items():
        if math.isfinite(rate):
            doc[kind][dtype][kernels.COLD_KEY] = rate


def cut(full: Doc) -> Doc:
    """The document with only the rows the catalog's deployments read."""
    out: Doc = json.loads(json.dumps(full))  # a deep copy
    for name, doc in out["tables"].items():
        _store_cold_rates(name, doc)
        for table in _row_tables(doc):
            table["rows"] = _Recorder(table["rows"])
        _record(name, parse_tables({"tables": {name: doc}})[name])
        for table in _row_tables(doc):
            rec = table["rows"]
            table["rows"] = {k: rec[k] for k in sorted(rec.read)}
    return out


def encode(doc: Doc) -> bytes:
    """Deterministic bytes: compact sorted JSON, gzip level 9 without name or timestamp."""
    text = json.dumps(doc, sort_keys=True, separators=(",", ":")).encode()
    buf = io.BytesIO()
    with gzip.GzipFile(filename="", mode="wb", fileobj=buf, compresslevel=9, mtime=0) as gz:
        gz.write(text)
    return buf.getvalue()


# --------------------------------------------------------------------------------------
# Report
# --------------------------------------------------------------------------------------


def _as_array(rows: Any) -> FloatArray:
    return np.array(rows, dtype=np.float64)  # None -> nan


def leave_one_out(x: Iterable[float], y: FloatArray, axis: int) -> FloatArray:
    """Relative errors ``pred / y - 1`` of predicting each interior point of ``y`` along
    ``axis`` (grid ``x``) log-log from its two neighbours; NaN-free."""
    lx = np.log(np.array(list(x), dtype=np.float64))
    ly = np.moveaxis(np.log(y), axis, -1)
    w = (lx[1:-1] - lx[:-2]) / (lx[2:] - lx[:-2])
    pred = ly[..., :-2] * (1.0 - w) + ly[..., 2:] * w
    err = np.exp(pred - ly[..., 1:-1]) - 1.0
    return np.asarray(err[np.isfinite(err)])


def _gemm_cube(t: Doc) -> FloatArray:
    """[m, n, k] latencies of a full GEMM table (NaN where unmeasured)."""
    cube = np.full((len(t["m"]), len(t["n"]), len(t["k"])), np.nan)
    ni = {n: i for i, n in enumerate(t["n"])}
    ki = {k: i for i, k in enumerate(t["k"])}
    for key, row in t["rows"].items():
        n, k = (int(v) for v in key.split(","))
        cube[:, ni[n], ki[k]] = _as_array(row)
    return cube


def _heldout(full: Doc) -> list[tuple[str, str, dict[str, FloatArray]]]:
    """(kernel, dtype, {axis: leave-one-out errors}) for every table of one GPU."""
    out = []
    for dtype, t in full["gemm"].items():
        cube = _gemm_cube(t)
        out.append(
            (
                "gemm",
                dtype,
                {a: leave_one_out(t[a], cube, i) for i, a in enumerate(("m", "n", "k"))},
            )
        )
    for kind in ("decode_attention", "context_attention"):
        for dtype, t in full[kind].items():
            stack = np.array([_as_array(r) for r in t["rows"].values()])  # [pair, batch, tokens]
            errs = {
                "batch": leave_one_out(t["batch"], stack, 1),
                "tokens": leave_one_out(t["tokens"], stack, 2),
            }
            out.append((kind.split("_")[0], dtype, errs))
    ar = [
        leave_one_out(s["elements"], _as_array(s["latency"]), 0) for s in full["allreduce"].values()
    ]
    out.append(("allreduce", "bfloat16", {"elements": np.concatenate(ar)}))
    for dtype, t in full.get("moe", {}).items():
        stack = np.array([_as_array(r) for r in t["rows"].values()])
        out.append(("moe", dtype, {"tokens": leave_one_out(t["tokens"], stack, 1)}))
    return out


def _below_roofline(name: str, full: Doc) -> str:
    """Share of measured GEMM latencies under the roofline of the GPU that measured them,
    its bytes at no more than the table's cold rate (``kernels.cold_rate``: weights resident
    in L2 across the benchmark's calls); run time lifts them."""
    gpu = gpu_spec(kernels.TABLE_GPU[name])
    tables = parse_tables({"tables": {name: full}})[name]
    parts = []
    for dtype, t in full["gemm"].items():
        m, n, k = np.meshgrid(*(np.array(t[a], dtype=np.float64) for a in "mnk"), indexing="ij")
        nbytes = (m * k + m * n) * kernels.ACT_BYTES + n * k * (1.0 if dtype == "fp8" else 2.0)
        compute = "fp8" if dtype == "fp8" else "bf16"
        cold = tables.gemm[dtype].cold_bytes_per_s
        floor = Roofline.time_ms(gpu, nbytes, 2.0 * m * n * k, compute, cold)
        cube = _gemm_cube(t)
        ok = np.isfinite(cube)
        parts.append(f"gemm {dtype} {np.mean(cube[ok] < floor[ok]):.1%}")
    return ", ".join(parts)


def _values(doc: Doc) -> int:
    """Measured latencies in one GPU's document (not None)."""
    n = sum(1 for s in doc["allreduce"].values() for _ in s["latency"])
    for table in _row_tables(doc):
        for row in table["rows"].values():
            flat = np.array(row, dtype=np.float64).ravel()
            n += int(np.isfinite(flat).sum())
    return n


def _reproduced(full: Doc, packed: Doc) -> float:
    """Largest |relative difference| between packaged rows and the raw rows they copy."""
    worst = 0.0
    for t_full, t_pack in zip(_row_tables(full), _row_tables(packed), strict=True):
        for key, row in t_pack["rows"].items():
            a, b = _as_array(row), _as_array(t_full["rows"][key])
            ok = np.isfinite(b)
            if (np.isfinite(a) != ok).any():
                return math.inf
            worst = max(worst, float(np.max(np.abs(a[ok] / b[ok] - 1.0), initial=0.0)))
    return worst


def _pct(e: FloatArray) -> str:
    a = np.abs(e)
    if not len(a):
        return "-"
    return f"{np.median(a):5.1%} / {np.quantile(a, 0.9):5.1%} (n={len(a)})"


def report(full: Doc, packed: Doc) -> str:
    """Per GPU table: values kept, reproduction, leave-one-out interpolation errors."""
    lines = [
        "interpolation error |pred/measured - 1|, median / p90: each interior grid point left "
        "out and predicted log-log from its two neighbours, along each axis of the raw table"
    ]
    for name, doc in full["tables"].items():
        pack = packed["tables"][name]
        worst = _reproduced(doc, pack)
        lines.append(
            f"{name} (vLLM {doc['versions'].get('gemm_perf', '?')}): packaged "
            f"{_values(pack)} of {_values(doc)} measured latencies; packaged rows reproduce "
            f"the raw rows to {worst:.1%}"
        )
        lines.append(
            f"  measured below the roofline (lifted at run time): {_below_roofline(name, doc)}"
        )
        for kernel, dtype, errs in _heldout(doc):
            axes = "   ".join(f"{a} {_pct(e)}" for a, e in errs.items())
            lines.append(f"  {kernel:10s} {dtype:9s} {axes}")
    return "\n".join(lines)


def sanity(doc: Doc) -> str:
    """One decode step of Llama-3.1-8B bf16 at TP 1 (batch 1, 1000 tokens) per GPU with
    tables, beside the time its weights take to stream at peak bandwidth."""
    from rooftop_sim.engine.truth import TruthModel

    lines = ["decode step, llama-3.1-8b bf16 TP1, batch 1, 1000 cached tokens:"]
    for name, gid in kernels.TABLE_GPU.items():
        if name not in doc["tables"]:
            continue
        t = TruthModel.for_deployment("llama-3.1-8b", gid, 1, "bf16", "auto")
        floor = t.dep.weight_bytes_per_gpu / t.dep.gpu.hbm_bytes_per_s
        lines.append(
            f"  {gid:10s} {t.decode_step_s(1, 1000) * 1e3:6.2f} ms "
            f"(weights / HBM bandwidth {floor * 1e3:5.2f} ms)"
        )
    return "\n".join(lines)


def run(ops: Path, write: bool) -> int:
    """The ``--fit`` command: regenerate, report, compare with (or write) the package."""
    full = read_ops(ops)
    packed = cut(full)
    print(report(full, packed))
    data = encode(packed)
    current = kernels.TABLES_PATH.exists() and kernels.load_document() == json.loads(
        json.dumps(packed)
    )
    if write:
        kernels.TABLES_PATH.write_bytes(data)
        kernels.load_document.cache_clear()
        kernels.load_tables.cache_clear()
        print(f"wrote {kernels.TABLES_PATH} ({len(data) / 1e6:.2f} MB)")
    else:
        state = "is current" if current else "differs: run with --write"
        print(f"packaged {kernels.TABLES_PATH.name} ({len(data) / 1e6:.2f} MB) {state}")
    if write or current:
        print(sanity(packed))
    return exit_codes.OK

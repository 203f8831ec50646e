"""Engine timing "truth": how long one engine iteration takes on a given deployment.

This is the ground truth that engine-sim and ``rooftop simulate`` run against, so it is
deliberately NOT the planner's roofline formula (``rooftop_planner.perf``): if both used
the same formula, a simulated benchmark would only confirm the planner agrees with itself.

Functional form (all terms are seconds, all coefficients fitted, all >= 0)::

    decode_step_s = c0 + c1 * W/bw + c2 * F_lin/peak + c3 * KV/bw + c4 * n_allreduce * 10us
    prefill_s     = p0 + p1 * W/bw + p2 * F_lin/peak + p3 * F_attn/peak + p4 * n_allreduce * 10us

where W is the weight bytes each GPU reads per step (MoE: only the experts touched),
KV the cached K/V bytes read per GPU, F_lin the dense matmul FLOPs per GPU, F_attn the
prompt self-attention FLOPs per GPU, bw/peak the GPU's HBM bandwidth and peak FLOPs.
The coefficients are therefore inverse efficiencies (c1 = 1.25 means "weights stream at
80 % of peak bandwidth"). They are fitted per GPU with non-negative least squares on
*relative* error to the static-batch rows of ``calibration.csv`` (NVIDIA DLI sizing data,
TensorRT-LLM 0.9): tpot_ms for decode, ttft_ms for prefill. A "generic" coefficient set,
fitted on all GPUs at once, covers GPUs with no measurements (bandwidth/FLOPs-based).
The Argonne vLLM rows (end-to-end batch latency only) are a held-out check, and their
median ratio measured/predicted is stored as ``engine_factor`` (vLLM vs TensorRT-LLM).

Run ``python -m rooftop_operator.engine_sim.truth --fit`` to refit and print the errors.
"""

from __future__ import annotations

import argparse
import csv
import json
import math
import os
import re
import sys
from collections.abc import Sequence
from dataclasses import dataclass
from functools import lru_cache
from pathlib import Path
from typing import Any

import numpy as np
import numpy.typing as npt

from rooftop_planner.catalog import Catalog, CatalogError, load_catalog

FIT_PATH = Path(__file__).with_name("truth_fit.json")
# The shared data folder sits next to the repository (CONTRACTS.md's ../shared convention).
DEFAULT_CALIBRATION = Path(
    os.environ.get(
        "ROOFTOP_CALIBRATION_CSV",
        Path(__file__).resolve().parents[3].parent / "shared/data/measured/calibration.csv",
    )
)
ALLREDUCE_S = 10e-6  # nominal latency of one small NCCL all-reduce; its coefficient is fitted
LINK_BYTES_PER_S = 100e9  # nominal all-reduce bus bandwidth; its coefficient is fitted per GPU
GIB = 1 << 30
# Per-GPU memory vLLM cannot give to the KV cache besides weights: CUDA context,
# activation peak of the profiling run, CUDA graphs. ~2 GiB is typical for 7-70B models.
NON_KV_OVERHEAD_BYTES = 2 * GIB
BLOCK_TOKENS = 16

FloatArray = npt.NDArray[np.float64]


# --------------------------------------------------------------------------------------
# Hardware and model shapes (GPUs from the catalog; models catalog first, internal table next)
# --------------------------------------------------------------------------------------


@dataclass(frozen=True)
class GpuShape:
    """What the timing model needs about a GPU. Bytes, bytes/s, FLOP/s."""

    id: str
    hbm_bytes: float
    hbm_bytes_per_s: float
    bf16_flops: float
    fp8_flops: float | None  # None: no FP8 tensor cores (fp8 weights run weight-only)


@dataclass(frozen=True)
class ModelShape:
    """What the timing model needs about a model. Counts are plain numbers."""

    id: str
    num_layers: int
    hidden_size: int
    num_heads: int
    num_kv_heads: int
    head_dim: int
    param_count: float
    active_param_count: float
    num_experts: int = 0  # 0: dense
    experts_per_token: int = 0
    expert_param_count: float = 0.0  # all experts of all layers together


def _m(
    mid: str, layers: int, hidden: int, heads: int, kv: int, hd: int, params: float
) -> ModelShape:
    return ModelShape(mid, layers, hidden, heads, kv, hd, params, params)


_MODELS: dict[str, ModelShape] = {
    s.id: s
    for s in (
        _m("llama-2-7b", 32, 4096, 32, 32, 128, 6.74e9),
        _m("llama-2-13b", 40, 5120, 40, 40, 128, 13.02e9),
        _m("llama-2-70b", 80, 8192, 64, 8, 128, 68.98e9),
        _m("mistral-7b", 32, 4096, 32, 8, 128, 7.24e9),
        _m("llama-3-8b", 32, 4096, 32, 8, 128, 8.03e9),
        _m("llama-3-70b", 80, 8192, 64, 8, 128, 70.55e9),
        _m("llama-3.1-8b", 32, 4096, 32, 8, 128, 8.03e9),
        _m("llama-3.1-70b", 80, 8192, 64, 8, 128, 70.55e9),
        _m("llama-3.2-1b", 16, 2048, 32, 8, 64, 1.24e9),
        _m("qwen2.5-0.5b", 24, 896, 14, 2, 64, 0.49e9),
        _m("qwen2.5-7b", 28, 3584, 28, 4, 128, 7.62e9),
        ModelShape("mixtral-8x7b", 32, 4096, 32, 8, 128, 46.7e9, 12.9e9, 8, 2, 45.1e9),
    )
}


def _model_key(name: str) -> str:
    """``meta-llama/Meta-Llama-3-8B-Instruct`` -> ``llama-3-8b`` (same rules as catalog)."""
    key = name.strip().lower().rsplit("/", 1)[-1].removeprefix("meta-")
    prev = None
    while prev != key:
        prev = key
        key = re.sub(r"(-(instruct|chat|hf|fp8|awq|gptq|int4|int8|base|it))+$", "", key)
        key = re.sub(r"-v0\.\d+$", "", key)
    return key


@lru_cache(maxsize=1)
def _catalog() -> Catalog | None:
    """The planner's catalog for model lookups when it loads; None otherwise."""
    try:
        return load_catalog()
    except Exception:  # catalog broken: the internal model table still works
        return None


def gpu_shape(name: str) -> GpuShape:
    """Resolve a GPU through the planner's catalog: id, node label or any spelling it knows.

    The catalog is the one GPU table (specs and name matching); a GPU it does not know is
    a KeyError, never a guess.
    """
    try:
        g = load_catalog().gpu(name)
    except CatalogError as err:
        raise KeyError(str(err)) from err
    fp8 = g.dense_flops_per_s.get("fp8")
    return GpuShape(g.id, g.hbm_bytes, g.hbm_bytes_per_s, g.dense_flops_per_s["bf16"], fp8 or None)


def model_shape(name: str) -> ModelShape:
    """Resolve a model by catalog id, alias or HF repo (catalog first, then internal)."""
    cat = _catalog()
    if cat is not None:
        try:
            m = cat.model(name)
        except Exception:
            m = None
        if m is not None:
            return _from_catalog_model(m)
    found = _MODELS.get(name.strip().lower()) or _MODELS.get(_model_key(name))
    if found is None:
        raise KeyError(f"unknown model {name!r}; known: {', '.join(sorted(_MODELS))}")
    return found


def _from_catalog_model(m: Any) -> ModelShape:
    experts = int(m.num_experts) if int(m.num_experts) > 1 else 0
    return ModelShape(
        str(m.id), int(m.num_layers), int(m.hidden_size), int(m.num_heads),
        int(m.num_kv_heads), int(m.head_dim), float(m.param_count),
        float(m.active_param_count), experts, int(m.experts_per_token) if experts else 0,
        float(m.expert_param_count) * experts,
    )  # fmt: skip


def dtype_bytes(dtype: str) -> float:
    """Bytes per element of a weight/KV dtype name ("bf16", "fp8", "int4", "auto", ...)."""
    d = dtype.lower()
    if "fp8" in d or "int8" in d or "e4m3" in d or "e5m2" in d:
        return 1.0
    if "int4" in d or "fp4" in d or "awq" in d or "gptq" in d:
        return 0.5
    if "fp32" in d or "float32" in d:
        return 4.0
    return 2.0  # fp16 / bf16 / auto


# --------------------------------------------------------------------------------------
# Features
# --------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Deployment:
    """One engine replica's static shape: derived per-GPU byte and FLOP quantities."""

    model: ModelShape
    gpu: GpuShape
    tp: int
    weight_dtype: str
    kv_dtype: str
    # MoE routing: "uniform" (real weights: B tokens touch 1-(1-k/E)^B of the experts) or
    # "fixed" (every token picks the same k experts, as with the DLI set's fake weights).
    moe_routing: str = "uniform"

    @property
    def peak_flops(self) -> float:
        """FLOP/s of the matmuls: FP8 tensor cores only for fp8 weights on FP8 GPUs."""
        if dtype_bytes(self.weight_dtype) <= 1.0 and self.gpu.fp8_flops:
            return self.gpu.fp8_flops
        return self.gpu.bf16_flops

    @property
    def kv_bytes_per_token_per_gpu(self) -> float:
        """K and V of one token, all layers, on one GPU (KV heads replicate when tp > kv)."""
        m = self.model
        heads_per_gpu = math.ceil(m.num_kv_heads / self.tp)
        return 2.0 * m.num_layers * heads_per_gpu * m.head_dim * dtype_bytes(self.kv_dtype)

    def weight_bytes_per_gpu(self, tokens: int) -> float:
        """Weight bytes read per step by one GPU; MoE reads only experts the tokens touch."""
        m = self.model
        wb = dtype_bytes(self.weight_dtype)
        if not m.num_experts:
            return m.param_count * wb / self.tp
        shared = m.param_count - m.expert_param_count
        frac = m.experts_per_token / m.num_experts
        if self.moe_routing == "uniform":
            frac = 1.0 - (1.0 - frac) ** max(1, tokens)
        return (shared + m.expert_param_count * frac) * wb / self.tp

    @property
    def n_allreduce(self) -> float:
        """Two all-reduces per layer under tensor parallelism, none without."""
        return 2.0 * self.model.num_layers if self.tp > 1 else 0.0

    def allreduce_s(self, tokens: float) -> float:
        """Nominal all-reduce time per step (s): ring traffic 2(tp-1)/tp of the activations.

        Matters on PCIe-only GPUs (L40S, H100 NVL at tp > 2), where it dominates prefill.
        """
        act_bytes = tokens * self.model.hidden_size * 2.0  # activations are bf16
        ring = 2.0 * (self.tp - 1) / self.tp
        return self.n_allreduce * (ALLREDUCE_S + act_bytes * ring / LINK_BYTES_PER_S)


def decode_features(dep: Deployment, batch: int, context_tokens: float) -> FloatArray:
    """Feature vector (seconds) of one decode step: batch sequences, context_tokens in all."""
    bw = dep.gpu.hbm_bytes_per_s
    flops = 2.0 * dep.model.active_param_count * batch / dep.tp
    kv = dep.kv_bytes_per_token_per_gpu * context_tokens
    return np.array(
        [1e-3, dep.weight_bytes_per_gpu(batch) / bw, flops / dep.peak_flops, kv / bw,
         dep.allreduce_s(batch)],
        dtype=np.float64,
    )  # fmt: skip


def prefill_features(dep: Deployment, tokens: float, attn_pairs: float) -> FloatArray:
    """Feature vector (seconds) of prefilling ``tokens`` prompt tokens.

    attn_pairs: sum over prompt tokens of the context each attends to (n*(n+1)/2 for one
    whole prompt of n tokens); self-attention FLOPs are 4 * layers * q_dim * attn_pairs.
    """
    m = dep.model
    bw = dep.gpu.hbm_bytes_per_s
    lin = 2.0 * m.active_param_count * tokens / dep.tp
    attn = 4.0 * m.num_layers * m.num_heads * m.head_dim * attn_pairs / dep.tp
    return np.array(
        [1e-3, dep.weight_bytes_per_gpu(int(tokens)) / bw, lin / dep.peak_flops,
         attn / dep.peak_flops, dep.allreduce_s(tokens)],
        dtype=np.float64,
    )  # fmt: skip


# --------------------------------------------------------------------------------------
# Fitting
# --------------------------------------------------------------------------------------


def nnls(a: FloatArray, b: FloatArray, max_iter: int = 200) -> FloatArray:
    """Non-negative least squares (Lawson-Hanson): argmin ||a x - b|| subject to x >= 0.

    Small and dependency-free (scipy is not a project dependency); columns are few.
    """
    n = a.shape[1]
    x = np.zeros(n)
    passive = np.zeros(n, dtype=bool)
    for _ in range(max_iter):
        w = a.T @ (b - a @ x)
        if passive.all() or w[~passive].max(initial=-np.inf) <= 1e-12:
            break
        passive[int(np.argmax(np.where(passive, -np.inf, w)))] = True
        while True:
            z = np.zeros(n)
            z[passive] = np.linalg.lstsq(a[:, passive], b, rcond=None)[0]
            if (z[passive] > 0).all():
                x = z
                break
            neg = passive & (z <= 0)
            alpha = np.min(x[neg] / (x[neg] - z[neg]))
            x = x + alpha * (z - x)
            passive &= x > 1e-15
    return x


@dataclass(frozen=True)
class CalRow:
    """One usable static-batch measurement: deployment, shape, tpot/ttft in seconds."""

    dep: Deployment
    batch: int
    isl: int
    osl: int
    tpot_s: float
    ttft_s: float
    engine: str
    e2e_s: float  # Argonne rows: whole-batch latency; NaN where not given


def _row_deployment(row: dict[str, str]) -> Deployment | None:
    try:
        model, gpu = model_shape(row["model"]), gpu_shape(row["gpu"])
    except KeyError:
        return None
    wd = "fp8" if row["weight_dtype"].startswith("fp8") else "fp16"
    # KV dtype is "not stated" in the DLI set, but the "peak mem" notes only fit fp8 KV
    # for the fp8 rows (Llama-2-7B, B=60, 4224 tokens: 75.6 GB measured, 140 GB at fp16).
    # "fake weights" make MoE routing degenerate: every token hits the same experts.
    routing = "fixed" if "fake weights" in row["notes"] else "uniform"
    return Deployment(model, gpu, int(row["tp"]), wd, wd, routing)


def load_calibration(path: Path) -> list[CalRow]:
    """Static-batch rows with a resolvable model and GPU, from calibration.csv."""
    rows: list[CalRow] = []
    with path.open(newline="") as fh:
        for row in csv.DictReader(fh):
            dep = _row_deployment(row)
            if dep is None or "static" not in row["engine"]:
                continue
            e2e = re.search(r"e2e batch latency ([0-9.]+) s", row["notes"])
            rows.append(
                CalRow(
                    dep, int(row["batch"]), int(row["isl"]), int(row["osl"]),
                    float(row["tpot_ms"] or "nan") / 1e3, float(row["ttft_ms"] or "nan") / 1e3,
                    row["engine"], float(e2e.group(1)) if e2e else math.nan,
                )
            )  # fmt: skip
    return rows


def _decode_x(r: CalRow) -> FloatArray:
    # Static batch: mean context over the osl decode steps is isl + osl/2 per sequence.
    return decode_features(r.dep, r.batch, r.batch * (r.isl + r.osl / 2))


def _prefill_x(r: CalRow) -> FloatArray:
    return prefill_features(r.dep, r.batch * r.isl, r.batch * r.isl * (r.isl + 1) / 2)


def _fit_rel(xs: FloatArray, ys: FloatArray, fixed: FloatArray | None) -> FloatArray:
    """NNLS on relative error; columns that are all zero take the ``fixed`` value."""
    a = xs / ys[:, None]
    target = np.ones(len(ys))
    if fixed is None:
        return nnls(a, target)
    empty = ~(np.abs(xs) > 0).any(axis=0)
    target = target - a[:, empty] @ fixed[empty]
    coef = fixed.copy()
    coef[~empty] = nnls(a[:, ~empty], target)
    return coef


def _target(r: CalRow, kind: str) -> float:
    """Measured seconds the fit reproduces: tpot for decode, ttft for prefill."""
    return r.tpot_s if kind == "decode" else r.ttft_s


def _fit_kind(rows: list[CalRow], kind: str) -> dict[str, list[float]]:
    """Coefficients for "decode" or "prefill": "generic" plus one set per measured GPU."""
    feat = _decode_x if kind == "decode" else _prefill_x
    usable = [r for r in rows if _target(r, kind) > 0]
    xs = np.array([feat(r) for r in usable])
    ys = np.array([_target(r, kind) for r in usable])
    generic = _fit_rel(xs, ys, None)
    out = {"generic": [float(v) for v in generic]}
    for gid in sorted({r.dep.gpu.id for r in usable}):
        mask = np.array([r.dep.gpu.id == gid for r in usable])
        out[gid] = [float(v) for v in _fit_rel(xs[mask], ys[mask], generic)]
    return out


def _rel_errors(rows: list[CalRow], coefs: dict[str, list[float]], kind: str) -> FloatArray:
    feat = _decode_x if kind == "decode" else _prefill_x
    errs = []
    for r in rows:
        y = _target(r, kind)
        if y > 0:
            c = np.array(coefs.get(r.dep.gpu.id, coefs["generic"]))
            errs.append(float(feat(r) @ c) / y - 1.0)
    return np.array(errs)


def _e2e_ratios(rows: list[CalRow], fit: dict[str, Any]) -> dict[str, list[float]]:
    """measured/predicted whole-batch latency of rows that only give e2e (Argonne)."""
    out: dict[str, list[float]] = {}
    for r in rows:
        if math.isnan(r.e2e_s) or r.dep.gpu.id not in fit["decode"]:
            continue
        cd = np.array(fit["decode"][r.dep.gpu.id])
        cp = np.array(fit["prefill"][r.dep.gpu.id])
        pred = float(_prefill_x(r) @ cp) + (r.osl - 1) * float(_decode_x(r) @ cd)
        key = "vllm" if "vllm" in r.engine.lower() else "trtllm"
        out.setdefault(key, []).append(r.e2e_s / pred)
    return out


def fit(path: Path = DEFAULT_CALIBRATION) -> tuple[dict[str, Any], str]:
    """Fit all coefficient sets from calibration.csv; returns (fit document, error report)."""
    rows = load_calibration(path)
    measured = [r for r in rows if not math.isnan(r.tpot_s)]
    doc: dict[str, Any] = {
        "version": 1,
        "source": "calibration.csv static-batch rows (NVIDIA DLI TensorRT-LLM 0.9 sizing set)",
        "form": "step_s = sum(coef_i * feature_i); see truth.py docstring",
        "decode": _fit_kind(measured, "decode"),
        "prefill": _fit_kind(measured, "prefill"),
    }
    ratios = _e2e_ratios(rows, doc)
    doc["engine_factor"] = {k: float(np.median(v)) for k, v in ratios.items()}
    doc["errors"] = _error_summary(measured, doc, ratios)
    return doc, _format_report(doc)


def _error_summary(
    rows: list[CalRow], doc: dict[str, Any], ratios: dict[str, list[float]]
) -> dict[str, Any]:
    summary: dict[str, Any] = {}
    for kind in ("decode", "prefill"):
        per = {"all": _rel_errors(rows, doc[kind], kind)}
        generic_only = {"generic": doc[kind]["generic"]}
        per["generic_coefs"] = _rel_errors(rows, generic_only, kind)
        for gid in doc[kind]:
            if gid != "generic":
                sub = [r for r in rows if r.dep.gpu.id == gid]
                per[gid] = _rel_errors(sub, doc[kind], kind)
        summary[kind] = {k: _stats(v) for k, v in per.items()}
    summary["e2e_heldout"] = {
        k: _stats(np.array(v) / np.median(v) - 1.0) | {"median_ratio": float(np.median(v))}
        for k, v in ratios.items()
    }
    return summary


def _stats(e: FloatArray) -> dict[str, float]:
    a = np.abs(e)
    return {
        "n": float(len(e)),
        "median_abs": float(np.median(a)) if len(a) else math.nan,
        "p90_abs": float(np.quantile(a, 0.9)) if len(a) else math.nan,
        "bias": float(np.median(e)) if len(e) else math.nan,
    }


def _format_report(doc: dict[str, Any]) -> str:
    lines = ["relative error |pred/measured - 1|   n   median    p90    median(signed)"]
    for kind, per in doc["errors"].items():
        for key, s in per.items():
            extra = f"  ratio {s['median_ratio']:.3f}" if "median_ratio" in s else ""
            lines.append(
                f"{kind:8s} {key:16s} {int(s['n']):5d} {s['median_abs']:7.3f} "
                f"{s['p90_abs']:7.3f} {s['bias']:+8.3f}{extra}"
            )
    return "\n".join(lines)


@lru_cache(maxsize=1)
def load_fit(path: Path = FIT_PATH) -> dict[str, Any]:
    """The stored fit document (JSON next to this module)."""
    doc: dict[str, Any] = json.loads(path.read_text())
    return doc


# --------------------------------------------------------------------------------------
# The model engines run against
# --------------------------------------------------------------------------------------


class TruthModel:
    """Step-time oracle for one engine replica (model x GPU x TP x dtypes).

    Every returned time is the fitted prediction times ``reality_factor`` times a
    mean-one lognormal draw with sigma ``noise`` (seeded, so runs are reproducible).
    ``reality_factor`` is a plain attribute: engine-sim's /admin/reality changes it live.
    """

    def __init__(
        self,
        dep: Deployment,
        decode_coef: FloatArray,
        prefill_coef: FloatArray,
        fit_source: str,
        reality_factor: float = 1.0,
        noise: float = 0.0,
        seed: int = 0,
    ) -> None:
        if reality_factor <= 0 or noise < 0:
            raise ValueError("reality_factor must be > 0 and noise >= 0")
        self.dep = dep
        self.fit_source = fit_source  # "gpu:<id>" or "generic" (unmeasured GPU)
        self.reality_factor = reality_factor
        self.noise = noise
        self._decode = decode_coef
        self._prefill = prefill_coef
        self._rng = np.random.default_rng(seed)

    @classmethod
    def for_deployment(
        cls,
        model: str,
        gpu: str,
        tp: int,
        weight_dtype: str,
        kv_dtype: str,
        reality_factor: float = 1.0,
        noise: float = 0.0,
        seed: int = 0,
    ) -> TruthModel:
        """Build from names (catalog ids, HF repos or calibration spellings all resolve)."""
        if tp < 1:
            raise ValueError(f"tp must be >= 1, got {tp}")
        dep = Deployment(model_shape(model), gpu_shape(gpu), tp, weight_dtype, kv_dtype)
        doc = load_fit()
        key = dep.gpu.id if dep.gpu.id in doc["decode"] else "generic"
        source = "generic" if key == "generic" else f"gpu:{key}"
        return cls(
            dep, np.array(doc["decode"][key]), np.array(doc["prefill"][key]), source,
            reality_factor, noise, seed,
        )  # fmt: skip

    def _scale(self, seconds: float) -> float:
        factor = self.reality_factor
        if self.noise > 0:
            # mean-one lognormal: E[exp(N(-s^2/2, s))] = 1, so noise does not bias means
            factor *= float(self._rng.lognormal(-(self.noise**2) / 2, self.noise))
        return seconds * factor

    def decode_step_s(self, batch: int, context_tokens: int) -> float:
        """Seconds of one decode iteration: ``batch`` sequences, ``context_tokens`` in all."""
        if batch <= 0:
            return 0.0
        return self._scale(float(decode_features(self.dep, batch, context_tokens) @ self._decode))

    def prefill_s(self, prompt_tokens: int, batch: int = 1) -> float:
        """Seconds to prefill ``batch`` prompts of ``prompt_tokens`` each, in one iteration."""
        if prompt_tokens <= 0 or batch <= 0:
            return 0.0
        n = batch * prompt_tokens
        pairs = batch * prompt_tokens * (prompt_tokens + 1) / 2
        return self._scale(float(prefill_features(self.dep, n, pairs) @ self._prefill))

    def step_s(
        self,
        decode_batch: int,
        decode_context_tokens: int,
        prefill_tokens: int,
        prefill_attn_pairs: float,
    ) -> float:
        """Seconds of one mixed iteration (continuous batching with chunked prefill).

        = decode step + the prefill's token-proportional terms (compute, attention,
        all-reduce). Its fixed overhead and weight streaming are already paid by the
        decode step, since one forward pass reads the weights once.
        prefill_attn_pairs: sum over prefill tokens of the context each attends to.
        """
        if decode_batch <= 0:
            if prefill_tokens <= 0:
                return 0.0
            x = prefill_features(self.dep, prefill_tokens, prefill_attn_pairs)
            return self._scale(float(x @ self._prefill))
        t = float(decode_features(self.dep, decode_batch, decode_context_tokens) @ self._decode)
        if prefill_tokens > 0:
            x = prefill_features(self.dep, prefill_tokens, prefill_attn_pairs)
            t += float(x[2:] @ self._prefill[2:])
        return self._scale(t)

    def kv_capacity_tokens(self, gpu_memory_utilization: float = 0.9) -> int:
        """KV-cache tokens one replica holds (whole 16-token blocks), like vLLM's profile."""
        if not 0 < gpu_memory_utilization <= 1:
            raise ValueError("gpu_memory_utilization must be in (0, 1]")
        d = self.dep
        weights = d.model.param_count * dtype_bytes(d.weight_dtype) / d.tp
        free = d.gpu.hbm_bytes * gpu_memory_utilization - weights - NON_KV_OVERHEAD_BYTES
        tokens = int(max(0.0, free) // d.kv_bytes_per_token_per_gpu)
        return tokens - tokens % BLOCK_TOKENS


def main(argv: Sequence[str] | None = None) -> int:
    """``python -m rooftop_operator.engine_sim.truth --fit [--csv PATH] [--write]``."""
    ap = argparse.ArgumentParser(prog="python -m rooftop_operator.engine_sim.truth")
    ap.add_argument("--fit", action="store_true", help="fit from calibration.csv, print errors")
    ap.add_argument("--csv", type=Path, default=DEFAULT_CALIBRATION)
    ap.add_argument("--write", action="store_true", help=f"store the fit in {FIT_PATH.name}")
    args = ap.parse_args(argv)
    if not args.fit:
        ap.print_help()
        return 2
    if not args.csv.exists():
        print(f"calibration file not found: {args.csv}", file=sys.stderr)
        return 1
    doc, report = fit(args.csv)
    print(report)
    if args.write:
        FIT_PATH.write_text(json.dumps(doc, indent=1, sort_keys=True) + "\n")
        print(f"wrote {FIT_PATH}")
    return 0


if __name__ == "__main__":
    sys.exit(main())

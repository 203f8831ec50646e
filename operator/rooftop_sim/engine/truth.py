"""Engine timing "truth": how long one engine iteration takes on a given deployment.

This is the ground truth that engine-sim and ``rooftop simulate`` run against, so it is
deliberately NOT the planner's roofline formula (``rooftop_planner.perf``) nor its fitted
curves: it adds up kernel latencies measured inside vLLM on real GPUs (``kernels.py``), so
a simulated benchmark can show the planner wrong.

One step with ``b`` decode sequences holding ``ctx`` cached tokens in all and ``p`` prompt
tokens being prefilled (T = b + p tokens through the linear layers), per GPU::

    step = L * ( GEMM(T, n=(h_g + 2 kv_g) d, k=H)          QKV projection
               + attn_decode(b sequences, ctx/b tokens)      if b > 0
               + attn_prefill(the chunk)                     if p > 0
               + GEMM(T, n=H, k=h_g d)                       output projection
               + GEMM(T, n=2 I/tp, k=H) + GEMM(T, n=H, k=I/tp)   MLP (MoE: the fused MoE table)
               + 2 * allreduce(T * H elements)               if tp > 1 )
         + GEMM(b (+1 if p > 0), n=V/tp, k=H)                LM head
         + L * T * elementwise bytes / HBM bandwidth         norms, rotary, activation
         + ENGINE_STEP_OVERHEAD_S

and no step is faster than vLLM's own host work for it (scheduling, inputs, sampling
bookkeeping, measured: ``rooftop_planner.host_time``), which async scheduling overlaps
with the GPU's; with a host-side drafter (no async scheduling) the step adds what that
work takes beyond ENGINE_STEP_OVERHEAD_S, and the drafter's lookup.

L layers, H hidden size, I intermediate size, V vocabulary, d head size, h_g = heads/tp and
kv_g = ceil(kv_heads/tp) heads per GPU (KV heads replicate when tp > kv_heads). Norms,
rotary embedding, activation, residual and KV-cache-write kernels are not in the tables:
their 16-bit activation bytes per token and layer (``layer_elementwise_bytes``, a count
of what those kernels read and write) stream at the GPU's peak HBM bandwidth, an
assumption (``ELEMENTWISE_BANDWIDTH_SHARE``) like the engine's per-step overhead.
The prefill chunk of p tokens attending ``pairs`` (query, key) pairs in all is priced as
``p / l`` prompts of length ``l = 2 pairs / p - 1`` (same FLOPs, same mean context): a whole
prompt of n tokens is exactly that; a later chunk of a long prompt is a fraction of one.

Each kernel is interpolated directly in its measured table and floored at its roofline
(``kernels.py``); a GPU without tables borrows the nearest architecture's, scaled by
bandwidth or FLOPs, and ``fit_source`` says which table times it. Being measured, the sum
is not smooth: where a kernel changes tiles (GEMM m = 16 -> 17, 3072 -> 3073, ...) one
more token can make a step a few percent faster, as on the real GPU.

Dtypes. GEMMs: fp8 weights use the fp8 rows where the GPU has FP8 tensor cores and the
table measured them, else bf16 (fp8 weight-only on Ampere is priced as bf16); fp4 weights
use the fp8 rows likewise (the nearest measured low-precision path); int8/int4 weights use
the bf16 rows: an approximation (weight-only kernels stream fewer bytes, so small-batch
decode is really faster than this, large batches about the same). Attention: an fp8 KV
cache uses the fp8 rows where measured, else bf16.

fp8 GEMMs as vLLM serves them: the tables time each fp8 GEMM with the quantization of its
bf16 input in front; vLLM's compiler fuses that quant into the RMSNorm before the QKV and
gate/up projections and into SiLU-and-mul before the down projection, so those take the
measured call less the measured quant (``kernels.QuantTable``); the output projection,
fed by the attention op, keeps its own. The LM head is never quantized (16-bit rows).

Run ``python -m rooftop_sim.engine.truth --fit`` to cut the packaged tables from
``data/ops`` and print how well they reproduce it (``truth_fit.py``); ``--write`` stores them.
"""

from __future__ import annotations

import argparse
import math
import sys
from collections.abc import Sequence
from dataclasses import dataclass
from functools import lru_cache
from pathlib import Path

import numpy as np

from rooftop_api import exit_codes
from rooftop_planner.catalog import (
    BYTES_PER_DTYPE,
    CatalogError,
    GpuSpec,
    ModelSpec,
    load_catalog,
)
from rooftop_planner.host_time import lookup_cost, vllm_step_host_s
from rooftop_sim.engine.kernels import (
    TABLE_GPU,
    GpuTables,
    Grid,
    LatencyCurve,
    Roofline,
    load_tables,
    table_for,
)

# ASSUMPTION, not measured: vLLM V1's fixed cost per engine step outside the GPU kernels
# in the tables (scheduling, input preparation, sampling, output processing), with CUDA
# graphs on. A few hundred microseconds; the kernel tables cannot show it.
ENGINE_STEP_OVERHEAD_S = 400e-6
# ASSUMPTION, not measured: the elementwise kernels the tables do not time (norms, rotary,
# SiLU-and-mul, residual adds, KV-cache writes) stream their bytes at this share of peak
# HBM bandwidth. Memory-bound kernels over megabytes of activations come close to peak.
ELEMENTWISE_BANDWIDTH_SHARE = 1.0
GIB = 1 << 30
# Per-GPU memory vLLM cannot give to the KV cache besides weights: CUDA context,
# activation peak of the profiling run, CUDA graphs. ~2 GiB is typical for 7-70B models.
NON_KV_OVERHEAD_BYTES = 2 * GIB
BLOCK_TOKENS = 16
DEFAULT_OPS = Path(__file__).resolve().parents[3] / "data" / "ops"


def dtype_bytes(dtype: str) -> float:
    """Bytes per element of a weight/KV dtype: the catalog's table (one source), with
    KeyError naming the dtypes it knows."""
    try:
        return BYTES_PER_DTYPE[dtype.lower()]
    except KeyError:
        raise KeyError(f"unknown dtype {dtype!r}; known: {', '.join(BYTES_PER_DTYPE)}") from None


def model_spec(name: str) -> ModelSpec:
    """A model by catalog id, alias or Hugging Face repo; KeyError if the catalog lacks it."""
    catalog = load_catalog()
    try:
        return catalog.model(name)
    except CatalogError:  # its message speaks of ServingTargets; say what engine-sim takes
        known = ", ".join(sorted(catalog.models))
        raise KeyError(f"unknown model {name!r}; known: {known}") from None


def gpu_spec(name: str) -> GpuSpec:
    """A GPU by catalog id, node label or any spelling the catalog knows; else KeyError."""
    try:
        return load_catalog().gpu(name)
    except CatalogError as err:
        raise KeyError(str(err)) from err


# --------------------------------------------------------------------------------------
# The simulated engine's shape
# --------------------------------------------------------------------------------------


@dataclass(frozen=True)
class SimulatedShape:
    """One engine replica's static shape: model, GPU, tensor parallelism, dtypes."""

    model: ModelSpec
    gpu: GpuSpec
    tp: int
    weight_dtype: str
    kv_dtype: str

    @property
    def kv_bytes_per_token_per_gpu(self) -> float:
        """K and V of one token, all layers, on one GPU (bytes)."""
        m = self.model
        # K and V of this GPU's KV heads, or an MLA latent (the model's geometry, not timing)
        per_layer = m.kv_elements_per_token_layer(self.tp)
        return m.num_layers * per_layer * dtype_bytes(self.kv_dtype)

    @property
    def weight_bytes_per_gpu(self) -> float:
        """All weights one GPU holds (bytes): parameters x dtype bytes / tp."""
        return self.model.param_count * dtype_bytes(self.weight_dtype) / self.tp


def kv_heads_per_gpu(model: ModelSpec, tp: int) -> int:
    """KV heads on one GPU: split by tp, replicated once tp exceeds them."""
    return math.ceil(model.num_kv_heads / tp)


def gemm_dtype(weight_dtype: str, gpu: GpuSpec, tables: GpuTables) -> str:
    """The GEMM table rows a weight dtype runs as (see the module docstring)."""
    d = weight_dtype.lower()
    low_precision = "fp8" in d or "fp4" in d
    if low_precision and "fp8" in gpu.dense_flops_per_s and "fp8" in tables.gemm:
        return "fp8"
    return "bfloat16"


def kv_table_dtype(kv_dtype: str, tables: GpuTables) -> str:
    """The attention table rows a KV dtype runs as: fp8 (any 1-byte KV) where measured."""
    one_byte = dtype_bytes(kv_dtype) <= 1.0
    return "fp8" if one_byte and "fp8" in tables.decode and "fp8" in tables.prefill else "bfloat16"


# --------------------------------------------------------------------------------------
# One deployment's kernels
# --------------------------------------------------------------------------------------


@dataclass(frozen=True)
class StepKernels:
    """One deployment's kernels, each a latency curve (ms) against its size.

    ``gate_up``/``down`` are the dense MLP's GEMMs, or one expert's for an MoE model whose
    fused MoE layer was not measured (then ``moe`` is None and experts are priced as GEMMs).
    """

    num_layers: int
    hidden: int
    experts: int
    topk: int
    qkv: LatencyCurve
    o_proj: LatencyCurve
    gate_up: LatencyCurve
    down: LatencyCurve
    lm_head: LatencyCurve
    moe: LatencyCurve | None
    decode_attn: Grid
    prefill_attn: Grid
    allreduce: LatencyCurve | None
    elementwise_ms_per_token: float = 0.0  # every layer's, on this GPU

    def mlp_ms(self, tokens: float) -> float:
        """The MLP of one layer for ``tokens`` tokens (ms).

        MoE without a measured fused layer: with uniform routing ``tokens`` tokens touch
        ``e = E (1 - (1 - k/E)^T)`` experts, each running its GEMMs on ``T k / e`` tokens.
        """
        if self.experts <= 1:
            return self.gate_up(tokens) + self.down(tokens)
        if self.moe is not None:
            return self.moe(tokens)
        e, k = self.experts, self.topk
        touched = e * (1.0 - math.pow(1.0 - k / e, tokens))
        per_expert = tokens * k / touched
        return touched * (self.gate_up(per_expert) + self.down(per_expert))

    def prefill_attn_ms(self, tokens: float, pairs: float) -> float:
        """Prefill attention of ``tokens`` query tokens attending ``pairs`` keys in all (ms),
        priced as ``tokens / l`` prompts of length ``l = 2 pairs / tokens - 1``."""
        length = max(1.0, 2.0 * pairs / tokens - 1.0)
        return self.prefill_attn(tokens / length, length)

    def gemms_ms(self, tokens: float, sampled: float) -> float:
        """Every layer's GEMMs (and MLP or MoE) for ``tokens`` tokens, plus the LM head for
        the ``sampled`` rows that sample a token (ms)."""
        layer = self.qkv(tokens) + self.o_proj(tokens) + self.mlp_ms(tokens)
        return self.num_layers * layer + (self.lm_head(sampled) if sampled > 0 else 0.0)

    def step_ms(
        self, batch: int, context_tokens: float, prefill_tokens: int, pairs: float, sampled: int
    ) -> float:
        """GPU time of one step (ms): the module docstring's sum, without the engine overhead.

        batch: decode sequences; context_tokens: the KV tokens they hold in all;
        prefill_tokens/pairs: the prefill chunk; sampled: rows through the LM head.
        """
        tokens = batch + prefill_tokens
        layer = 0.0
        if batch > 0:
            layer += self.decode_attn(batch, max(1.0, context_tokens / batch))
        if prefill_tokens > 0:
            layer += self.prefill_attn_ms(prefill_tokens, pairs)
        if self.allreduce is not None:
            layer += 2.0 * self.allreduce(tokens * self.hidden)
        elementwise = tokens * self.elementwise_ms_per_token
        return self.gemms_ms(tokens, sampled) + self.num_layers * layer + elementwise


def build_kernels(
    model: ModelSpec, tp: int, tables: GpuTables, gemm_dt: str, kv_dt: str, roof: Roofline
) -> StepKernels:
    """Interpolate every kernel of ``model`` at ``tp`` in ``tables``, floored and scaled by
    ``roof`` (see ``kernels.Roofline``). ``gemm_dt``/``kv_dt`` are table dtypes
    (``bfloat16`` or ``fp8``)."""
    hd, hidden, inter = model.head_dim, model.hidden_size, model.intermediate_size
    heads, kv = math.ceil(model.num_heads / tp), kv_heads_per_gpu(model, tp)
    gemm = tables.gemm[gemm_dt]

    def linear(n: float, k: float) -> LatencyCurve:
        return gemm.curve(n, k, gemm_dt, roof)

    def fused(n: float, k: float) -> LatencyCurve:
        """A GEMM whose fp8 input quantization vLLM fuses into the kernel before it (the
        RMSNorm, SiLU-and-mul): the measured call less the quant it timed."""
        if gemm_dt != "fp8" or tables.quant is None:
            return linear(n, k)
        return gemm.curve(n, k, gemm_dt, roof, tables.quant.latencies(k, gemm.m))

    def unquantized(n: float, k: float) -> LatencyCurve:
        """vLLM's LM head is an embedding layer, never quantized: 16-bit rows."""
        return tables.gemm["bfloat16"].curve(n, k, "bfloat16", roof)

    moe = None
    if model.is_moe and gemm_dt in tables.moe:
        moe = tables.moe[gemm_dt].curve(
            hidden, inter, model.experts_per_token, model.num_experts, tp, gemm_dt, roof
        )
    return StepKernels(
        model.num_layers,
        hidden,
        model.num_experts,
        model.experts_per_token,
        qkv=fused((heads + 2 * kv) * hd, hidden),
        o_proj=linear(hidden, heads * hd),  # its input comes from attention: quant kept
        gate_up=fused(2 * math.ceil(inter / tp), hidden),
        down=fused(hidden, math.ceil(inter / tp)),
        lm_head=unquantized(math.ceil(model.vocab_size / tp), hidden),
        moe=moe,
        decode_attn=tables.decode[kv_dt].grid(heads, kv, hd, kv_dt, True, roof),
        prefill_attn=tables.prefill[kv_dt].grid(heads, kv, hd, kv_dt, False, roof),
        allreduce=tables.allreduce_curve(tp, roof) if tp > 1 else None,
        elementwise_ms_per_token=elementwise_ms(model, tp, roof.dst),
    )


def elementwise_ms(model: ModelSpec, tp: int, gpu: GpuSpec) -> float:
    """Every layer's elementwise kernels for one token on one GPU (ms): their bytes at
    ``ELEMENTWISE_BANDWIDTH_SHARE`` of peak HBM bandwidth."""
    bytes_per_token = model.num_layers * layer_elementwise_bytes(model, tp)
    return 1e3 * bytes_per_token / (gpu.hbm_bytes_per_s * ELEMENTWISE_BANDWIDTH_SHARE)


def layer_elementwise_bytes(model: ModelSpec, tp: int) -> float:
    """Bytes one token's elementwise kernels read and write in one layer on one GPU, all
    16-bit: the two fused residual-add + RMSNorms see the whole hidden state on every GPU,
    the rest only this GPU's heads and MLP share."""
    hidden = model.hidden_size
    q = math.ceil(model.num_heads / tp) * model.head_dim
    kv = kv_heads_per_gpu(model, tp) * model.head_dim
    norms = 2 * 4 * hidden  # each reads x and the residual and writes both
    rotary = 2 * (q + kv)  # q and k, rotated in place
    cache = 2 * 2 * kv  # K and V read, and written into the paged cache
    activation = 3 * model.experts_per_token * math.ceil(model.intermediate_size / tp)
    return 2.0 * (norms + rotary + cache + activation)


def fit_source(gpu: GpuSpec) -> str:
    """Which measured table times ``gpu``: ``tables:<name>``, and whether it is borrowed."""
    name = table_for(gpu)
    if not gpu.kernel_table_borrowed:
        return f"tables:{name}"
    return f"tables:{name} borrowed by {gpu.id} (scaled by bandwidth/FLOPs)"


@lru_cache(maxsize=64)
def _kernels(model: str, gpu: str, tp: int, weight_dtype: str, kv_dtype: str) -> StepKernels:
    """Cached per deployment: every simulated pod of a fleet shares its kernels."""
    return _shape_kernels(model_spec(model), gpu_spec(gpu), tp, weight_dtype, kv_dtype)


_SHAPE_KERNELS: dict[tuple[str, str, int, str, str], StepKernels] = {}


def _shape_kernels(
    m: ModelSpec, g: GpuSpec, tp: int, weight_dtype: str, kv_dtype: str
) -> StepKernels:
    """The kernels of any model shape (a drafter's too), cached by its id."""
    key = (m.id, g.id, tp, weight_dtype, kv_dtype)
    if key in _SHAPE_KERNELS:
        return _SHAPE_KERNELS[key]
    name = table_for(g)
    tables = load_tables()[name]
    roof = Roofline(gpu_spec(TABLE_GPU[name]), g)
    gemm_dt, kv_dt = gemm_dtype(weight_dtype, g, tables), kv_table_dtype(kv_dtype, tables)
    kernels = _SHAPE_KERNELS[key] = build_kernels(m, tp, tables, gemm_dt, kv_dt, roof)
    return kernels


# --------------------------------------------------------------------------------------
# The model engines run against
# --------------------------------------------------------------------------------------


class TruthModel:
    """Step-time oracle for one engine replica (model x GPU x TP x dtypes).

    Every returned time is the kernel sum plus the engine overhead, times
    ``reality_factor``, times a mean-one lognormal draw with sigma ``noise`` (seeded, so
    runs are reproducible). ``reality_factor`` is a plain attribute: engine-sim's
    /admin/reality changes it live.
    """

    def __init__(
        self,
        dep: SimulatedShape,
        kernels: StepKernels,
        fit_source: str,
        reality_factor: float = 1.0,
        noise: float = 0.0,
        seed: int = 0,
    ) -> None:
        if reality_factor <= 0 or noise < 0:
            raise ValueError("reality_factor must be > 0 and noise >= 0")
        self.dep = dep
        self.kernels = kernels
        self.fit_source = fit_source  # "tables:<gpu table>" (+ " borrowed by <gpu> ...")
        self.reality_factor = reality_factor
        self.noise = noise
        self._rng = np.random.default_rng(seed)
        self.drafter: StepKernels | None = None  # ``with_drafter``: speculative decoding
        # ``with_lookup``: the method whose drafts are looked up on the host (ngram,
        # suffix), None where the GPUs draft or nothing does
        self.looks_up: str | None = None

    def with_lookup(self, method: str = "ngram") -> TruthModel:
        """This engine drafting on the host by ``method`` (``ngram``, prompt lookup;
        ``suffix``, suffix trees): no drafter on the GPUs, the host's lookup over every
        decoding request's tokens before each drafting step, and for ``suffix`` the
        trees of the prompt tokens the step prefills, timed by the method's measured
        table (``rooftop_planner.host_time``)."""
        self.looks_up = method
        return self

    def with_drafter(self, model: ModelSpec, weight_dtype: str) -> TruthModel:
        """This engine drafting with ``model`` (a draft model or an EAGLE-3 head's
        shape, ``rooftop_planner.drafters``) on its GPUs at its TP, timed by the same
        tables; its weights and KV leave the cache less room (``kv_capacity_tokens``)."""
        d = self.dep
        self.drafter = _shape_kernels(model, d.gpu, d.tp, weight_dtype, d.kv_dtype)
        self._draft_shape = SimulatedShape(model, d.gpu, d.tp, weight_dtype, d.kv_dtype)
        return self

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
        """Build from names (catalog ids, aliases, HF repos, node labels all resolve)."""
        if tp < 1:
            raise ValueError(f"tp must be >= 1, got {tp}")
        dep = SimulatedShape(model_spec(model), gpu_spec(gpu), tp, weight_dtype, kv_dtype)
        kernels = _kernels(dep.model.id, dep.gpu.id, tp, weight_dtype, kv_dtype)
        return cls(dep, kernels, fit_source(dep.gpu), reality_factor, noise, seed)

    def _scale(self, gpu_ms: float) -> float:
        """Seconds: kernel time plus the engine overhead, times reality and noise."""
        factor = self.reality_factor
        if self.noise > 0:
            # mean-one lognormal: E[exp(N(-s^2/2, s))] = 1, so noise does not bias means
            factor *= float(self._rng.lognormal(-(self.noise**2) / 2, self.noise))
        return (gpu_ms * 1e-3 + ENGINE_STEP_OVERHEAD_S) * factor

    def _with_host(self, step_s: float, seqs: int, context_tokens: int) -> float:
        """One step's seconds with vLLM's own host work for ``seqs`` requests holding
        ``context_tokens`` (measured, ``rooftop_planner.host_time``). Async scheduling,
        vLLM's default, overlaps it with the GPU's step: the longer one sets the pace.
        With a host-side drafter vLLM schedules synchronously and the GPU waits for it,
        beyond the fixed cost per step already in ``step_s``."""
        host = float(vllm_step_host_s(np.array([float(seqs)]), np.array([context_tokens]))[0])
        if self.looks_up:
            return step_s + max(host - ENGINE_STEP_OVERHEAD_S, 0.0)
        return max(step_s, host)

    def decode_step_s(self, batch: int, context_tokens: int) -> float:
        """Seconds of one decode iteration: ``batch`` sequences, ``context_tokens`` in all."""
        if batch <= 0:
            return 0.0
        step = self._scale(self.kernels.step_ms(batch, context_tokens, 0, 0.0, batch))
        return self._with_host(step, batch, context_tokens)

    def prefill_s(self, prompt_tokens: int, batch: int = 1) -> float:
        """Seconds to prefill ``batch`` prompts of ``prompt_tokens`` each, in one iteration
        (each samples its first token)."""
        if prompt_tokens <= 0 or batch <= 0:
            return 0.0
        n = batch * prompt_tokens
        pairs = batch * prompt_tokens * (prompt_tokens + 1) / 2
        return self._with_host(self._scale(self.kernels.step_ms(0, 0, n, pairs, batch)), batch, 0)

    def step_s(
        self,
        decode_batch: int,
        decode_context_tokens: int,
        prefill_tokens: int,
        prefill_attn_pairs: float,
        draft_tokens: int = 0,
        draft_k: int = 0,
    ) -> float:
        """Seconds of one mixed iteration (continuous batching with chunked prefill): one
        forward pass over the decode tokens and the prefill chunk together.

        prefill_attn_pairs: sum over prefill tokens of the context each attends to.
        draft_tokens: speculative tokens the decoding sequences bring besides their own
        (at most ``draft_k`` each). They run as vLLM runs them, query tokens beyond the
        first of their sequence: through every GEMM and the LM head, and through
        attention as a chunk attending its sequence's context (the measured prefill
        attention, which reads no cached KV of its own: the decode attention of the
        same sequences read it). The drafter (``drafter``) adds its forwards: one over
        every token the step brought, then ``draft_k`` - 1 of one token per sequence,
        kernels only (the engine's step overhead is paid once); a prompt lookup
        (``looks_up``) its host time, the GPU's reality factor aside.
        """
        decode_batch = max(0, decode_batch)
        prefill_tokens = max(0, prefill_tokens)
        if decode_batch == 0 and prefill_tokens == 0:
            return 0.0
        sampled = decode_batch + draft_tokens + (1 if prefill_tokens > 0 else 0)
        per_seq = decode_context_tokens / decode_batch if decode_batch else 0.0
        chunk = prefill_tokens + draft_tokens
        pairs = prefill_attn_pairs + draft_tokens * per_seq
        ms = self.kernels.step_ms(decode_batch, decode_context_tokens, chunk, pairs, sampled)
        if draft_tokens and self.drafter is not None:
            ms += self.drafter.step_ms(
                decode_batch, decode_context_tokens, chunk, pairs, decode_batch
            )
            each = self.drafter.step_ms(decode_batch, decode_context_tokens, 0, 0.0, decode_batch)
            ms += (draft_k - 1) * each
        requests = decode_batch + (1 if prefill_tokens > 0 else 0)
        step = self._with_host(self._scale(ms), requests, decode_context_tokens)
        if draft_k and self.looks_up and decode_batch:
            seqs = np.array([float(decode_batch)])
            context = np.array([float(decode_context_tokens)])
            host_s = lookup_cost(self.looks_up).seconds(seqs, context, float(prefill_tokens))
            return step + float(host_s[0])
        return step

    def kv_capacity_tokens(self, gpu_memory_utilization: float = 0.9) -> int:
        """KV-cache tokens one replica holds (whole 16-token blocks), like vLLM's profile."""
        if not 0 < gpu_memory_utilization <= 1:
            raise ValueError("gpu_memory_utilization must be in (0, 1]")
        d = self.dep
        free = d.gpu.hbm_bytes * gpu_memory_utilization - d.weight_bytes_per_gpu
        per_token = d.kv_bytes_per_token_per_gpu
        if self.drafter is not None:  # the drafter's weights, and its KV of every token
            free -= self._draft_shape.weight_bytes_per_gpu
            per_token += self._draft_shape.kv_bytes_per_token_per_gpu
        tokens = int(max(0.0, free - NON_KV_OVERHEAD_BYTES) // per_token)
        return tokens - tokens % BLOCK_TOKENS


def main(argv: Sequence[str] | None = None) -> int:
    """``python -m rooftop_sim.engine.truth --fit [--ops DIR] [--write]``."""
    ap = argparse.ArgumentParser(prog="python -m rooftop_sim.engine.truth")
    ap.add_argument(
        "--fit", action="store_true", help="cut the tables from data/ops, print their errors"
    )
    ap.add_argument("--ops", type=Path, default=DEFAULT_OPS, help="measured tables (data/ops)")
    ap.add_argument("--write", action="store_true", help="store the cut tables in the package")
    args = ap.parse_args(argv)
    if not args.fit:
        ap.print_help()
        return exit_codes.BAD_INPUT
    if not args.ops.is_dir():
        print(f"measured tables not found: {args.ops}", file=sys.stderr)
        return exit_codes.INFEASIBLE
    from rooftop_sim.engine import truth_fit  # the builder needs this module

    return truth_fit.run(args.ops, args.write)


if __name__ == "__main__":
    sys.exit(main())

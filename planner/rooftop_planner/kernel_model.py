"""A transformer layer as the kernels an engine launches, timed with the fitted curves.

Per layer and GPU (tensor parallelism ``tp`` splits heads and the MLP):
  QKV      GEMM m × k=hidden → n=(heads/tp + 2 · max(kv_heads/tp, 1)) · head_dim
  attention  decode: every cached K/V byte once; prefill: 4 · heads/tp · head_dim FLOP per
             (query, key) pair
  O-proj   GEMM m × k=heads/tp · head_dim → n=hidden
  MLP      GEMM m × hidden → 2 · intermediate/tp (gate and up), then intermediate/tp → hidden;
           MoE models run the fused-MoE kernel over the experts their tokens route to
  2 all-reduces of m · hidden 16-bit activations when tp > 1
plus the LM head once per step over the sequences that sample (m × hidden → vocab/tp),
and the engine's untimed costs (``EngineOverhead``): per step, per layer, and the
elementwise kernels' bytes per token per layer at a fitted share of HBM bandwidth
(t = step_s + L · (layer_s + m · elementwise_bytes / (BW · η_elementwise))).

GEMM weight bytes use the weight dtype (int4 reads half a byte per weight), compute runs
on the GPU's tensor cores for that dtype where it has them (``EngineShape.compute_dtype``).
A GPU that borrows another's curves scales that GPU's kernel times by the ratio of their
rooflines (``kernels`` module docstring).
"""

from __future__ import annotations

import math
from collections import OrderedDict
from collections.abc import Sequence
from dataclasses import replace
from typing import TYPE_CHECKING

import numpy as np

from rooftop_planner.catalog import BYTES_PER_DTYPE, SUSTAINED_FLOP_FRACTION, ModelSpec
from rooftop_planner.kernels import Curve, FloatArray, KernelCurves, column

if TYPE_CHECKING:
    from rooftop_planner.perf import EngineShape

ACTIVATION_BYTES = 2.0  # activations stay 16-bit between kernels
IDEAL = Curve(t0_s=0.0, knots=(0.0,), mem_eff=(1.0,), flop_eff=(1.0,))
GRID_STEPS_PER_OCTAVE = 8
GRID_OCTAVES = 17
# Engines whose LM head runs in 16 bits whatever the checkpoint (``_lm_head_gemms_s``).
SIXTEEN_BIT_LM_HEAD = frozenset({"vllm", "trtllm"})


def elementwise_bytes(m: ModelSpec, tp: int) -> float:
    """16-bit activation bytes one token's elementwise kernels move in one layer on one GPU.

    Two fused residual-add + RMSNorms (read x and the residual, write both: 4 · H each),
    rotary embedding on q and k (read and write: 2 · (q + kv)), the KV-cache write (read K
    and V, write them: 4 · kv) and SiLU-and-mul (read gate and up, write: 3 · I/tp per
    expert a token routes to), with q = heads/tp · d and kv = max(kv_heads/tp, 1) · d
    elements. Llama-3.1-8B: 90,112 elements, 180 KB.
    """
    q = m.num_heads / tp * m.head_dim
    kv = max(m.num_kv_heads / tp, 1.0) * m.head_dim
    mlp = 3.0 * m.experts_per_token * m.intermediate_size / tp
    return ACTIVATION_BYTES * (8.0 * m.hidden_size + 2.0 * (q + kv) + 4.0 * kv + mlp)


def elementwise_s(dep: EngineShape) -> float:
    """Seconds the elementwise kernels add per token per layer: ``elementwise_bytes`` at
    the engine's fitted share of the GPU's HBM bandwidth (0 when none is fitted)."""
    eff = dep.efficiency.overhead.elementwise_mem_eff
    if eff <= 0:
        return 0.0
    return elementwise_bytes(dep.model, dep.tp) / (credited_rates(dep, "bf16")[0] * eff)


def _gemm_curve(dep: EngineShape) -> Curve:
    kernels = dep.efficiency.kernels
    if kernels is None:
        return IDEAL
    return kernels.gemm_curve(dep.compute_dtype, as_timed=_as_timed(dep))


def _as_timed(dep: EngineShape) -> bool:
    """Whether ``dep``'s fp8 GEMMs are priced as the tables timed them, quant included
    (``Efficiency.fp8_as_timed`` where its curves have such a GEMM curve)."""
    kernels = dep.efficiency.kernels
    return (
        dep.efficiency.fp8_as_timed
        and kernels is not None
        and dep.compute_dtype in kernels.gemm_as_timed
    )


def sustained(dep: EngineShape, compute_dtype: str) -> float:
    """The share of peak FLOP/s a forward pass sustains in ``compute_dtype``
    (``catalog.SUSTAINED_FLOP_FRACTION``): no fitted FLOP fraction counts above it. The
    ideal roofline (no fitted curves) is not capped."""
    if dep.efficiency.kernels is None:
        return 1.0
    return SUSTAINED_FLOP_FRACTION.get(compute_dtype, 1.0)


def measured_on(dep: EngineShape, compute_dtype: str) -> tuple[float, float] | None:
    """The measured GPU's (HBM bytes/s, FLOP/s) when ``dep``'s GPU borrows its curves;
    None when the curves are the GPU's own (or do not record their GPU's peaks)."""
    kernels = dep.efficiency.kernels
    if kernels is None or not dep.efficiency.borrowed_from:
        return None
    return kernels.measured_on(compute_dtype)


def credited_rates(dep: EngineShape, compute_dtype: str) -> tuple[float, float]:
    """The (HBM bytes/s, FLOP/s) ``dep``'s kernels are priced at: its GPU's own, or,
    where its curves were timed on another vendor's GPU (``Efficiency.capped``), each at
    most that GPU's. A borrowed curve scales the measured time by the ratio of the
    rooflines (``kernels.roofline_ratio``), so this keeps the ratio at 1 or more: the
    kernels' efficiency carries over within a vendor's software, not across vendors
    (vLLM on MI300X ran at 0.62x an H100's output rate in Argonne's runs, where the
    datasheets say 1.3-1.6x: ``tests/unit/planner/test_borrowed_curves.py``)."""
    own = (dep.gpu.hbm_bytes_per_s, dep.gpu.flops_per_s(compute_dtype))
    measured = measured_on(dep, compute_dtype)
    if measured is None or not dep.efficiency.capped:
        return own
    return min(own[0], measured[0]), min(own[1], measured[1])


def gemm_s(dep: EngineShape, m: float, n: float, k: float) -> float:
    """One GEMM of m tokens through an n × k weight (seconds)."""
    return float(_gemms_s(dep, np.array([m], dtype=np.float64), n, k)[0])


def _layer_shapes(dep: EngineShape) -> list[tuple[float, float]]:
    """(n, k) of the dense GEMMs of one layer on one GPU."""
    return layer_gemm_shapes(dep.model, dep.tp)


def layer_gemm_shapes(m: ModelSpec, tp: int) -> list[tuple[float, float]]:
    """(n, k) of the dense GEMMs every layer of ``m`` runs on one of ``tp`` GPUs: the
    attention projections, and the MLP where the model has no experts."""
    shapes = _mla_shapes(m, tp) if m.is_mla else _attention_shapes(m, tp)
    if not m.is_moe:
        shapes += mlp_shapes(m, m.intermediate_size, tp)
    return shapes


def _attention_shapes(m: ModelSpec, tp: int) -> list[tuple[float, float]]:
    """Fused QKV (q heads + K and V of the KV heads) and the output projection."""
    q_heads = m.num_heads / tp
    kv_heads = max(m.num_kv_heads / tp, 1.0)
    return [
        ((q_heads + 2.0 * kv_heads) * m.head_dim, float(m.hidden_size)),
        (float(m.hidden_size), q_heads * m.head_dim),
    ]


def _mla_shapes(m: ModelSpec, tp: int) -> list[tuple[float, float]]:
    """Multi-head latent attention as vLLM runs it (DeepSeek-V2's names): the fused
    down-projection to the query bottleneck, the KV latent and the rotary key, whole on
    every GPU (vLLM replicates it); the query up-projection (or, with no bottleneck, the
    query projection from the hidden state) and the latent's expansion to each head's
    key and value, split over the heads; the output projection."""
    q_heads, hidden = m.num_heads / tp, float(m.hidden_size)
    latent = float(m.kv_lora_rank + m.qk_rope_head_dim)
    query = q_heads * (m.qk_nope_head_dim + m.qk_rope_head_dim)
    if m.q_lora_rank:
        shapes = [(m.q_lora_rank + latent, hidden), (query, float(m.q_lora_rank))]
    else:
        shapes = [(latent, hidden), (query, hidden)]
    expand = q_heads * (m.qk_nope_head_dim + m.v_head_dim)
    return [*shapes, (expand, float(m.kv_lora_rank)), (hidden, q_heads * m.v_head_dim)]


def mlp_shapes(m: ModelSpec, width: int, tp: int) -> list[tuple[float, float]]:
    """A gated MLP of ``width`` split over ``tp`` GPUs: fused gate+up, then down."""
    return [(2.0 * width / tp, float(m.hidden_size)), (float(m.hidden_size), width / tp)]


def moe_s(dep: EngineShape, tokens: float) -> float:
    """The fused-MoE kernel of one layer: the touched experts' weights, top-k FLOPs.

    bytes = experts touched · 3 · hidden · intermediate/tp · weight bytes;
    FLOPs = 2 · tokens · top-k · 3 · hidden · intermediate/tp; driver = tokens per expert.
    """
    m, tp = dep.model, dep.tp
    kernels = dep.efficiency.kernels
    key = "fp8" if dep.compute_dtype == "fp8" else "bf16"
    curve = (kernels.moe.get(key) or kernels.moe.get("bf16")) if kernels else IDEAL
    curve = curve or _gemm_curve(dep)
    expert = 3.0 * m.hidden_size * m.intermediate_size / tp
    k_over_e = m.experts_per_token / m.num_experts
    touched = m.num_experts * (1.0 - (1.0 - k_over_e) ** max(tokens, 1.0))
    moved = touched * expert * BYTES_PER_DTYPE[dep.weight_dtype]
    flops = 2.0 * tokens * m.experts_per_token * expert
    per_expert = tokens * k_over_e
    dtype = dep.compute_dtype
    return curve.time_s(
        moved,
        flops,
        per_expert,
        *credited_rates(dep, dtype),
        measured_on=measured_on(dep, dtype),
        sustained=sustained(dep, dtype),
    )


def allreduce_s(dep: EngineShape, message_bytes: float) -> float:
    """One all-reduce of ``message_bytes`` over ``tp`` GPUs (seconds).

    A ring moves 2 · (tp − 1)/tp of the message over each link, so its bus rate is
    R = link bytes/s · tp / (2 · (tp − 1)). The measured time's part above the smallest
    message's latency is rescaled from the measured machine's rate (its largest message
    over its time) to this GPU's R: machines differ most in links (the L40S tables come
    from a host whose PCIe all-reduce reaches a seventh of a typical PCIe 4 server's).
    """
    return float(allreduces_s(dep, np.array([message_bytes], dtype=np.float64))[0])


def _gemms_s(dep: EngineShape, m: FloatArray, n: float, k: float) -> FloatArray:
    """``gemm_s`` over an array of token counts."""
    weight = n * k * BYTES_PER_DTYPE[dep.weight_dtype]
    moved = weight + (m * k + m * n) * ACTIVATION_BYTES
    dtype = dep.compute_dtype
    return _gemm_curve(dep).times_s(
        moved,
        2.0 * m * n * k,
        m,
        *credited_rates(dep, dtype),
        measured_on=measured_on(dep, dtype),
        sustained=sustained(dep, dtype),
    )


def allreduces_s(dep: EngineShape, message_bytes: FloatArray) -> FloatArray:
    """``allreduce_s`` over an array of message sizes."""
    rate = dep.gpu.link_bytes_per_s(dep.tp) * dep.tp / (2.0 * (dep.tp - 1))  # the ring's R
    kernels = dep.efficiency.kernels
    if kernels is None or not kernels.allreduce:
        out: FloatArray = message_bytes / rate
        return out
    measured = kernels.allreduce_for(dep.tp)
    latency = measured.seconds[0]
    measured_rate = measured.message_bytes[-1] / measured.seconds[-1]
    return latency + (measured.times_s(message_bytes) - latency) * measured_rate / rate


def _token_costs(dep: EngineShape, tokens: FloatArray) -> tuple[FloatArray, FloatArray]:
    """(GEMM + MoE seconds, all-reduce seconds) of all layers, per token count.

    An MoE model's expert layers run the fused-MoE kernel plus any shared experts' MLP,
    its dense layers their own MLP: L · attention + L_moe · (MoE + shared) + L_dense ·
    dense MLP.
    """
    m = dep.model
    total = m.num_layers * (
        _shapes_s(dep, tokens, _layer_shapes(dep)) + unfused_quant_s(dep, tokens)
    )
    if m.is_moe:
        moe = np.array([moe_s(dep, float(t)) for t in tokens])
        total += m.moe_layers * (moe + _mlp_s(dep, tokens, m.shared_expert_size))
        total += m.dense_layers * _mlp_s(dep, tokens, m.dense_intermediate_size)
    reduce = np.zeros_like(tokens)
    if dep.tp > 1:
        hidden_bytes = m.hidden_size * ACTIVATION_BYTES
        reduce = 2.0 * allreduces_s(dep, tokens * hidden_bytes)
    return total, m.num_layers * reduce


def unfused_quant_s(dep: EngineShape, tokens: FloatArray) -> FloatArray:
    """Seconds per layer of the fp8 quantizations the engine runs as kernels of their
    own, at each token count (``unfused_quant_inputs``: which inputs, how wide, in what
    share of the layers). The fitted fp8 GEMM curve is the GEMM alone where the curves
    carry a quant table (``KernelCurves.quant``); without one (SGLang's, whose collector
    timed the quant it serves in front of every GEMM) the curve includes it and nothing
    is added. Nothing either when the GEMMs run in 16 bits."""
    kernels = _quantizing(dep)
    total = np.zeros_like(tokens)
    if kernels is None or kernels.quant is None:
        return total
    for width, share in unfused_quant_inputs(dep, kernels.engine):
        total += share * kernels.quant.times_s(
            quant_bytes(tokens, width),
            np.zeros_like(tokens),
            tokens,
            *credited_rates(dep, "bf16"),
            measured_on=measured_on(dep, "bf16"),
        )
    return total


def _quantizing(dep: EngineShape) -> KernelCurves | None:
    """``dep``'s curves where its fp8 GEMMs' inputs have a quant priced on its own (a
    quant table, fp8 compute), else None."""
    kernels = dep.efficiency.kernels
    if kernels is None or kernels.quant is None or dep.compute_dtype != "fp8":
        return None
    return kernels


def unfused_quant_inputs(dep: EngineShape, engine: str) -> list[tuple[float, float]]:
    """(width, share of layers) of each GEMM input an engine quantizes to fp8 in a kernel
    of its own, as its source runs a dense layer with fp8 weights.

    vLLM (0.24): its compiler fuses the quant into the RMSNorm before the QKV and gate/up
    projections and into SiLU-and-mul before the down projection; the attention output
    comes from an opaque attention op and its attention+quant fusion is off by default
    (``fuse_attn_quant``), so the output projection's input keeps its own, in every layer.

    TensorRT-LLM (PyTorch backend, static input scales): SwiGLU writes the down
    projection's input in fp8; the attention kernel writes the output projection's input
    in fp8 when the KV cache is fp8. With tensor parallelism on a model wider than 4,096
    (``LlamaDecoderLayer``'s fusion rule) the all-reduce after each row-parallel GEMM is
    fused with the residual add, the RMSNorm and the quant after it (on NCCL as a
    norm+quant kernel right after the all-reduce), so only the first layer's QKV input,
    which no all-reduce precedes, keeps its own. Otherwise the RMSNorms write 16 bits and
    the QKV and gate/up inputs are quantized by the static quant kernel in every layer
    (the gate/up one only in the layers with a dense MLP).

    ``Efficiency.fp8_as_timed``: none (the GEMM curve as timed includes them all).
    """
    m = dep.model
    if _as_timed(dep):
        return []
    attention_out = _output_projection_width(m, dep.tp)
    if engine != "trtllm":
        return [(attention_out, 1.0)]
    inputs = [] if dep.kv_dtype in ("fp8", "int8") else [(attention_out, 1.0)]
    hidden = float(m.hidden_size)
    if dep.tp > 1 and m.hidden_size > 4096:
        return [*inputs, (hidden, 1.0 / m.num_layers)]
    mlp_share = m.dense_layers / m.num_layers if m.is_moe else 1.0
    return [*inputs, (hidden, 1.0), (hidden, mlp_share)]


def quant_bytes(tokens: FloatArray, width: FloatArray | float) -> FloatArray:
    """Bytes the fp8 quantization of a tokens × width bf16 input moves: 2 read and 1
    written per element, and one 4-byte scale per token."""
    out: FloatArray = 3.0 * tokens * width + 4.0 * tokens
    return out


def _output_projection_width(m: ModelSpec, tp: int) -> float:
    """k of the attention's output projection on one GPU: its input's width."""
    shapes = _mla_shapes(m, tp) if m.is_mla else _attention_shapes(m, tp)
    return shapes[-1][1]


def _shapes_s(
    dep: EngineShape, tokens: FloatArray, shapes: list[tuple[float, float]]
) -> FloatArray:
    """Seconds of the GEMMs ``shapes`` at each token count."""
    return sum((_gemms_s(dep, tokens, n, k) for n, k in shapes), np.zeros_like(tokens))


def _mlp_s(dep: EngineShape, tokens: FloatArray, width: int) -> FloatArray:
    """Seconds of a gated MLP of ``width`` at each token count; none when it is 0."""
    if not width:
        return np.zeros_like(tokens)
    return _shapes_s(dep, tokens, mlp_shapes(dep.model, width, dep.tp))


def lm_head_s(dep: EngineShape, sampled: float) -> float:
    """The LM head over the sequences that sample a token this step (vocab split over tp)."""
    if sampled <= 0:
        return 0.0
    return float(_lm_head_gemms_s(dep, np.array([sampled], dtype=np.float64))[0])


def _lm_head_gemms_s(dep: EngineShape, sampled: FloatArray) -> FloatArray:
    """The LM head at each count of sampling rows. vLLM never quantizes it: its
    ``ParallelLMHead`` is an embedding, not a linear layer, so fp8 and int4 checkpoints
    run it in 16 bits (their weights' bytes count it so too, ``perf.weight_bytes``).
    TensorRT-LLM builds its ``LMHead`` without a quant config, so it runs in 16 bits too.
    ``Efficiency.fp8_as_timed``: in the weights' dtype, like every other GEMM."""
    m = dep.model
    kernels = dep.efficiency.kernels
    if kernels is not None and kernels.engine in SIXTEEN_BIT_LM_HEAD and not _as_timed(dep):
        dep = replace(dep, weight_dtype="bf16")
    return _gemms_s(dep, sampled, m.vocab_size / dep.tp, float(m.hidden_size))


class StepModel:
    """One deployment's step time, compiled: the token-dependent kernels tabulated once.

    The GEMMs, MoE, all-reduces and LM head depend on the step's token count only, so they
    are tabulated on a log2 grid (1/8 octave, up to 2^17 tokens) and interpolated; the
    attention terms are evaluated per call. The search evaluates tens of thousands of steps,
    and re-summing every GEMM each time would cost more than the 100 ms a search may take.
    """

    def __init__(self, dep: EngineShape) -> None:
        self.dep = dep
        self.gemm, self.allreduce, self.lm_head = _token_tables(dep)
        self.by_tokens = self.gemm + self.allreduce
        m, eff = dep.model, dep.efficiency
        kernels = eff.kernels
        self.decode, self.prefill = (
            kernels.attention_curves(dep.kv_dtype) if kernels else (IDEAL, IDEAL)
        )
        self.q_heads = m.num_heads / dep.tp
        self.kv_heads = max(m.num_kv_heads / dep.tp, 1.0)
        self.kv_bytes_per_token_layer = (
            m.kv_elements_per_token_layer(dep.tp) * BYTES_PER_DTYPE[dep.kv_dtype]
        )
        self.decode_head_dim, self.prefill_head_dim = attention_head_dims(m)
        self.bw, self.peak = credited_rates(dep, "bf16")
        self.sustained = sustained(dep, "bf16")
        # attention runs in 16-bit on every GPU; a borrowed GPU's curves refer to these
        self.measured_on = measured_on(dep, "bf16")
        self.overhead_s = eff.overhead.step_s + m.num_layers * eff.overhead.layer_s
        self.elementwise_s_per_token = m.num_layers * elementwise_s(dep)
        self.scale = eff.time_scale

    def _grid(self, table: FloatArray, tokens: float) -> float:
        if tokens <= 0:
            return 0.0
        if tokens < 1.0:  # fractional mean batches below one sequence scale down linearly
            return float(table[0]) * tokens
        x = math.log2(tokens) * GRID_STEPS_PER_OCTAVE
        i = min(int(x), len(table) - 2)
        return float(table[i] + (x - i) * (table[i + 1] - table[i]))

    def parts(
        self, decode_seqs: float, context: float, prefill: float, attended: float
    ) -> tuple[float, float, float]:
        """Unscaled (GEMM + LM head, attention, all-reduce) seconds of one step."""
        tokens = decode_seqs + prefill
        sampled = decode_seqs + (1.0 if prefill > 0 else 0.0)
        gemm = self._grid(self.gemm, tokens) + self._grid(self.lm_head, sampled)
        layers = self.dep.model.num_layers
        return (
            gemm,
            layers * self._attention(decode_seqs, context, prefill, attended),
            (self._grid(self.allreduce, tokens)),
        )

    def _attention(
        self, decode_seqs: float, context: float, prefill: float, attended: float
    ) -> float:
        seqs, ctx, chunk, pairs = (
            np.array([[v]], dtype=np.float64) for v in (decode_seqs, context, prefill, attended)
        )
        return float(_attention_rows([self], seqs, ctx, chunk, pairs)[0, 0])


def attention_head_dims(m: ModelSpec) -> tuple[float, float]:
    """The head width d that 4 · heads · d FLOPs per query-key pair count, in decode and
    in prefill. MLA decodes over the latent (vLLM absorbs the expansion into the query
    and output): QK over kv_lora + rope, PV over kv_lora, so d = (2 · kv_lora + rope) /
    2; it prefills on expanded heads, QK over nope + rope and PV over v. MLA's attention
    is priced by the measured attention curves at those bytes and FLOPs: no MLA kernel
    was measured."""
    if not m.is_mla:
        return float(m.head_dim), float(m.head_dim)
    decode = (2.0 * m.kv_lora_rank + m.qk_rope_head_dim) / 2.0
    prefill = (m.qk_nope_head_dim + m.qk_rope_head_dim + m.v_head_dim) / 2.0
    return decode, prefill


def scaled_totals_s(unscaled: FloatArray, scale: FloatArray, floor: FloatArray) -> FloatArray:
    """Step seconds from the kernels' unscaled sums (``unscaled_totals_s``), a D × 1
    column of step-time factors and the physical floor: max(sum · factor, floor)."""
    out: FloatArray = np.maximum(unscaled * scale, floor)
    return out


def unscaled_totals_s(
    models: Sequence[StepModel],
    decode_seqs: FloatArray,
    context: FloatArray,
    prefill: FloatArray,
    attended: FloatArray,
    queries: float | FloatArray = 1.0,
) -> FloatArray:
    """The kernels' sum per step of many deployments at once, before the step-time
    factor and the floor (s; same sum as ``StepModel.parts``): apart from them so a new
    factor reuses it (``scaled_totals_s``).

    Every array is D × N: row d holds steps of ``models[d]``. The search times all its
    candidates' batch grids in this one call: per deployment, numpy's call overhead on a
    few dozen steps costs more than the arithmetic. ``queries`` is the tokens each
    decoding sequence brings to the step: 1, or K + 1 when a speculative step verifies
    K draft tokens (``speculative``): the GEMMs and the LM head run over decode_seqs ·
    queries rows, and decode attention reads each sequence's KV once for all its
    queries (its FLOPs grow with them, its bytes do not); a D × 1 column gives each
    row its own.
    """
    tokens = decode_seqs * queries + prefill
    sampled = decode_seqs * queries + np.where(prefill > 0, 1.0, 0.0)
    gemm = _grid_rows(np.stack([m.by_tokens for m in models]), tokens) + _grid_rows(
        np.stack([m.lm_head for m in models]), sampled
    )
    attention = np.zeros_like(tokens)
    groups: dict[tuple[int, int], list[int]] = {}
    for row, m in enumerate(models):  # models sharing attention curves: one call each
        groups.setdefault((id(m.decode), id(m.prefill)), []).append(row)
    for rows in groups.values():
        part = [models[r] for r in rows]
        own = queries[rows] if isinstance(queries, np.ndarray) else queries
        attention[rows] = _attention_rows(
            part, decode_seqs[rows], context[rows], prefill[rows], attended[rows], own
        )
    layers = column([m.dep.model.num_layers for m in models])
    overhead = (
        column([m.overhead_s for m in models])
        + column([m.elementwise_s_per_token for m in models]) * tokens
    )
    out: FloatArray = gemm + layers * attention + overhead
    return out


def _attention_rows(
    models: list[StepModel],
    decode_seqs: FloatArray,
    context: FloatArray,
    prefill: FloatArray,
    attended: FloatArray,
    queries: float | FloatArray = 1.0,
) -> FloatArray:
    """One layer's attention seconds for models that share their attention curves
    (``queries``: query tokens per decoding sequence, ``unscaled_totals_s``)."""
    first = models[0]
    q_heads = column([m.q_heads for m in models])
    kv_heads = column([m.kv_heads for m in models])
    head_dim = column([m.decode_head_dim for m in models])
    prefill_dim = column([m.prefill_head_dim for m in models])
    kv_bytes = column([m.kv_bytes_per_token_layer for m in models])
    bw, peak = column([m.bw for m in models]), column([m.peak for m in models])
    kept = column([m.sustained for m in models])
    measured = _measured_columns(models)
    seqs = np.maximum(decode_seqs, 1e-9)
    decode = first.decode.times_s(
        context * kv_bytes,
        4.0 * q_heads * head_dim * context * queries,
        context / seqs,
        bw,
        peak,
        decode_seqs,
        measured,
        kept,
    )
    chunk = np.maximum(prefill, 1e-9)
    moved = prefill * (q_heads + 2.0 * kv_heads) * prefill_dim * ACTIVATION_BYTES
    pre = first.prefill.times_s(
        moved,
        4.0 * q_heads * prefill_dim * attended,
        2.0 * attended / chunk,
        bw,
        peak,
        measured_on=measured,
        sustained=kept,
    )
    out: FloatArray = np.where(decode_seqs > 0, decode, 0.0) + np.where(prefill > 0, pre, 0.0)
    return out


def _measured_columns(models: list[StepModel]) -> tuple[FloatArray, FloatArray] | None:
    """The measured GPUs' peaks as D × 1 columns (a GPU's own where it is not borrowing),
    or None when no model borrows: then the curves run on each GPU's own peaks."""
    if all(m.measured_on is None for m in models):
        return None
    rates = [m.measured_on or (m.bw, m.peak) for m in models]
    return column([r[0] for r in rates]), column([r[1] for r in rates])


def _grid_rows(tables: FloatArray, tokens: FloatArray) -> FloatArray:
    """Row d of ``tokens`` interpolated in row d of ``tables`` (the log2 token grid; flat
    beyond its end, proportional below one token)."""
    x = np.log2(np.maximum(tokens, 1.0)) * GRID_STEPS_PER_OCTAVE
    last = tables.shape[1] - 1
    i = np.minimum(x.astype(np.int64), last - 1)
    frac = np.minimum(x - i, 1.0)
    rows = np.arange(tables.shape[0])[:, None]
    low = tables[rows, i]
    grid = low + frac * (tables[rows, i + 1] - low)
    out: FloatArray = np.where(tokens < 1.0, tables[:, :1] * np.maximum(tokens, 0.0), grid)
    return out


Tables = tuple[FloatArray, FloatArray, FloatArray]
_TABLES: OrderedDict[tuple[object, ...], Tables] = OrderedDict()


def _token_tables(dep: EngineShape) -> Tables:
    """(GEMM + MoE, all-reduce, LM head) seconds on the token grid, cached by shape."""
    m = dep.model
    key = (
        m.id,
        m.num_layers,
        m.hidden_size,
        m.num_heads,
        m.num_kv_heads,
        m.head_dim,
        m.intermediate_size,
        m.vocab_size,
        m.num_experts,
        m.experts_per_token,
        m.kv_lora_rank,
        m.q_lora_rank,
        m.qk_nope_head_dim,
        m.qk_rope_head_dim,
        m.v_head_dim,
        m.shared_expert_size,
        m.dense_layers,
        m.dense_intermediate_size,
        dep.gpu.id,
        dep.gpu.hbm_bytes_per_s,
        dep.gpu.link_bytes_per_s(dep.tp),
        tuple(sorted(dep.gpu.dense_flops_per_s.items())),
        dep.tp,
        dep.weight_dtype,
        id(dep.efficiency.kernels),
        _quant_key(dep),
    )
    tables = _TABLES.get(key)
    if tables is None:
        points = np.exp2(
            np.arange(GRID_OCTAVES * GRID_STEPS_PER_OCTAVE + 1) / GRID_STEPS_PER_OCTAVE
        )
        gemm, reduce = _token_costs(dep, points)
        lm_head = _lm_head_gemms_s(dep, points)
        tables = _TABLES[key] = (gemm, reduce, lm_head)
        if len(_TABLES) > _MODELS_MAX:
            _TABLES.popitem(last=False)
    return tables


def _quant_key(dep: EngineShape) -> tuple[object, ...]:
    """What the unfused fp8 quants of ``dep`` depend on beyond its model and GPU: which
    inputs (the KV dtype decides one of TensorRT-LLM's) and which curve."""
    kernels = _quantizing(dep)
    if kernels is None:
        return ()
    return (_as_timed(dep), tuple(unfused_quant_inputs(dep, kernels.engine)))


_MODELS: OrderedDict[int, tuple[EngineShape, StepModel]] = OrderedDict()
_MODELS_MAX = 512


def step_model(dep: EngineShape) -> StepModel:
    """The compiled step model of ``dep`` (an LRU keyed by identity; the entry keeps the
    deployment alive so its id is not reused while cached)."""
    entry = _MODELS.get(id(dep))
    if entry is not None and entry[0] is dep:
        _MODELS.move_to_end(id(dep))
        return entry[1]
    model = StepModel(dep)
    _MODELS[id(dep)] = (dep, model)
    if len(_MODELS) > _MODELS_MAX:
        _MODELS.popitem(last=False)
    return model


__all__ = [
    "KernelCurves",
    "StepModel",
    "gemm_s",
    "lm_head_s",
    "moe_s",
    "step_model",
    "unscaled_totals_s",
    "scaled_totals_s",
]

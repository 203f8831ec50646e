"""Roofline performance model: memory, decode step, prefill, static and continuous batching.

All quantities are SI: bytes, seconds, FLOP. The model follows the seed derivations (checked
in tests/unit/planner/test_seeds.py): a decode step must stream every weight byte and every
cached KV byte from HBM once, and must do 2 FLOP per active parameter per token; whichever
takes longer bounds the step (000, 002). Tensor parallelism (TP) splits both across ``tp``
GPUs and adds two all-reduces per layer (003). Real engines add fixed costs per step and per
layer (scheduling, sampling, kernel launches); those and the achievable fractions of peak
bandwidth and FLOP/s are *fitted* on measured data (``rooftop_fit.kernel_fit``), never guessed.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from rooftop_planner import host_time, kernel_model
from rooftop_planner.catalog import BYTES_PER_DTYPE, GpuSpec, ModelSpec
from rooftop_planner.efficiency import Efficiency
from rooftop_planner.kernels import FloatArray, column

GIB = 1024**3
# CUDA context, NCCL buffers, CUDA graphs and allocator slack that vLLM does not give to KV.
RUNTIME_RESERVE_BYTES = 1.5 * GIB
DEFAULT_GPU_MEMORY_UTILIZATION = 0.90  # vLLM's default --gpu-memory-utilization
# Tokens per engine step (chunked prefill). vLLM's API server defaults to 8,192 on H100 and
# H200 only; the operator passes this value on every GPU, so plans and pods agree.
DEFAULT_MAX_NUM_BATCHED_TOKENS = 8192
DEFAULT_MAX_NUM_SEQS = 256
BLOCK_TOKENS = 16  # vLLM's default KV block size


@dataclass(frozen=True)
class EngineShape:
    """One engine replica's shape: which model, on which GPU, how sharded and stored."""

    model: ModelSpec
    gpu: GpuSpec
    tp: int = 1
    weight_dtype: str = "bf16"
    kv_dtype: str = "auto"
    efficiency: Efficiency = Efficiency()

    @property
    def compute_dtype(self) -> str:
        """The tensor-core dtype matmuls run in: fp8/int8/fp4 only where the GPU has them.

        Weight-only formats (int4 AWQ/GPTQ, fp8 on Ampere) dequantize to bf16.
        """
        if self.weight_dtype in ("fp8", "int8", "fp4") and (
            self.weight_dtype in self.gpu.dense_flops_per_s
        ):
            return self.weight_dtype
        return "bf16"


# ---------------------------------------------------------------- memory


def kv_bytes_per_token(model: ModelSpec, kv_dtype: str) -> float:
    """KV cache bytes for one token across all layers: 2 · L · kv_heads · head_dim · bytes.

    The 2 is one K and one V vector. Grouped-query attention shares each KV head among
    ``num_heads / num_kv_heads`` query heads, which is why 70B models cache 8, not 64.
    Example: LLaMA 3-70B in int8 -> 2 · 80 · 8 · 128 · 1 = 160 KiB. An MLA model caches
    L · (kv_lora_rank + qk_rope_head_dim) · bytes instead (DeepSeek-V3 in 16 bits:
    61 · 576 · 2 = 69 KiB).
    """
    return kv_bytes_per_token_per_gpu(model, kv_dtype, 1)


def kv_bytes_per_token_per_gpu(model: ModelSpec, kv_dtype: str, tp: int) -> float:
    """KV bytes per token on one GPU: KV heads are split over TP, replicated when tp >
    heads; an MLA latent is whole on every GPU (``ModelSpec.kv_elements_per_token_layer``)."""
    per_layer = model.kv_elements_per_token_layer(tp) * BYTES_PER_DTYPE[kv_dtype]
    return model.num_layers * per_layer


def cached_tokens(model: ModelSpec, context_tokens: float) -> float:
    """Tokens of KV one sequence of ``context_tokens`` keeps, in whole-model tokens
    (the per-token bytes above): a layer with a sliding window of W holds min(c, W), the
    others c, so with w of L layers windowed the sequence holds
    ((L − w) · c + w · min(c, W)) / L. Mistral v0.1 windows all layers (4,096); Gemma 2
    half, Gemma 3 five in six. Sums over sequences add these per-sequence figures: the
    window caps each sequence, never a batch's total."""
    windowed = model.window_layers
    if not windowed or model.sliding_window is None:
        return context_tokens
    capped = min(context_tokens, float(model.sliding_window))
    full = model.num_layers - windowed
    return (full * context_tokens + windowed * capped) / model.num_layers


def attended_pairs(model: ModelSpec, chunk_tokens: FloatArray, attended: FloatArray) -> FloatArray:
    """Query-key pairs a prefill chunk computes, in whole-model pairs: in a windowed
    layer each of the chunk's tokens attends at most W keys, so the chunk's pairs are
    min(pairs, chunk · W) there, layer-weighted as in ``cached_tokens``."""
    windowed = model.window_layers
    if not windowed or model.sliding_window is None:
        return attended
    capped = np.minimum(attended, chunk_tokens * float(model.sliding_window))
    full = model.num_layers - windowed
    out: FloatArray = (full * attended + windowed * capped) / model.num_layers
    return out


def weight_bytes(model: ModelSpec, weight_dtype: str) -> float:
    """Bytes of all weights. Embedding and LM head stay 16-bit when the body is quantized."""
    embedding_params = 2.0 * model.vocab_size * model.hidden_size
    body = max(model.param_count - embedding_params, 0.0)
    return body * BYTES_PER_DTYPE[weight_dtype] + embedding_params * 2.0


def weight_bytes_per_gpu(dep: EngineShape) -> float:
    """Weights are sharded evenly over TP ranks (vLLM also splits the vocabulary)."""
    return weight_bytes(dep.model, dep.weight_dtype) / dep.tp


def activation_reserve_bytes(dep: EngineShape, max_num_batched_tokens: int) -> float:
    """Peak activation memory vLLM's profiling run reserves, per GPU.

    The widest tensors are the MLP's gate+up output (tokens · 2 · intermediate / tp, 16-bit)
    and the logits of sampled sequences; a fixed reserve covers context and graphs.
    """
    m = dep.model
    widest = max(m.intermediate_size, m.dense_intermediate_size, m.shared_expert_size)
    mlp = max_num_batched_tokens * 2 * widest * 2.0 / dep.tp
    return RUNTIME_RESERVE_BYTES + mlp


def kv_capacity_tokens(
    dep: EngineShape,
    gpu_memory_utilization: float = DEFAULT_GPU_MEMORY_UTILIZATION,
    max_num_batched_tokens: int = DEFAULT_MAX_NUM_BATCHED_TOKENS,
    free_memory_fraction: float | None = None,
) -> int:
    """Tokens the KV cache holds: (HBM · util − weights − activations) / KV bytes per token
    (vLLM's and SGLang's budget: a share of all memory), or with ``free_memory_fraction``
    f, f · (HBM − weights − activations) / KV bytes per token (TensorRT-LLM's
    ``free_gpu_memory_fraction``: a share of what the loaded model leaves)."""
    loaded = weight_bytes_per_gpu(dep) + activation_reserve_bytes(dep, max_num_batched_tokens)
    if free_memory_fraction is None:
        free = dep.gpu.hbm_bytes * gpu_memory_utilization - loaded
    else:
        free = (dep.gpu.hbm_bytes - loaded) * free_memory_fraction
    per_token = kv_bytes_per_token_per_gpu(dep.model, dep.kv_dtype, dep.tp)
    return max(int(free / per_token), 0)


def max_sequences(free_bytes: float, kv_bytes_per_sequence: float) -> int:
    """Sequences that fit: free HBM after weights over KV bytes per full-length sequence.

    Example: LLaMA-7B fp16 needs ≈2 GB per 4K-token sequence, so ≈5 fit on 24 GB
    and ≈33 on 80 GB once 14 GB of weights are loaded.
    """
    return max(int(free_bytes // kv_bytes_per_sequence), 0)


def max_sequences_fitting(
    dep: EngineShape,
    tokens_per_sequence: float,
    gpu_memory_utilization: float = DEFAULT_GPU_MEMORY_UTILIZATION,
    max_num_batched_tokens: int = DEFAULT_MAX_NUM_BATCHED_TOKENS,
    free_memory_fraction: float | None = None,
) -> int:
    """Sequences of ``tokens_per_sequence`` whose KV blocks fit in one replica's cache."""
    blocks = math.ceil(cached_tokens(dep.model, tokens_per_sequence) / BLOCK_TOKENS)
    capacity = kv_capacity_tokens(
        dep, gpu_memory_utilization, max_num_batched_tokens, free_memory_fraction
    )
    return capacity // max(blocks * BLOCK_TOKENS, 1)


def optimal_batch_size(
    peak_flops_per_s: float, hbm_bytes_per_s: float, bytes_per_param: float
) -> float:
    """The critical batch: B* = peak FLOP/s · bytes per parameter / (2 · HBM bytes/s).

    Below B* a decode step is memory-bound (FLOPs are wasted), above it compute-bound.
    A10G/A100 in fp16 give ≈ 230/306.
    """
    return peak_flops_per_s * bytes_per_param / (2.0 * hbm_bytes_per_s)


# ---------------------------------------------------------------- step time


@dataclass(frozen=True)
class StepBreakdown:
    """Where one engine step's time goes, seconds (already scaled by the online factor).

    Attributes:
        gemm_s: the layers' matmuls (QKV, output projection, MLP or MoE) and the LM head.
        attention_s: decode attention over the cached KV plus the prefill chunk's attention.
        allreduce_s: two tensor-parallel all-reduces per layer.
        overhead_s: the engine's fixed costs outside the timed kernels, per step and per
            layer (scheduling, launch).
        floor_s: (weight bytes touched + KV bytes read) / HBM bandwidth: no step is faster.
        elementwise_s: the elementwise kernels (norms, rotary, activation, KV-cache
            writes), which grow with the step's tokens.
        host_s: the engine's own host work for the step (vLLM's, measured:
            ``host_time.vllm_step_host_s``), which async scheduling overlaps with the
            GPU's: no step is faster either.
    """

    gemm_s: float
    attention_s: float
    allreduce_s: float
    overhead_s: float
    floor_s: float
    elementwise_s: float = 0.0
    host_s: float = 0.0

    @property
    def kernels_s(self) -> float:
        """Every part's sum (``STEP_PARTS``), before the floor."""
        return float(sum(getattr(self, part) for part in STEP_PARTS))

    @property
    def total_s(self) -> float:
        """The step time: the kernels' sum, never below the physical floor nor the
        host's work."""
        return max(self.kernels_s, self.floor_s, self.host_s)


# The parts of a step that add up to its time (``floor_s`` bounds them instead).
STEP_PARTS = ("gemm_s", "attention_s", "allreduce_s", "overhead_s", "elementwise_s")


def floor_s(dep: EngineShape, tokens: float, context_tokens: float) -> float:
    """The physical floor of one step: every weight byte touched and every cached KV byte
    read streams from HBM once at peak bandwidth (seconds). MoE touches only the experts
    its tokens route to: E · (1 − (1 − k/E)^tokens) in expectation. ``context_tokens``:
    the sequences' cached KV (each capped by ``cached_tokens``), summed."""
    cached = np.array([[context_tokens]], dtype=np.float64)
    return float(_floors_s([dep], np.array([[tokens]], dtype=np.float64), cached)[0, 0])


def step_breakdown(
    dep: EngineShape,
    decode_seqs: float,
    context_tokens: float,
    prefill_tokens: float = 0.0,
    prefill_attended: float = 0.0,
) -> StepBreakdown:
    """One engine step that decodes ``decode_seqs`` and prefills ``prefill_tokens``.

    step = overhead(m) + L · (GEMMs(m) + attention + 2 all-reduces) + LM head, each kernel
    t = t0 + smoothmax(bytes / (BW · η_mem), FLOPs / (peak · min(η_flop, s))) with the
    fitted fractions η of ``kernels`` and the sustained share s of peak FLOP/s
    (``catalog.SUSTAINED_FLOP_FRACTION``); m = decode_seqs + prefill_tokens is the step's token
    count. ``context_tokens`` is the total cached context of the decoding sequences (KV
    read once per step), each sequence's capped by ``cached_tokens`` before the sum;
    ``prefill_attended`` the sum over prefill tokens of the keys each attends (a window
    caps it here, ``attended_pairs``). With no fitted curves every η is 1 and fixed
    costs are 0 (the ideal roofline).
    """
    model = kernel_model.step_model(dep)
    pairs = prefill_attended
    if dep.model.window_layers:  # the rest attend every key (and this runs per tick)
        chunk, attended = np.array([prefill_tokens]), np.array([prefill_attended])
        pairs = float(attended_pairs(dep.model, chunk, attended)[0])
    gemm, attention, allreduce = model.parts(decode_seqs, context_tokens, prefill_tokens, pairs)
    scale = model.scale
    return StepBreakdown(
        gemm_s=gemm * scale,
        attention_s=attention * scale,
        allreduce_s=allreduce * scale,
        overhead_s=model.overhead_s * scale,
        floor_s=floor_s(dep, decode_seqs + prefill_tokens, context_tokens),
        elementwise_s=model.elementwise_s_per_token * (decode_seqs + prefill_tokens) * scale,
        host_s=float(
            host_step_s(
                [dep],
                np.array([[decode_seqs]]),
                np.array([[context_tokens]]),
                np.array([[prefill_tokens]]),
            )[0, 0]
        ),
    )


def forward_time_s(
    dep: EngineShape,
    decode_seqs: float,
    context_tokens: float,
    prefill_tokens: float = 0.0,
    prefill_attended: float = 0.0,
) -> float:
    """Seconds of one engine step (see ``step_breakdown`` for the sum it is)."""
    return step_breakdown(
        dep, decode_seqs, context_tokens, prefill_tokens, prefill_attended
    ).total_s


def forward_parts(
    deps: Sequence[EngineShape],
    decode_seqs: FloatArray,
    context_tokens: FloatArray,
    prefill_tokens: FloatArray,
    prefill_attended: FloatArray,
    queries: float | FloatArray = 1.0,
) -> tuple[FloatArray, FloatArray]:
    """``forward_time_s`` over D × N arrays of steps (row d is a grid of ``deps[d]``'s),
    in its two parts (s): the kernels' sum before the step-time factor, and the physical
    floor. Neither depends on the factor, so a search at a new one reuses them; the
    steps are ``kernel_model.scaled_totals_s(sum, step_time_scales(deps), floor)``.
    ``queries``: tokens per decoding sequence (K + 1 in a step verifying K draft tokens,
    ``kernel_model.unscaled_totals_s``)."""
    floor = _floors_s(deps, decode_seqs * queries + prefill_tokens, context_tokens)
    floor = np.maximum(floor, host_step_s(deps, decode_seqs, context_tokens, prefill_tokens))
    models = [kernel_model.step_model(d) for d in deps]
    pairs = prefill_attended
    if any(d.model.window_layers for d in deps):
        rows = enumerate(deps)
        pairs = np.stack([attended_pairs(d.model, prefill_tokens[r], pairs[r]) for r, d in rows])
    unscaled = kernel_model.unscaled_totals_s(
        models, decode_seqs, context_tokens, prefill_tokens, pairs, queries
    )
    return unscaled, floor


def host_step_s(
    deps: Sequence[EngineShape],
    decode_seqs: FloatArray,
    context_tokens: FloatArray,
    prefill_tokens: FloatArray,
) -> FloatArray:
    """The engine's own host work per step over D × N arrays (s): vLLM's, measured, for
    the decoding sequences and the prompt a chunk belongs to (``host_time``); 0 for
    engines whose host work is not measured, and for the ideal roofline."""
    seqs = decode_seqs + np.where(prefill_tokens > 0, 1.0, 0.0)
    timed = column([float(_host_timed(d)) for d in deps])
    if not timed.any():
        return np.zeros_like(seqs)
    out: FloatArray = timed * host_time.vllm_step_host_s(seqs, context_tokens)
    return out


def _host_timed(dep: EngineShape) -> bool:
    kernels = dep.efficiency.kernels
    return kernels is not None and kernels.engine in host_time.HOST_TIMED_ENGINES


def step_time_scales(deps: Sequence[EngineShape]) -> FloatArray:
    """The step-time factor of each deployment, a D × 1 column."""
    return column([d.efficiency.time_scale for d in deps])


def _floors_s(deps: Sequence[EngineShape], tokens: FloatArray, cached: FloatArray) -> FloatArray:
    """``floor_s`` over D × N arrays (``cached``: context already capped by a window).

    MoE weights touched: E · (1 − (1 − k/E)^tokens) of the E experts (the same count
    ``moe_s`` times), each expert_params · bytes / tp.
    """
    weights = column([weight_bytes_per_gpu(d) for d in deps]) + np.zeros_like(tokens)
    for row, dep in enumerate(deps):
        model = dep.model
        if model.is_moe:
            expert_bytes = model.expert_param_count * BYTES_PER_DTYPE[dep.weight_dtype] / dep.tp
            k_over_e = model.experts_per_token / model.num_experts
            touched = model.num_experts * (1.0 - (1.0 - k_over_e) ** np.maximum(tokens[row], 1.0))
            weights[row] -= (model.num_experts - touched) * expert_bytes
    kv = cached * column([kv_bytes_per_token_per_gpu(d.model, d.kv_dtype, d.tp) for d in deps])
    out: FloatArray = (weights + kv) / column([d.gpu.hbm_bytes_per_s for d in deps])
    return out


def decode_step_s(dep: EngineShape, batch: float, context_per_seq: float) -> float:
    """One decode step for ``batch`` sequences each holding ``context_per_seq`` tokens."""
    return forward_time_s(dep, batch, batch * cached_tokens(dep.model, context_per_seq))


def prefill_s(dep: EngineShape, batch: float, prompt_tokens: float) -> float:
    """Prefill of ``batch`` prompts of ``prompt_tokens`` each (compute-bound).

    Causal attention over a prompt of length l costs 4 · heads · head_dim · l²/2 per layer.
    """
    tokens = batch * prompt_tokens
    attended = tokens * prompt_tokens / 2.0
    return forward_time_s(dep, 0.0, 0.0, prefill_tokens=tokens, prefill_attended=attended)

"""Serving-level predictions: static batches and continuous batching at a concurrency.

Built on the step and prefill times of ``perf``. Continuous batching (vLLM, SGLang,
TensorRT-LLM in-flight batching) is modelled as a steady state: ``C`` requests are in
flight, each decode step advances every running sequence by one token and carries the
prefill chunks of newly admitted requests (chunked prefill). Requests beyond the batch
cap or the KV capacity wait in a queue (Little's law gives their wait).
"""

from __future__ import annotations

import math
from dataclasses import dataclass, replace
from typing import TypeVar

from rooftop_planner import perf
from rooftop_planner.kernels import FloatArray
from rooftop_planner.perf import EngineShape

# Steps a request spends in the batch beyond its decode steps: its prefill and its
# wait for a slot, about one and a half steps in steady state.
STEPS_BEYOND_DECODE = 1.5

Num = TypeVar("Num", float, FloatArray)


def admissions_per_step(batch: Num, osl: float) -> Num:
    """a = B / (osl + 1.5): requests admitted per step when B sequences run and each
    stays osl + 1.5 steps (Little's law over steps)."""
    return batch / (osl + STEPS_BEYOND_DECODE)


def mean_step_s(decode_s: Num, admission_s: Num, batch: Num, osl: float) -> Num:
    """The serving model of one replica at running batch B: the mean step, s.

    t̄ = t_d + a · Δ, where t_d is a plain decode step of B sequences, a = B / (osl + 1.5)
    the admissions per step and Δ what one admission adds: its prompt rides in c steps,
    each carrying a chunk beside the decodes (t_c), so Δ = c · (t_c − t_d). The search,
    ``predict_continuous`` (which the controller calibrates against) and the simulator's
    oracle all compute t̄ here; arrays (the search's grids) or floats.
    """
    return decode_s + admissions_per_step(batch, osl) * admission_s


@dataclass(frozen=True)
class Prediction:
    """Predicted latency and throughput of one replica. Times in seconds.

    Attributes:
        tpot_s: mean time per output token after the first: the mean decode step, and
            the steps an evicted request waits out of the batch (``evictions``).
        ttft_s: mean time to first token, queueing included.
        output_tok_s: output tokens per second of the whole replica.
        batch: sequences decoding concurrently.
        fits: False when not even one sequence of this length fits in memory.
        reason: why it does not fit, else "".
        step: where the mean decode step's time goes, its physical floor included.
        evictions: times a request is evicted from a full KV cache and prefilled again,
            on average (``recompute_tokens``); 0 when the cache does not bind.
        queue_wait_s: the part of ``ttft_s`` a request waits for a running slot
            (clients beyond the running batch).
    """

    tpot_s: float
    ttft_s: float
    output_tok_s: float
    batch: float
    fits: bool = True
    reason: str = ""
    step: perf.StepBreakdown | None = None
    evictions: float = 0.0
    queue_wait_s: float = 0.0

    @property
    def mean_step_s(self) -> float:
        """The mean step (s), 0 without one (nothing fits)."""
        return self.step.total_s if self.step else 0.0

    @property
    def floor_s(self) -> float:
        """The mean step's physical floor (weights + KV read at peak HBM bandwidth), s."""
        return self.step.floor_s if self.step else 0.0

    @property
    def tpot_ms(self) -> float:
        return self.tpot_s * 1e3

    @property
    def ttft_ms(self) -> float:
        return self.ttft_s * 1e3


def _does_not_fit(dep: EngineShape, tokens: float) -> Prediction:
    free = perf.kv_capacity_tokens(dep)
    reason = (
        f"{dep.model.id} ({dep.weight_dtype}) on {dep.tp}x {dep.gpu.id}: a {tokens:.0f}-token "
        f"sequence needs more KV cache than the {free} tokens left after weights"
    )
    return Prediction(math.inf, math.inf, 0.0, 0.0, fits=False, reason=reason)


def predict_static(dep: EngineShape, batch: int, isl: int, osl: int) -> Prediction:
    """One static batch: all prompts prefilled together, then ``osl`` decode steps.

    TTFT = prefill(batch · isl); TPOT = step(batch, isl + osl/2) (mean context);
    output tokens/s = batch · osl / (TTFT + (osl − 1) · TPOT).
    """
    ttft = perf.prefill_s(dep, batch, isl)
    context = batch * perf.cached_tokens(dep.model, isl + osl / 2.0)
    step = perf.step_breakdown(dep, batch, context)
    tpot = step.total_s
    total = ttft + max(osl - 1, 0) * tpot
    fitting = perf.max_sequences_fitting(dep, isl + osl)
    # Times are still predicted when the batch overflows our memory estimate: engines with
    # smaller runtime reserves or on-demand KV allocation do run such batches.
    reason = (
        ""
        if fitting >= batch
        else (
            f"batch {batch} exceeds the {fitting} sequences whose KV fits on {dep.tp}x {dep.gpu.id}"
        )
    )
    return Prediction(
        tpot_s=tpot,
        ttft_s=ttft,
        output_tok_s=batch * osl / total,
        batch=float(batch),
        fits=not reason,
        reason=reason,
        step=step,
    )


@dataclass(frozen=True)
class EngineLimits:
    """Scheduler caps of the engine (vLLM names).

    ``mixed_prefill``: a prompt's chunk rides in a step beside the running decodes (vLLM's
    chunked prefill, TensorRT-LLM's chunked context). False: the engine runs a waiting
    prompt as a prefill batch of its own first and the decodes wait for it (SGLang's
    default, ``enable_mixed_chunk`` off); ``max_num_batched_tokens`` is then the prefill
    chunk size.

    ``free_memory_fraction``: the KV cache takes this share of the memory the loaded model
    leaves (TensorRT-LLM's ``free_gpu_memory_fraction``) instead of
    ``gpu_memory_utilization`` of all of it. ``reserve_whole_request``: a request is
    admitted only when the cache holds its prompt and its whole answer (TensorRT-LLM's
    default ``GUARANTEED_NO_EVICT``); otherwise blocks are taken as tokens come, and a
    running request holds its prompt and half its answer on average.

    ``preempts_when_full``: a waiting prompt is admitted whenever its tokens fit now, not
    counting what the running sequences will still grow, and a running sequence that
    finds no free block evicts the newest one, which is prefilled again later (vLLM's
    scheduler: no watermark by default, recompute preemption). See ``recompute_tokens``.
    """

    max_num_seqs: int = perf.DEFAULT_MAX_NUM_SEQS
    max_num_batched_tokens: int = perf.DEFAULT_MAX_NUM_BATCHED_TOKENS
    gpu_memory_utilization: float = perf.DEFAULT_GPU_MEMORY_UTILIZATION
    mixed_prefill: bool = True
    free_memory_fraction: float | None = None
    reserve_whole_request: bool = False
    preempts_when_full: bool = False


def kv_limit(dep: EngineShape, isl: float, osl: float, limits: EngineLimits) -> float:
    """Sequences the KV cache holds at once.

    A running sequence holds isl + osl/2 tokens on average (blocks grow as it decodes),
    or isl + osl where the engine reserves a whole request's blocks up front.
    """
    capacity = perf.kv_capacity_tokens(
        dep,
        limits.gpu_memory_utilization,
        limits.max_num_batched_tokens,
        limits.free_memory_fraction,
    )
    held = osl if limits.reserve_whole_request else osl / 2.0
    per_seq = perf.cached_tokens(dep.model, isl + held)
    return capacity / max(per_seq, 1.0)


def running_batch(
    dep: EngineShape, concurrency: float, isl: float, osl: float, limits: EngineLimits
) -> float:
    """Sequences that actually run: min(concurrency, max_num_seqs, KV capacity)."""
    held = kv_limit(dep, isl, osl, limits)
    return max(min(concurrency, float(limits.max_num_seqs), held), 0.0)


# Evictions from a full KV cache, as the engine simulator's vLLM scheduler makes them
# (benchmarks/bench_preemption.py): the newest running sequence is evicted 0.16-0.28 of
# the way through its answer; the tokens prefilled again per request fall from about osl
# at a few dozen running sequences to half of it at 700-800 (1 / (1 + B / 750)); an
# evicted request waits 0.14-0.18 · osl steps out of the batch per eviction once the
# clients exceed the running sequences by half or more, about 0.07 · osl at a fifth more.
EVICTED_AT_ANSWER_SHARE = 0.25
EVICTED_RECOMPUTE_HALF_AT_BATCH = 750.0
EVICTED_WAIT_ANSWER_SHARE = 0.18
EVICTED_WAIT_FULL_AT_EXCESS = 0.5


def admission_bound(isl: float, osl: float, limits: EngineLimits) -> float:
    """The most sequences that can decode when every prompt must pass through the step's
    token budget P (``max_num_batched_tokens``): B decodes and a · isl prompt tokens per
    step, a = B / (osl + 1.5), fit in P when B <= P / (1 + isl / (osl + 1.5)).

    Beyond it the engine admits prompts no faster than the budget lets them in, every step
    is a full one, and fewer sequences decode than the clients and the cache allow: long
    prompts with short answers on a small budget (vLLM's 2,048 tokens on an A100 decode at
    most 2,048 / (1 + 2,048 / 129.5) = 122 requests of 2,048/128 tokens at a time).
    """
    return limits.max_num_batched_tokens / (1.0 + isl / (osl + STEPS_BEYOND_DECODE))


def recompute_tokens(
    dep: EngineShape, concurrency: float, isl: float, osl: float, limits: EngineLimits
) -> tuple[float, float]:
    """(prefills again per request, tokens each): the evictions of a KV-bound engine.

    When more clients wait than the cache holds and the engine admits a prompt whenever
    it fits now (``preempts_when_full``), the cache stays full: each finished request
    frees its isl + osl tokens, a waiting prompt takes that room including what the
    running sequences were about to grow into, and their growth then evicts the newest
    sequence, to be prefilled again. Per request that is up to osl tokens, fewer the more
    sequences B share the cache: E = osl / (1 + B / 750), as p = E / s evictions of
    s = isl + 0.25 · osl tokens (the newest sequence is about a quarter into its answer).
    (0, 0) when nothing is evicted: the engine reserves room for growth, or the clients,
    the batch cap or the token budget (``admission_bound``) bind before the cache.
    """
    if not limits.preempts_when_full or limits.reserve_whole_request:
        return 0.0, 0.0
    held = kv_limit(dep, isl, osl, limits)
    wanted = min(concurrency, float(limits.max_num_seqs), admission_bound(isl, osl, limits))
    if wanted <= held:
        return 0.0, 0.0
    tokens = osl / (1.0 + held / EVICTED_RECOMPUTE_HALF_AT_BATCH)
    size = isl + EVICTED_AT_ANSWER_SHARE * osl
    return tokens / size, size


def predict_continuous(
    dep: EngineShape,
    concurrency: float,
    isl: float,
    osl: float,
    limits: EngineLimits | None = None,
) -> Prediction:
    """Steady state of ``concurrency`` closed-loop clients on one replica.

    B sequences decode together. A request occupies the batch for its osl − 1 decode
    steps plus about 1.5 steps of prefill and wait, so a = B / (osl + 1.5) admissions
    ride in each step on average. Each adds Δ = c · (t_c − t_d) seconds: its prompt rides
    in c = ceil(isl / (token budget − B)) steps, each carrying one chunk of isl / c
    tokens beside the decodes (t_c), where a plain decode step takes t_d. So

      t̄ = t_d + a · Δ                          mean step (s), the search's serving model
      λ = B / (c · t_c + t̄/2 + (osl − 1) · t̄)  requests completed per second

    TPOT = t̄; TTFT = c · t_c + t̄/2, plus the queue wait (C − B)/λ when C > B (Little's
    law); output tokens/s = λ · osl. A prompt's chunk is a whole step's worth of tokens,
    not a share spread over every step: its kernels' fixed latencies are paid once per
    admission, and its GEMMs run at the chunk's size.
    """
    limits = limits or EngineLimits()
    if (
        perf.max_sequences_fitting(
            dep,
            isl + osl,
            gpu_memory_utilization=limits.gpu_memory_utilization,
            free_memory_fraction=limits.free_memory_fraction,
        )
        < 1
    ):
        return _does_not_fit(dep, isl + osl)
    batch = max(running_batch(dep, concurrency, isl, osl, limits), 1.0)
    if limits.mixed_prefill:
        batch = min(batch, max(admission_bound(isl, osl, limits), 1.0))
    context = batch * perf.cached_tokens(dep.model, isl + osl / 2.0)
    decode = perf.step_breakdown(dep, batch, context)
    if not limits.mixed_prefill:
        return _prefill_first(dep, concurrency, isl, osl, limits, batch, decode)
    chunks, carrying = prompt_chunks(dep, batch, context, isl, limits)
    added = [(float(chunks), carrying)]
    redo, redo_tokens = recompute_tokens(dep, concurrency, isl, osl, limits)
    if redo > 0:  # evicted sequences prefilled again: more chunk-carrying steps
        redo_chunks, redo_carrying = prompt_chunks(dep, batch, context, redo_tokens, limits)
        added.append((redo * redo_chunks, redo_carrying))
    admission = sum(n * (c.total_s - decode.total_s) for n, c in added)
    step = mean_step_s(decode.total_s, admission, batch, osl)
    a = admissions_per_step(batch, osl)  # each brings n chunk-carrying steps
    parts = _mean_parts(decode, [(c, a * n) for n, c in added])
    pred = _steady_state(step, chunks * carrying.total_s, batch, concurrency, osl, parts)
    factor = evicted_tpot_factor(redo, osl, concurrency, batch)
    return replace(pred, tpot_s=step * factor, evictions=redo)


def evicted_tpot_factor(evictions: float, osl: float, concurrency: float, batch: float) -> float:
    """TPOT / mean step when each request is evicted ``evictions`` times on average.

    A request's TPOT spans its whole answer, the steps it waits outside the batch
    included. In the engine simulator's vLLM scheduler (benchmarks/bench_preemption.py)
    an evicted sequence spends 0.14-0.18 · osl steps out of the batch per eviction once
    the clients exceed the running sequences B by half or more, and less as C nears B
    (0.07 · osl at C = 1.2 · B): so TPOT = t̄ · (osl − 1 + p · w · osl) / (osl − 1), with
    w = 0.18 · min(1, (C / B − 1) / 0.5) and p evictions per request.
    """
    if evictions <= 0 or osl <= 1 or batch <= 0:
        return 1.0
    excess = min(1.0, max(concurrency / batch - 1.0, 0.0) / EVICTED_WAIT_FULL_AT_EXCESS)
    wait_steps = evictions * EVICTED_WAIT_ANSWER_SHARE * excess * osl
    return 1.0 + wait_steps / (osl - 1)


def prompt_chunks(
    dep: EngineShape, batch: float, context: float, prompt: float, limits: EngineLimits
) -> tuple[int, perf.StepBreakdown]:
    """(c, t_c): a prompt of ``prompt`` tokens rides in c steps beside the B decodes,
    c = ceil(prompt / (token budget − B)), each carrying one chunk of prompt / c."""
    chunks = max(math.ceil(prompt / max(limits.max_num_batched_tokens - batch, 1.0)), 1)
    chunk = prompt / chunks
    return chunks, perf.step_breakdown(dep, batch, context, chunk, chunk * prompt / 2.0)


def _steady_state(
    step: float,
    prompt_s: float,
    batch: float,
    concurrency: float,
    osl: float,
    parts: perf.StepBreakdown,
) -> Prediction:
    """The prediction of B = ``batch`` running sequences whose mean step is ``step`` and
    whose prompt takes ``prompt_s`` of steps: TTFT = prompt_s + t̄/2 plus the queue wait
    (C − B)/λ, with λ = B / (TTFT without the wait + (osl − 1) · t̄) requests per second."""
    prefill_exec = prompt_s + step / 2.0
    rate = batch / (prefill_exec + max(osl - 1, 0) * step)
    queue_wait = max(concurrency - batch, 0.0) / rate
    return Prediction(
        step, prefill_exec + queue_wait, rate * osl, batch, step=parts, queue_wait_s=queue_wait
    )


def _prefill_first(
    dep: EngineShape,
    concurrency: float,
    isl: float,
    osl: float,
    limits: EngineLimits,
    batch: float,
    decode: perf.StepBreakdown,
) -> Prediction:
    """``predict_continuous`` for an engine that runs waiting prompts as prefill batches
    of their own, before the next decode step (SGLang by default).

    a = B / (osl + 1.5) prompts arrive per decode step. Under a chunk budget P, k =
    min(max(a, 1), P / isl) of them share one prefill batch (one each while fewer than
    one arrives per step: each is run as soon as it waits), a prompt longer than P runs
    as c = ceil(isl / P) batches. Every decode waits for those batches, so

      t̄ = t_d + (a / k) · c · t_p      t_p: one prefill batch of k · isl / c tokens alone

    TPOT = t̄; TTFT = c · t_p + t̄/2 (a waiting prompt goes first), plus the queue wait.
    Against mixed chunks the decodes lose what a mixed step hides: the weights read once
    for the prompt and once more for the decodes.
    """
    budget = float(max(limits.max_num_batched_tokens, 1))
    chunks = max(math.ceil(isl / budget), 1)
    a = admissions_per_step(batch, osl)
    sharing = min(max(a, 1.0), max(budget / isl, 1.0)) if chunks == 1 else 1.0
    tokens = sharing * isl / chunks
    alone = perf.step_breakdown(dep, 0.0, 0.0, tokens, tokens * isl / (2.0 * chunks))
    share = a / sharing * chunks  # prefill batches per decode step
    step = decode.total_s + share * alone.total_s
    parts = _mean_parts(decode, [(_sum(decode, alone), share)])
    return _steady_state(step, chunks * alone.total_s, batch, concurrency, osl, parts)


def _sum(a: perf.StepBreakdown, b: perf.StepBreakdown) -> perf.StepBreakdown:
    """Two steps run one after the other, part by part (the floor is ``a``'s)."""
    parts = {part: getattr(a, part) + getattr(b, part) for part in perf.STEP_PARTS}
    return perf.StepBreakdown(**parts, floor_s=a.floor_s)


def _mean_parts(
    decode: perf.StepBreakdown, carried: list[tuple[perf.StepBreakdown, float]]
) -> perf.StepBreakdown:
    """The mean step's parts: the decode step's plus, for each (step carrying a chunk,
    share of steps that carry one), that share of what the chunk adds."""

    def mean(part: str) -> float:
        base = float(getattr(decode, part))
        return base + sum(share * (float(getattr(step, part)) - base) for step, share in carried)

    return perf.StepBreakdown(
        **{part: mean(part) for part in perf.STEP_PARTS}, floor_s=decode.floor_s
    )

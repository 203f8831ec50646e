"""The SLO/budget search: the cheapest plan that meets the SLO at the target rate.

Enumerates GPU type × weight dtype × KV dtype × TP × prefill chunk × batch cap, rejects
each candidate with a reason (invalid TP, does not fit, TPOT/TTFT over SLO, over budget,
too many replicas), sizes replicas (data parallelism) for the request rate with
headroom, and ranks by $/hour, ties broken as ``choice.rank`` says. A
workload whose p90 requests exceed the model's context is infeasible before any of
that. Pure: no I/O, no Kubernetes.

Serving model at a per-replica Poisson arrival rate λ (requests/s):
  mean running batch      B   = λ · (TTFT + osl · TPOT(B))           (Little's law)
  percentile batch        B_q = B + z_q · √B                          (Poisson occupancy)
  percentile TPOT         TPOT_q = step(B_q, context, prefill carried at rate λ)
  percentile TTFT         TTFT_q = own prefill + the prefill queued ahead at rate λ
                                   (``prefill_queue``: an M/G/1 queue of prompt work)
The largest B whose TPOT_q and TTFT_q meet the SLO and whose B_q stays under the batch
cap and the KV capacity gives the replica's capacity λ* = B / (TTFT + osl · TPOT);
replicas = ceil(max(rate · headroom, burst rate) / λ*), so the rate a burst brings
(``bursts``) maps to a batch whose TPOT and queued TTFT still meet the SLO. The TPOT
quantile q sized for is the loop's aim, the SLO's percentile plus half its allowed
misses (p90 → 0.95, ``aimed_share``), so a plan costs what the loop is expected to
spend; plans report TPOT at the SLO's own percentile.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Collection, Iterator
from dataclasses import dataclass, replace
from statistics import NormalDist
from typing import Any

import numpy as np

from rooftop_api.spec import KvDtype, ServingTargetSpec, WeightDtype
from rooftop_planner import (
    batching,
    explain,
    kernel_model,
    perf,
    prefill_queue,
    speculative,
    tail,
)
from rooftop_planner.bursts import HEADROOM, burst_rate
from rooftop_planner.catalog import (
    Catalog,
    CatalogError,
    GpuSpec,
    ModelSpec,
    load_catalog,
)
from rooftop_planner.choice import choose
from rooftop_planner.drafters import drafters_for
from rooftop_planner.efficiency import EfficiencyTable, load_efficiency
from rooftop_planner.fleet import cheapest_mix
from rooftop_planner.hf_config import resolve_model
from rooftop_planner.inventory import GpuInventory
from rooftop_planner.kernels import FloatArray, column
from rooftop_planner.parallelism import TP_DEGREES, tp_problem
from rooftop_planner.perf import EngineShape
from rooftop_planner.plan import Plan
from rooftop_planner.prefix import PrefixModel
from rooftop_planner.pricing import GpuPrice, gpu_prices
from rooftop_planner.result import Rejection, SearchResult
from rooftop_planner.speculative import Speculation
from rooftop_planner.weights import Weights, kv_problem, resolve_weights
from rooftop_planner.workload import LengthDistribution, from_spec

BATCH_CAPS = (8, 16, 32, 64, 128, 256, 512)
# The prefill chunks searched without spec.constraints.prefillChunkTokens (vLLM's
# --max-num-batched-tokens, the step's token budget): the one Rooftop has always
# rendered. A smaller chunk splits a long prompt over more steps, so an answer shorter
# than its chunk count shares fewer of them (``tail``), at the price of TTFT (the
# prompt's own prefill takes more full steps). Listed chunks are searched largest first:
# a shape's rejections are said for the largest, and at equal cost it wins
# (``choice.rank``). Not searched by default: where answers outlast a prompt's chunks the
# planner still prices smaller chunks a few per cent cheaper than the engine simulator
# bears out, enough to tip a p99 chat target to a plan that keeps 98.8 % within the SLO
# (benchmarks/bench_chunk.py, docs/planner.md).
DEFAULT_CHUNK_TOKENS = (perf.DEFAULT_MAX_NUM_BATCHED_TOKENS,)
# Without constraints.weightDtypes only the model's own 16-bit weights: quantized weights
# change the outputs, so they are planned only where the target lists them. An fp8 KV
# cache changes outputs far less and halves the cache (longer contexts, bigger batches);
# it is planned by default, and at equal cost the 16-bit cache wins (``choice.rank``).
DEFAULT_WEIGHT_DTYPES = (WeightDtype.BF16,)
DEFAULT_KV_DTYPES = (KvDtype.AUTO, KvDtype.FP8)
# Accelerator families with a vLLM engine image when the caller names none: the CUDA
# build the operator pins by default (ROCm and TPU images are opt-in).
DEFAULT_ENGINE_FAMILIES = frozenset({"cuda"})
# Share of the predicted KV capacity a default max-model-len may fill: vLLM refuses to
# start when one max-model-len request does not fit its measured KV cache, and the
# prediction of that cache (activations, runtime reserve) is an estimate.
KV_FIT_MARGIN = 0.9
# A default max-model-len cut below the model's context is rounded down to this.
CONTEXT_STEP_TOKENS = 256


@dataclass(frozen=True)
class ResolvedWorkload:
    """The spec's workload as the search uses it: the rate planned for (the spec's or an
    observed one) and the length distributions."""

    requests_per_second: float
    prompt: LengthDistribution
    output: LengthDistribution
    # the rate bursts reach for the aimed share of requests (``bursts.burst_rate``) at the
    # spec's rate and burstiness, req/s; 0 for Poisson arrivals
    burst_rps: float = 0.0


# ---------------------------------------------------------------- per-replica model


@dataclass(frozen=True)
class _Targets:
    tpot_s: float
    ttft_s: float | None
    tpot_q: float  # the share sized for: the SLO's percentile plus the loop's margin
    report_q: float  # the SLO's own percentile, which plans report TPOT at
    z_tpot: float
    isl_mean: float
    osl_mean: float
    isl_q: float
    ttft_q: float  # the TTFT SLO's percentile, 0..1
    prompts: tuple[float, ...]
    prompt_weights: tuple[float, ...]
    outputs: tuple[float, ...]
    prefix: PrefixModel = PrefixModel()
    # the TTFT mixture's prompt lengths (``prefill_queue.TTFT_STRATA``), tokens
    ttft_prompts: tuple[float, ...] = ()


# Prompt lengths whose prefills other requests' decode steps carry: the mean length of
# each of these quantile strata of the prompt distribution, weighted by the stratum's
# width, give E[Δ] and E[Δ²] of one admission's extra step time (the weighted lengths
# average to the mean prompt; the narrow top strata keep the long tail).
PROMPT_STRATA = (0.0, 0.5, 0.8, 0.95, 1.0)


def prompt_strata(prompt: LengthDistribution) -> tuple[tuple[float, ...], tuple[float, ...]]:
    """The mean prompt length of each ``PROMPT_STRATA`` stratum, tokens, and its weight."""
    return prompt.stratum_means(PROMPT_STRATA), tuple(np.diff(PROMPT_STRATA).tolist())


GRID_POINTS = 16  # mean batches per candidate's curve, geometric from 1 to its limit


@dataclass(frozen=True)
class _Steps:
    """Candidates' steps on their batch grids, before the tail (D × GRID_POINTS arrays).

    decode: step without prefill (s); slope: ∂decode/∂B (s); rate: λ (requests/s); step:
    mean step t̄ (s); extra_mean: E[Δ] (s) of one admission's extra step time. Per prompt
    stratum: chunk_extra, δ, what one step carrying a chunk of it adds (s, D × S ×
    GRID_POINTS), chunks, c, the steps it rides in (D × S), and work, the prefill work
    it queues (``prefill_queue``: s, D × S × GRID_POINTS). own: the own prefill of each
    TTFT mixture prompt (s, D × len(ttft_prompts) × GRID_POINTS).
    """

    batches: FloatArray
    decode: FloatArray
    slope: FloatArray
    rate: FloatArray
    step: FloatArray
    extra_mean: FloatArray
    chunk_extra: FloatArray
    chunks: FloatArray
    work: FloatArray
    own: FloatArray


def _batch_grid(limits: FloatArray) -> FloatArray:
    """Geometric grids of mean batches from 1 to each limit (to 1.05 where it is ≤ 1)."""
    top = np.where(limits > 1.0, limits, 1.05)[:, None]
    out: FloatArray = top ** (np.arange(GRID_POINTS) / (GRID_POINTS - 1))[None, :]
    return out


@dataclass(frozen=True)
class _RawSteps:
    """Candidates' step grids before the step-time factor (``perf.forward_parts``): the
    kernels' unscaled sums and the physical floors (s, D × variants·GRID_POINTS), the
    mean batches (D × GRID_POINTS), the prefill chunks of each prompt stratum and of
    the TTFT prompt (D × strata + 1) and their uncached tokens over the token budget
    (n / K, same shape). None of it depends on the factor (``PreparedSearch.rescaled``)."""

    batches: FloatArray
    unscaled: FloatArray
    floor: FloatArray
    chunks: FloatArray
    loads: FloatArray


def _raw_steps(
    deps: list[EngineShape],
    budgets: FloatArray,
    limits: FloatArray,
    t: _Targets,
    same: float,
    speculations: list[Speculation | None] | None = None,
) -> _RawSteps:
    """Every candidate's steps on its batch grid before the factor, in one array call.

    Of a prompt of p tokens the prefix cache holds c (``prefix``, with ``same`` the
    chance a session's earlier request ran on this replica), so n = p − c tokens are
    prefilled: in ceil(n / K) steps of the candidate's token budget K (``budgets``), one
    chunk each, every new token attending to the c cached ones and half the new ones
    (≈ chunk · (c + n/2) pairs). Columns: the decode step, one step carrying each prompt
    stratum's chunk, and one at the percentile batch carrying the TTFT prompt's. A
    candidate that speculates has per-output-token steps instead
    (``speculative.steps``: the draft length chosen per column), which the serving
    model prices as any other.
    """
    batches = _batch_grid(limits)
    batch_q = batches + t.z_tpot * np.sqrt(batches)
    lengths = (*t.prompts, t.isl_q)
    cached = [t.prefix.cached_tokens(p, same) for p in lengths]
    new = np.array([p - c for p, c in zip(lengths, cached, strict=True)])
    loads = new[None, :] / budgets[:, None]  # D × lengths
    chunks = np.maximum(np.ceil(loads), 1.0)
    variants = len(t.prompts) + 2
    seqs = np.concatenate([batches] * (variants - 1) + [batch_q], axis=1)
    held = t.isl_mean + t.osl_mean / 2.0  # a running sequence's mean context
    ctx = seqs * column([perf.cached_tokens(d.model, held) for d in deps])
    per_length = np.concatenate([np.zeros((len(deps), 1)), new[None, :] / chunks], axis=1)
    chunk = np.repeat(per_length, GRID_POINTS, axis=1)
    context = [c + n / 2.0 for c, n in zip(cached, new, strict=True)]
    attended = chunk * np.repeat(np.array([0.0, *context]), GRID_POINTS)[None, :]
    unscaled, floor = perf.forward_parts(deps, seqs, ctx, chunk, attended)
    for row, spec in enumerate(speculations or ()):
        if spec is not None:
            at = speculative.steps(deps[row], spec, seqs[row], ctx[row], chunk[row], attended[row])
            unscaled[row], floor[row] = at.unscaled, at.floor
    return _RawSteps(batches, unscaled, floor, chunks, loads)


def _steps(raw: _RawSteps, scales: FloatArray, t: _Targets) -> _Steps:
    """Step times of every candidate on its batch grid at its step-time factor
    (``scales``, a D × 1 column).

    The serving model is ``batching.mean_step_s``: B / (osl + 1.5) admissions ride in
    each step, each adding E[Δ] (averaged over the prompt strata), so
    t̄ = t_d + B / (osl + 1.5) · E[Δ] and λ = B / ((osl + 1.5) · t̄).
    """
    batches, chunks = raw.batches, raw.chunks
    steps = kernel_model.scaled_totals_s(raw.unscaled, scales, raw.floor)
    steps = steps.reshape(len(batches), len(t.prompts) + 2, GRID_POINTS)
    decode = steps[:, 0]
    deltas = steps[:, 1:-1] - decode[:, None, :]  # D × S × G: one chunk-carrying step's
    weights = np.array(t.prompt_weights)[None, :, None]
    extra_mean = (weights * (chunks[:, :-1, None] * deltas)).sum(axis=1)
    step = batching.mean_step_s(decode, extra_mean, batches, t.osl_mean)
    # own prefill (c full chunk steps) and queued work (``prefill_queue``), known at the
    # strata and at the TTFT prompt (at the percentile batch), read in between for the
    # TTFT mixture's prompts
    own = chunks[:, :, None] * np.concatenate([steps[:, 1:-1], steps[:, -1:]], axis=1)
    extra = np.concatenate([deltas, steps[:, -1:] - decode[:, None, :]], axis=1)
    work = chunks[:, :, None] * extra + raw.loads[:, :, None] * decode[:, None, :]
    reads = prefill_queue.own_weights((*t.prompts, t.isl_q), t.ttft_prompts)
    return _Steps(
        batches=batches,
        decode=decode,
        slope=_slope(decode, batches),
        rate=batching.admissions_per_step(batches, t.osl_mean) / step,
        step=step,
        extra_mean=extra_mean,
        chunk_extra=deltas,
        chunks=chunks[:, :-1],
        work=np.einsum("kp,dpg->dkg", reads, work),
        own=np.einsum("kp,dpg->dkg", reads, own),
    )


def _operating_points(
    steps: _Steps, t: _Targets
) -> tuple[FloatArray, FloatArray, FloatArray, FloatArray]:
    """(TPOT at the aimed share, TPOT at the SLO's percentile, TTFT_q, λ) at every
    candidate's grid point (D × G arrays).

    The quantiles over requests are ``tail``'s, for all candidates in one array call each.
    """
    per_point = ("decode", "slope", "batches", "rate", "step", "extra_mean")
    flat = {name: getattr(steps, name).ravel() for name in per_point}
    strata = len(t.prompts)  # per grid point and stratum: (D · G) × S
    chunk_extra = np.moveaxis(steps.chunk_extra, 1, 2).reshape(-1, strata)
    chunks = np.repeat(steps.chunks, GRID_POINTS, axis=0)

    def tpot_at(q: float) -> FloatArray:
        out: FloatArray = tail.tpot_quantile(
            q,
            flat["decode"],
            flat["slope"],
            flat["batches"],
            flat["rate"],
            flat["step"],
            flat["extra_mean"],
            chunk_extra,
            chunks,
            np.array(t.prompt_weights),
            np.array(t.outputs),
            t.osl_mean,
            tail.OUTPUT_WEIGHTS,
        ).reshape(steps.batches.shape)
        return out

    aimed, reported = tpot_at(t.tpot_q), tpot_at(t.report_q)
    return aimed, reported, _ttft_quantile(steps, t), steps.rate


# The grid points the TTFT mixture is evaluated at (every third one, the last among
# them); the rest are read linearly in log batch between them (the grid is geometric, so
# that is linear in the index). TTFT is smooth in the batch, and its mixture is the
# search's largest array.
_TTFT_POINTS = np.arange(0, GRID_POINTS, 3)  # 0, 3, ..., 15: ends at the grid's end


def _between_points() -> FloatArray:
    """R (len(_TTFT_POINTS) × GRID_POINTS): values at the TTFT points times R are the
    values at every grid point, linear in the index between points."""
    index = np.arange(GRID_POINTS)
    unit = np.eye(len(_TTFT_POINTS))
    return np.stack([np.interp(index, _TTFT_POINTS, row) for row in unit])


_TTFT_READ = _between_points()


def _ttft_quantile(steps: _Steps, t: _Targets) -> FloatArray:
    """TTFT at the SLO's percentile (``prefill_queue``) at every candidate's grid point
    (D × G), evaluated at ``_TTFT_POINTS`` and read in between (``_TTFT_READ``)."""
    mixture, cols = len(t.ttft_prompts), _TTFT_POINTS
    at = prefill_queue.ttft_quantile(
        t.ttft_q,
        steps.decode[:, cols].ravel(),
        steps.rate[:, cols].ravel(),
        np.moveaxis(steps.work[:, :, cols], 1, 2).reshape(-1, mixture),
        np.moveaxis(steps.own[:, :, cols], 1, 2).reshape(-1, mixture),
    ).reshape(len(steps.batches), len(cols))
    out: FloatArray = at @ _TTFT_READ
    return out


def _slope(values: FloatArray, xs: FloatArray) -> FloatArray:
    """d values / d xs along each row: the backward difference, the first one at the
    start (≥ 0)."""
    diffs = np.diff(values, axis=1) / np.diff(xs, axis=1)
    out: FloatArray = np.maximum(np.concatenate([diffs[:, :1], diffs], axis=1), 0.0)
    return out


@dataclass(frozen=True)
class _Curve:
    """Operating points of one deployment on a geometric grid of mean batch sizes.

    TPOT, TTFT_q and λ all rise with the batch, so the SLO limit and the batch that
    serves a rate are found by interpolating between grid points instead of re-solving
    the step model (a full search stays well under 100 ms). ``tpot_s`` is at the aimed
    share (what sizing checks), ``reported_s`` at the SLO's percentile (what a plan says).
    """

    batches: tuple[float, ...]
    tpot_s: tuple[float, ...]
    reported_s: tuple[float, ...]
    ttft_s: tuple[float, ...]
    rate: tuple[float, ...]

    @classmethod
    def of(cls, *columns: FloatArray) -> _Curve:
        """From (batches, aimed TPOT, reported TPOT, TTFT, rate) arrays."""
        return cls(*(tuple(col.tolist()) for col in columns))

    def largest_batch_meeting(self, t: _Targets) -> float:
        """Largest grid-interpolated batch whose aimed-share TPOT and TTFT_q meet the
        SLO, or 0."""

        def slack(i: int) -> float:
            over = self.tpot_s[i] / t.tpot_s
            if t.ttft_s is not None:
                over = max(over, self.ttft_s[i] / t.ttft_s)
            return 1.0 - over

        return self._last_where(slack)

    def batch_at_rate(self, rate: float) -> float:
        """Mean batch that serves ``rate`` requests/s (capped at the grid's end)."""
        value = self._last_where(lambda i: rate - self.rate[i])
        return max(value, self.batches[0])

    def rate_at(self, batch: float) -> float:
        return _interp(batch, self.batches, self.rate)

    def at(self, batch: float) -> tuple[float, float, float]:
        """(TPOT at the SLO's percentile, TTFT_q, λ) interpolated at a mean batch inside
        the grid."""
        return (
            _interp(batch, self.batches, self.reported_s),
            _interp(batch, self.batches, self.ttft_s),
            self.rate_at(batch),
        )

    def _last_where(self, margin: Callable[[int], float]) -> float:
        """Interpolated largest batch with margin(batch) >= 0, margin decreasing in batch."""
        if margin(0) < 0:
            return 0.0
        for i in range(1, len(self.batches)):
            m = margin(i)
            if m < 0:
                m0 = margin(i - 1)
                frac = m0 / (m0 - m)
                b0, b1 = self.batches[i - 1], self.batches[i]
                return b0 + frac * (b1 - b0)
        return self.batches[-1]


@dataclass(frozen=True)
class _Curves:
    """A candidate's curves where a session's earlier request always ran on the same
    replica (``same``) and where it never did (``apart``; None when the hit rate does not
    depend on that). Cached tokens are linear in that chance P (``prefix``), so the curve
    at P blends the two: exact at both ends, linear in between."""

    same: _Curve
    apart: _Curve | None = None

    def at(self, p_same: float) -> _Curve:
        if self.apart is None or p_same >= 1.0:
            return self.same

        def blend(a: tuple[float, ...], b: tuple[float, ...]) -> tuple[float, ...]:
            return tuple(p_same * x + (1.0 - p_same) * y for x, y in zip(a, b, strict=True))

        s, a = self.same, self.apart
        return _Curve(
            s.batches,
            blend(s.tpot_s, a.tpot_s),
            blend(s.reported_s, a.reported_s),
            blend(s.ttft_s, a.ttft_s),
            blend(s.rate, a.rate),
        )


def _interp(x: float, xs: tuple[float, ...], ys: tuple[float, ...]) -> float:
    for i in range(1, len(xs)):
        if x <= xs[i]:
            frac = (x - xs[i - 1]) / (xs[i] - xs[i - 1])
            return ys[i - 1] + frac * (ys[i] - ys[i - 1])
    return ys[-1]


def _mean_batch_for_cap(cap: float, z: float) -> float:
    """Largest mean batch B with B + z·√B ≤ cap (so the percentile batch fits the cap)."""
    root = (-z + math.sqrt(z * z + 4.0 * cap)) / 2.0
    return max(root * root, 0.0)


# ---------------------------------------------------------------- enumeration


@dataclass(frozen=True)
class _Context:
    spec: ServingTargetSpec
    model: ModelSpec
    workload: ResolvedWorkload
    targets: _Targets
    efficiency: EfficiencyTable
    step_time_scale: float
    prices: dict[str, GpuPrice]  # per catalog GPU id (``pricing.gpu_prices``)
    need_tokens: int
    engine_families: frozenset[str] = DEFAULT_ENGINE_FAMILIES
    inventory: GpuInventory | None = None
    tp: int | None = None  # the one tensor-parallel degree to search (None: every one)
    # the prefill chunks to search, largest first; a shape's rejections are said for it
    chunks: tuple[int, ...] = DEFAULT_CHUNK_TOKENS
    # the speculative decoding options constraints.speculative allows (``speculative``),
    # and why each other method it lists is none; ``speculating``: only candidates that
    # speculate (True) or only those that do not (False), as a running engine does
    speculations: tuple[Speculation, ...] = ()
    speculation_problems: tuple[str, ...] = ()
    speculating: bool | None = None


@dataclass(frozen=True)
class _Shape:
    """One candidate's engine: its deployment, the weights it loads, its context, its
    prefill chunk (tokens)."""

    dep: EngineShape
    weights: Weights
    max_model_len: int
    context_note: str
    max_num_batched_tokens: int = perf.DEFAULT_MAX_NUM_BATCHED_TOKENS
    speculation: Speculation | None = None


def _dtype_problem(gpu: GpuSpec, weight_dtype: str, kv_dtype: str) -> str:
    if weight_dtype == "fp4" and "fp4" not in gpu.dense_flops_per_s:
        return f"{gpu.id} has no FP4 support"
    return kv_problem(weight_dtype, kv_dtype)


_FAMILY_NAMES = {"cuda": "CUDA", "rocm": "ROCm", "tpu": "TPU"}


def engine_problem(gpu: GpuSpec, families: Collection[str]) -> str:
    """Why no engine can be deployed on ``gpu``, else ""."""
    if gpu.family in families:
        return ""
    return (
        f"{gpu.id} needs vLLM's {_FAMILY_NAMES.get(gpu.family, gpu.family)} build and no image "
        f"for it is configured (chart value operator.{gpu.family}Image)"
    )


def _context_length(ctx: _Context, kv_tokens: int) -> tuple[int, str] | str:
    """(max-model-len, why) for a KV cache of ``kv_tokens``, or why nothing fits.

    Default: the model's full context where the KV cache holds one such request (so no
    request the model supports is refused), else the largest length it holds, as long
    as that still covers the longest request planned for (``_need_tokens``).
    ``spec.engine.maxModelLen`` wins.
    """
    usable = int(kv_tokens * KV_FIT_MARGIN)
    requested = ctx.spec.engine.max_model_len
    if requested is not None:
        if usable < requested:
            return f"KV for {kv_tokens} tokens < spec.engine.maxModelLen {requested}"
        return requested, "spec.engine.maxModelLen"
    full = ctx.model.max_context
    if usable >= full:
        return full, "the model's full context"
    if usable < ctx.need_tokens:
        return (
            f"KV for {kv_tokens} tokens < {ctx.need_tokens} tokens, the prompt plus output "
            "that 99 % of requests stay within by the workload's lengths"
        )
    cut = max(usable // CONTEXT_STEP_TOKENS * CONTEXT_STEP_TOKENS, ctx.need_tokens)
    return cut, f"the most its KV cache holds; the model allows {full}"


Candidate = tuple[GpuSpec, str, str, int, Speculation | None, int]


def _candidates(ctx: _Context, catalog: Catalog) -> Iterator[Candidate]:
    c = ctx.spec.constraints
    gpu_ids = [catalog.gpu(g).id for g in c.gpu_types] if c.gpu_types else list(catalog.gpus)
    weight_dtypes = [d.value for d in (c.weight_dtypes or DEFAULT_WEIGHT_DTYPES)]
    kv_dtypes = [d.value for d in (c.kv_dtypes or DEFAULT_KV_DTYPES)]
    for gpu_id in gpu_ids:
        gpu = catalog.gpus[gpu_id]
        max_tp = min(gpu.gpus_per_node, c.max_tensor_parallel or 64)
        for wd in weight_dtypes:
            for kv in kv_dtypes:
                for tp in TP_DEGREES:
                    if tp <= max_tp and ctx.tp in (None, tp):
                        for speculation in _speculation_options(ctx):
                            for chunk in ctx.chunks:
                                yield gpu, wd, kv, tp, speculation, chunk


def _speculation_options(ctx: _Context) -> tuple[Speculation | None, ...]:
    """None (no speculation) and each drafter, or as ``ctx.speculating`` pins it."""
    if ctx.speculating is None:
        return (None, *ctx.speculations)
    return ctx.speculations if ctx.speculating else (None,)


@dataclass(frozen=True)
class _Pending:
    """A candidate that passed every check before the step model: its shape and grid."""

    shape: _Shape
    kv_batch: float
    batch_limit: float  # the largest mean batch its curve covers
    kv_tokens: float = 0.0  # one replica's KV cache, tokens


def _prepare(
    ctx: _Context,
    gpu: GpuSpec,
    wd: str,
    kv: str,
    tp: int,
    speculation: Speculation | None,
    chunk: int,
) -> _Pending | Rejection:
    """The candidate's shape and the batches its curve spans, or why it cannot run."""

    def reject(category: str, detail: str) -> Rejection:
        if speculation is not None:
            detail = f"with {speculation.method}: {detail}"
        return Rejection(
            gpu=gpu.id, tp=tp, weight_dtype=wd, kv_dtype=kv, category=category, detail=detail
        )

    if ctx.inventory is not None and (missing := ctx.inventory.problem(gpu, tp)):
        return reject("not in cluster", missing)
    if no_engine := engine_problem(gpu, ctx.engine_families):
        return reject("no engine", no_engine)
    weights = resolve_weights(ctx.spec, ctx.model, wd)
    if isinstance(weights, str):
        return reject("no checkpoint", weights)
    problem = tp_problem(ctx.model, tp) or _dtype_problem(gpu, wd, kv)
    if problem:
        return reject("invalid", problem)
    eff = ctx.efficiency.lookup(gpu, "vllm").scaled(ctx.step_time_scale)
    dep = EngineShape(model=ctx.model, gpu=gpu, tp=tp, weight_dtype=wd, kv_dtype=kv, efficiency=eff)
    kv_tokens = perf.kv_capacity_tokens(dep, max_num_batched_tokens=chunk)
    if speculation is not None:
        kv_tokens = speculative.kv_capacity_tokens(dep, speculation, chunk)
    context = _context_length(ctx, kv_tokens)
    if isinstance(context, str):
        weight_gb = perf.weight_bytes_per_gpu(dep) / 1e9
        if speculation is not None:
            weight_gb += speculative.drafter_bytes_per_gpu(dep, speculation) / 1e9
        return reject("does not fit", f"{weight_gb:.1f} GB of weights per GPU leave {context}")
    t = ctx.targets
    shared = t.prefix.shared_kv_tokens(t.isl_mean)  # held once for every running request
    kv_batch = max(kv_tokens - shared, 0.0) / (t.isl_mean - shared + t.osl_mean / 2.0)
    limit = _mean_batch_for_cap(min(kv_batch, BATCH_CAPS[-1]), t.z_tpot)
    shape = _Shape(dep, weights, *context, chunk, speculation)
    return _Pending(shape, kv_batch, limit, kv_tokens)


def _raw_curves(pending: list[_Pending], t: _Targets) -> tuple[_RawSteps, ...]:
    """The pending candidates' steps before the factor, one array pass per end of the
    same-replica chance (only P = 1 when hits do not depend on it)."""
    if not pending:
        return ()
    deps = [p.shape.dep for p in pending]
    budgets = np.array([float(p.shape.max_num_batched_tokens) for p in pending])
    limits = np.array([p.batch_limit for p in pending])
    ends = (1.0, 0.0) if t.prefix.session_hits_vary else (1.0,)
    specs = [p.shape.speculation for p in pending]
    return tuple(_raw_steps(deps, budgets, limits, t, same, specs) for same in ends)


def _curves(raws: tuple[_RawSteps, ...], scales: FloatArray, t: _Targets) -> tuple[_Curves, ...]:
    """Each candidate's operating-point curves at its factor (``scales``, D × 1), from
    its steps before the factor (``_raw_curves``)."""

    def at(raw: _RawSteps) -> list[_Curve]:
        steps = _steps(raw, scales, t)
        columns = (steps.batches, *_operating_points(steps, t))
        return [_Curve.of(*cols) for cols in zip(*columns, strict=True)]

    if not raws:
        return ()
    if len(raws) == 1:
        return tuple(_Curves(curve) for curve in at(raws[0]))
    return tuple(_Curves(s, a) for s, a in zip(at(raws[0]), at(raws[1]), strict=True))


def _judge(
    ctx: _Context, pending: _Pending, curves: _Curves, out: list[Plan], rejections: list[Rejection]
) -> None:
    """Plans for each batch cap of a candidate whose curve is known, or why none."""
    dep, t = pending.shape.dep, ctx.targets

    def reject(category: str, detail: str) -> None:
        rejections.append(
            Rejection(
                gpu=dep.gpu.id,
                tp=dep.tp,
                weight_dtype=dep.weight_dtype,
                kv_dtype=dep.kv_dtype,
                category=category,
                detail=detail,
            )
        )

    best = curves.same  # the most hits any plan of this candidate gets
    if best.largest_batch_meeting(t) <= 0:
        if best.tpot_s[0] > t.tpot_s:
            share = f"{t.tpot_q * 100:g} % of requests"
            return reject(
                "TPOT over SLO", f"{best.tpot_s[0] * 1e3:.1f} ms for {share} even at batch 1"
            )
        return reject("TTFT over SLO", f"{best.ttft_s[0] * 1e3:.0f} ms even at batch 1")
    for affinity in t.prefix.affinity_options():
        _add_caps(ctx, pending, curves, affinity, out, reject)


@dataclass(frozen=True)
class _Sized:
    """One batch cap's replicas and the curve and operating batch at that count."""

    replicas: int
    curve: _Curve
    batch: float
    capacity: float  # requests/s per replica
    hit_chance: float  # a session's earlier request is cached on this replica (prefix)


# Rounds of replicas → hit rate → capacity → replicas; the count only grows, and the hit
# rate's 1/R settles within a few.
MAX_SIZING_ROUNDS = 12


def _hit_chance(
    ctx: _Context, pending: _Pending, curves: _Curves, replicas: int, affinity: bool
) -> float:
    """The chance a session's earlier request is cached on the replica a request goes to
    (``prefix.PrefixModel.session_hit_chance``): the cache's room is what the running
    batch at the replica's share of the rate leaves free, and each replica writes the KV
    of its share of the requests (tokens/s = rate / R · (isl − shared + osl); cached
    session tokens counted as written, which errs toward evicting)."""
    t = ctx.targets
    per_replica = ctx.workload.requests_per_second / replicas
    shared = t.prefix.shared_kv_tokens(t.isl_mean)
    per_request = t.isl_mean - shared + t.osl_mean
    held = curves.same.batch_at_rate(per_replica) * (t.isl_mean - shared + t.osl_mean / 2.0)
    free = max(pending.kv_tokens - shared - held, 0.0)
    written = per_replica * per_request
    return t.prefix.session_hit_chance(replicas, affinity, free, written)


def _size(
    ctx: _Context, pending: _Pending, curves: _Curves, affinity: bool, cap: int
) -> _Sized | int:
    """Replicas for ``cap``: the fewest R with R ≥ rate · headroom / λ*(R), where λ*
    depends on R when session hits need the same replica (P = 1/R) and a cache that
    still holds the session (``_hit_chance``). Where the SLO cannot be met at the count
    the rate needs (too few hits left), that count."""
    t, c = ctx.targets, ctx.spec.constraints
    rate = max(ctx.workload.requests_per_second * HEADROOM, ctx.workload.burst_rps)
    replicas = max(c.min_replicas, 1)
    for _ in range(MAX_SIZING_ROUNDS):
        chance = _hit_chance(ctx, pending, curves, replicas, affinity)
        curve = curves.at(chance)
        batch = min(curve.largest_batch_meeting(t), _mean_batch_for_cap(cap, t.z_tpot))
        if batch < 1.0:
            return replicas
        capacity = curve.rate_at(batch)
        need = max(c.min_replicas, math.ceil(rate / capacity) if rate > 0 else 1, 1)
        if need <= replicas or not t.prefix.session_share:
            return _Sized(max(need, replicas), curve, batch, capacity, chance)
        replicas = need
    return _Sized(replicas, curve, batch, capacity, chance)


def _add_caps(
    ctx: _Context,
    pending: _Pending,
    curves: _Curves,
    affinity: bool,
    out: list[Plan],
    reject: Any,
) -> None:
    """One plan per batch cap: the cap bounds the percentile batch, hence the capacity."""
    c, shape, kv_batch = ctx.spec.constraints, pending.shape, pending.kv_batch
    dep = shape.dep
    price = ctx.prices[dep.gpu.id]
    seen: set[tuple[int, float]] = set()
    for cap in BATCH_CAPS:
        if cap > max(kv_batch, BATCH_CAPS[0]):
            break
        sized = _size(ctx, pending, curves, affinity, cap)
        if isinstance(sized, int):
            reject("SLO over at scale", _fewer_hits(ctx, sized, cap))
            break
        if (sized.replicas, sized.batch) in seen:
            continue
        seen.add((sized.replicas, sized.batch))
        if sized.replicas > c.max_replicas:
            reject(
                "too many replicas",
                f"max-num-seqs {cap} needs {sized.replicas} replicas > maxReplicas "
                f"{c.max_replicas}",
            )
            continue
        if ctx.inventory is not None and (
            short := ctx.inventory.shortfall(dep.gpu.id, dep.tp, sized.replicas)
        ):
            reject("not enough GPUs", f"max-num-seqs {cap}: {short}")
            continue
        out.append(_make_plan(ctx, shape, sized, cap, affinity, price))


def _fewer_hits(ctx: _Context, replicas: int, cap: int) -> str:
    """Why a cap meets the SLO on one replica but not on the count the rate needs."""
    t = ctx.targets
    hits = t.prefix.hit_ratio(t.prompts, t.prompt_weights, 1.0 / replicas)
    return (
        f"on the {replicas} replicas the rate needs, prefix-cache hits fall to {hits:.0%} "
        f"and the SLO is missed at max-num-seqs {cap}"
    )


def _make_plan(
    ctx: _Context, shape: _Shape, sized: _Sized, cap: int, affinity: bool, price: GpuPrice
) -> Plan:
    """Predict the operating point at the real rate split over the sized replicas."""
    t, dep, replicas, curve = ctx.targets, shape.dep, sized.replicas, sized.curve
    per_replica = ctx.workload.requests_per_second / replicas
    batch = min(curve.batch_at_rate(per_replica), float(cap))
    tpot_q, ttft_q, rate = curve.at(batch)
    speculation = (
        speculative.planned(dep, shape.speculation, t.isl_mean + t.osl_mean / 2.0, batch)
        if shape.speculation is not None
        else None
    )
    return Plan(
        gpu=dep.gpu.id,
        tp=dep.tp,
        replicas=replicas,
        max_num_seqs=cap,
        weight_dtype=dep.weight_dtype,
        kv_dtype=dep.kv_dtype,
        max_model_len=shape.max_model_len,
        max_num_batched_tokens=shape.max_num_batched_tokens,
        context_note=shape.context_note,
        checkpoint=shape.weights.model,
        weights_note=shape.weights.note,
        gpu_memory_utilization=perf.DEFAULT_GPU_MEMORY_UTILIZATION,
        tpot_ms=tpot_q * 1e3,
        ttft_ms=ttft_q * 1e3,
        output_tok_s=min(rate, per_replica) * replicas * t.osl_mean,
        usd_per_hour=price.usd_per_hour(replicas * dep.tp),
        capacity_rps=sized.capacity * replicas,
        session_affinity="ClientIP" if affinity else "",
        prefix_hit_ratio=t.prefix.hit_ratio(t.prompts, t.prompt_weights, sized.hit_chance),
        speculative_config=speculation.config if speculation else "",
        speculative_note=speculation.note if speculation else "",
    )


# ---------------------------------------------------------------- entry point


def _context(
    spec: ServingTargetSpec,
    catalog: Catalog,
    step_time_scale: float,
    rps: float | None,
    efficiency: EfficiencyTable,
) -> _Context:
    model = resolve_model(spec, catalog)
    _check_max_model_len(spec, model)
    workload = ResolvedWorkload(
        requests_per_second=spec.workload.requests_per_second if rps is None else rps,
        prompt=from_spec(spec.workload.prompt_tokens),
        output=from_spec(spec.workload.output_tokens),
        burst_rps=burst_rate(
            spec.workload.requests_per_second,
            spec.workload.arrival_dispersion or 1.0,
            spec.slo.burst_aim,
        ),
    )
    q = spec.slo.tpot_percentile.aim
    prompts, prompt_weights = prompt_strata(workload.prompt)
    targets = _Targets(
        tpot_s=spec.slo.tpot_ms / 1e3,
        ttft_s=spec.slo.ttft_ms / 1e3 if spec.slo.ttft_ms else None,
        tpot_q=q,
        report_q=spec.slo.tpot_percentile.quantile,
        z_tpot=max(NormalDist().inv_cdf(spec.slo.tpot_percentile.quantile), 0.0),
        isl_mean=workload.prompt.mean,
        osl_mean=workload.output.mean,
        isl_q=workload.prompt.quantile(spec.slo.ttft_percentile.quantile),
        prompts=prompts,
        prompt_weights=prompt_weights,
        outputs=tuple(float(v) for v in tail.output_points(workload.output.quantile)),
        prefix=PrefixModel.from_spec(spec.workload.prefix),
        ttft_q=spec.slo.ttft_percentile.quantile,
        ttft_prompts=tuple(workload.prompt.quantile(m) for m in prefill_queue.ttft_midpoints()),
    )
    methods = [m.value for m in spec.constraints.speculative or ()]
    speculations, problems = speculative.options(
        model,
        methods,
        spec.workload.acceptance_rate,
        catalog,
        drafters_for(spec, model),
    )
    return _Context(
        speculations=tuple(speculations),
        speculation_problems=tuple(problems),
        spec=spec,
        model=model,
        workload=workload,
        targets=targets,
        efficiency=efficiency,
        step_time_scale=step_time_scale,
        prices=gpu_prices(spec, catalog),
        need_tokens=_need_tokens(model, workload),
        chunks=tuple(sorted(set(spec.constraints.prefill_chunk_tokens or ()), reverse=True))
        or DEFAULT_CHUNK_TOKENS,
    )


def _need_tokens(model: ModelSpec, workload: ResolvedWorkload) -> int:
    """The longest request planned for: the 99th percentiles of the prompt and output
    lengths the workload implies (its means, p90s or histograms, whichever it gives),
    added and rounded up to 1024 tokens, within the model's context; the shortest
    max-model-len a plan may have."""
    need = workload.prompt.quantile(0.99) + workload.output.quantile(0.99)
    return int(min(model.max_context, math.ceil(need / 1024.0) * 1024))


def _check_max_model_len(spec: ServingTargetSpec, model: ModelSpec) -> None:
    """vLLM refuses a max-model-len beyond the model's context (max_position_embeddings)."""
    wanted = spec.engine.max_model_len
    if wanted is not None and wanted > model.max_context:
        raise CatalogError(
            f"spec.engine.maxModelLen: {wanted} exceeds {model.id}'s context of "
            f"{model.max_context} tokens (its max_position_embeddings); use at most that"
        )


def plan_target(
    spec: ServingTargetSpec,
    *,
    catalog: Catalog | None = None,
    step_time_scale: float = 1.0,
    requests_per_second: float | None = None,
    efficiency: EfficiencyTable | None = None,
    gpu_inventory: GpuInventory | None = None,
    engine_families: Collection[str] | None = None,
) -> SearchResult:
    """Search every candidate and return the cheapest feasible plan with the evidence.

    ``gpu_inventory``: the GPUs the cluster's nodes offer (``inventory.py``); when given,
    only shapes one of its nodes can hold are planned. None plans for the whole catalog
    (a cluster that adds nodes on demand). ``engine_families``: accelerator families
    with a vLLM image (default ``DEFAULT_ENGINE_FAMILIES``); others are not planned.
    """
    catalog = catalog or load_catalog()
    ctx = _context(
        spec, catalog, step_time_scale, requests_per_second, efficiency or load_efficiency()
    )
    if engine_families is not None:
        ctx = replace(ctx, engine_families=frozenset(engine_families))
    if too_long := _too_long(ctx):
        return SearchResult(
            False,
            None,
            reasons=[too_long],
            slo_tpot_ms=spec.slo.tpot_ms,
            budget_usd_per_hour=spec.budget.usd_per_hour,
        )
    on_cluster = replace(ctx, inventory=gpu_inventory)
    result = _search(on_cluster, catalog)
    # every shape the nodes hold, at any count: what pools of a mixed fleet may use
    on_shapes = result
    if gpu_inventory is not None and gpu_inventory.free is not None:
        on_shapes = _search(replace(ctx, inventory=replace(gpu_inventory, free=None)), catalog)
    if gpu_inventory is not None and not result.feasible:
        _blame_the_cluster(result, _search(ctx, catalog), gpu_inventory, on_shapes.plan)
    if not result.feasible and spec.constraints.weight_dtypes is None:
        _suggest_fp8(result, on_cluster, catalog)
    if not result.feasible and gpu_inventory is None and spec.constraints.gpu_types:
        _suggest_other_gpus(result, ctx, catalog)
    _offer_a_mix(result, ctx, on_shapes.candidates, gpu_inventory)
    result.reasons += [f"constraints.speculative: {p}" for p in ctx.speculation_problems]
    return result


def _offer_a_mix(
    result: SearchResult, ctx: _Context, plans: list[Plan], inventory: GpuInventory | None
) -> None:
    """Where pools of several GPU types cost less than the single-type plan (or serve
    where no single type does), say so (``fleet.cheapest_mix``): as ``result.mixed``,
    the plan the operator deploys (``SearchResult.deployed``), and one reason."""
    c, workload = ctx.spec.constraints, ctx.workload
    fleet_rps = max(workload.requests_per_second * HEADROOM, workload.burst_rps)
    fit = None if inventory is None or inventory.free is None else inventory.replicas_fit
    mixed = cheapest_mix(
        plans, ctx.prices, fleet_rps, c.max_replicas, ctx.spec.budget.usd_per_hour, fit
    )
    single = result.plan
    if mixed is None or (single is not None and mixed.usd_per_hour >= single.usd_per_hour - 1e-9):
        return
    result.mixed = mixed
    if single is None:  # after the headline, as the other fixes of an infeasible target
        result.reasons.insert(1, explain.mixed(mixed, single))
    else:
        result.reasons = explain.reasons(result, ctx.spec)


def _suggest_fp8(result: SearchResult, ctx: _Context, catalog: Catalog) -> None:
    """An infeasible target that left weightDtypes at its default (bf16 only): when fp8
    weights would meet the SLO within the budget, say so as one more reason. fp8 halves
    the weight bytes every decode step reads and changes outputs the least of the
    quantized formats, so it is the first thing to try; the user decides, since outputs
    differ from bf16. It follows the headline, where ``rooftop plan``'s short form (its
    first three reasons) shows it."""
    plan = _plan_widened(ctx, catalog, weight_dtypes=[WeightDtype.BF16, WeightDtype.FP8])
    if plan is not None:
        result.reasons.insert(1, explain.with_fp8_weights(plan))


def _suggest_other_gpus(result: SearchResult, ctx: _Context, catalog: Catalog) -> None:
    """An infeasible target that pinned constraints.gpuTypes: when another GPU type of
    the catalog would meet the SLO within the budget (the other constraints as written),
    say which and how to allow it, after the lines on the closest miss and fp8 weights
    (the short form of ``rooftop plan`` shows the first three reasons). Without a
    cluster inventory only: with one, the cluster's nodes say what would work
    (``_blame_the_cluster``)."""
    plan = _plan_widened(ctx, catalog, gpu_types=None)
    if plan is None:
        return
    allowed = [*(ctx.spec.constraints.gpu_types or []), plan.gpu]
    fixes = (explain.CLOSEST, explain.FP8_WOULD_WORK)  # the lines it follows
    at = 1
    while at < len(result.reasons) and result.reasons[at].startswith(fixes):
        at += 1
    result.reasons.insert(at, explain.with_other_gpus(plan, allowed))


def _plan_widened(ctx: _Context, catalog: Catalog, **constraints: Any) -> Plan | None:
    """The plan the target would get with these constraints set (the others as
    written): what a suggested fix of an infeasible target buys."""
    widened = ctx.spec.constraints.model_copy(update=constraints)
    spec = ctx.spec.model_copy(update={"constraints": widened})
    return _search(replace(ctx, spec=spec), catalog).plan


def _too_long(ctx: _Context) -> str:
    """Why the workload's p90 requests cannot run on this model at all, else "".

    vLLM refuses a request longer than the model's context (max_position_embeddings),
    so when the p90 prompt, or the p90 prompt plus the p90 output, exceeds it, no GPU
    and no budget serves the workload: that is the headline, not a latency miss. (A
    shorter spec.engine.maxModelLen is the user's choice: its refusals are counted by
    ``rooftop simulate``, not planned away.)
    """
    prompt = ctx.workload.prompt.quantile(0.9)
    output = ctx.workload.output.quantile(0.9)
    if prompt + output > ctx.model.max_context:
        return explain.too_long(ctx.model.id, prompt, output, ctx.model.max_context)
    return ""


def _blame_the_cluster(
    result: SearchResult,
    unrestricted: SearchResult,
    inventory: GpuInventory,
    on_shapes: Plan | None,
) -> None:
    """An infeasible plan on the cluster's nodes: the headline is what the cluster has and
    what would work, since the nodes are the cause; when no GPU in the catalog would do
    either, the target's own problem (the whole catalog's headline) leads. ``on_shapes``:
    the plan the cluster's node shapes would hold with GPUs enough (its shortfall is
    how many GPUs of which type are missing)."""
    result.beyond_inventory = unrestricted.plan
    have = _beyond_cluster(unrestricted, inventory, on_shapes)
    lead = [] if unrestricted.plan is not None else unrestricted.reasons[:1]
    # Relaxing the SLO is not the fix where other nodes would meet it: the closest the
    # cluster's own GPUs reach goes last.
    rest = sorted(result.reasons[1:], key=lambda r: r.startswith(explain.CLOSEST))  # stable
    result.reasons[:] = [*lead, have, *rest]


@dataclass(frozen=True)
class PreparedSearch:
    """A search with everything that does not depend on the request rate done once: each
    candidate's checks and its step-time curves, most of a search's time. What remains,
    sizing replicas and batch caps at a rate (``plans``), takes a tenth of it.

    The feedback loop sizes one running shape at a new rate every tick, while the curves
    change only with the step-time factor and the workload's lengths and prefix reuse
    (``rooftop_control.sizing`` keeps one per such key).
    """

    ctx: _Context
    items: tuple[_Pending | Rejection, ...]
    curves: tuple[_Curves, ...]  # one per _Pending item, in order
    raws: tuple[_RawSteps, ...]  # the curves' steps before the factor

    @classmethod
    def of(cls, ctx: _Context, catalog: Catalog) -> PreparedSearch:
        """Two passes: every candidate's checks, then all survivors' curves in one array
        pass (per candidate, numpy's call overhead would dominate). A shape's rejections
        are those of its first prefill chunk (``_Context.chunks``): the others are options
        of the same shape, which would repeat or contradict them."""
        first = ctx.chunks[0]
        prepared = ((c[-1], _prepare(ctx, *c)) for c in _candidates(ctx, catalog))
        items = tuple(i for chunk, i in prepared if chunk == first or isinstance(i, _Pending))
        pending = [p for p in items if isinstance(p, _Pending)]
        raws = _raw_curves(pending, ctx.targets)
        scales = perf.step_time_scales([p.shape.dep for p in pending])
        return cls(ctx, items, _curves(raws, scales, ctx.targets), raws)

    def rescaled(self, step_time_scale: float) -> PreparedSearch:
        """The same search at another step-time factor, exactly as if prepared at it:
        the candidates' checks and the kernels' sums do not depend on the factor (about
        half of a preparation); only the steps' max with the floor, the serving model
        and the tail are evaluated again."""
        items = tuple(_at_scale(item, step_time_scale) for item in self.items)
        pending = [p for p in items if isinstance(p, _Pending)]
        scales = perf.step_time_scales([p.shape.dep for p in pending])
        ctx = replace(self.ctx, step_time_scale=step_time_scale)
        return PreparedSearch(ctx, items, _curves(self.raws, scales, ctx.targets), self.raws)

    def plans(self, requests_per_second: float, burst_rps: float | None = None) -> list[Plan]:
        """Every candidate's plan per batch cap at this rate (req/s), holding capacity for
        ``burst_rps`` (req/s; default: the spec's bursts at the spec's rate, as
        ``plan_target`` sizes them)."""
        workload = self.ctx.workload
        if burst_rps is None:
            burst_rps = workload.burst_rps
        workload = replace(workload, requests_per_second=requests_per_second, burst_rps=burst_rps)
        return self._judged(replace(self.ctx, workload=workload))[0]

    def _judged(self, ctx: _Context) -> tuple[list[Plan], list[Rejection]]:
        """Plans in candidate order, and every candidate's rejections, at ``ctx``'s rate."""
        curves = iter(self.curves)
        plans: list[Plan] = []
        rejections: list[Rejection] = []
        for item in self.items:
            if isinstance(item, Rejection):
                rejections.append(item)
            else:
                first = item.shape.max_num_batched_tokens == ctx.chunks[0]
                _judge(ctx, item, next(curves), plans, rejections if first else [])
        return plans, rejections


def _at_scale(item: _Pending | Rejection, step_time_scale: float) -> _Pending | Rejection:
    """A candidate at another step-time factor. ``EfficiencyTable.lookup`` gives curves
    at time_scale 1, which ``_prepare`` scales by the factor: so the factor is the scale."""
    if isinstance(item, Rejection):
        return item
    dep = item.shape.dep
    eff = replace(dep.efficiency, time_scale=step_time_scale)
    return replace(item, shape=replace(item.shape, dep=replace(dep, efficiency=eff)))


def prepare_search(
    spec: ServingTargetSpec,
    *,
    catalog: Catalog | None = None,
    step_time_scale: float = 1.0,
    efficiency: EfficiencyTable | None = None,
    engine_families: Collection[str] | None = None,
    tp: int | None = None,
    max_num_batched_tokens: int | None = None,
    speculating: bool | None = None,
    draft_tokens: int | None = None,
) -> PreparedSearch:
    """``plan_target``'s search for ``spec``, ready to size at any rate (``PreparedSearch``);
    the same arguments, without the inventory (the loop's shape already runs), and
    ``tp`` and ``max_num_batched_tokens``: the one tensor-parallel degree and prefill
    chunk to search, as the loop's running shape has (None: every degree up to the
    spec's ``maxTensorParallel``, every chunk its ``prefillChunkTokens`` allows), and
    ``speculating``: whether it speculates (None: both kinds of candidate), and
    ``draft_tokens``: the draft length a drafter of one length at every batch
    (``suffix``) runs with (None: each length it may take)."""
    catalog = catalog or load_catalog()
    ctx = _context(spec, catalog, step_time_scale, None, efficiency or load_efficiency())
    if engine_families is not None:
        ctx = replace(ctx, engine_families=frozenset(engine_families))
    if tp is not None:
        ctx = replace(ctx, tp=tp)
    if max_num_batched_tokens is not None:
        ctx = replace(ctx, chunks=(max_num_batched_tokens,))
    ctx = replace(ctx, speculating=speculating)
    if draft_tokens is not None:
        kept = tuple(s for s in ctx.speculations if s.runs_at(draft_tokens))
        ctx = replace(ctx, speculations=kept)
    if _too_long(ctx):  # no plan at any rate (``plan_target`` says why)
        return PreparedSearch(ctx, (), (), ())
    return PreparedSearch.of(ctx, catalog)


def _search(ctx: _Context, catalog: Catalog) -> SearchResult:
    plans, rejections = PreparedSearch.of(ctx, catalog)._judged(ctx)
    result = choose(ctx.spec, plans, rejections)
    if result.plan is not None:  # which curves its step times came from, for explain
        chosen = catalog.gpu(result.plan.gpu)
        result.step_times_from = ctx.efficiency.lookup(chosen, "vllm").describe()
    return result


def _beyond_cluster(
    unrestricted: SearchResult, inventory: GpuInventory, on_shapes: Plan | None
) -> str:
    """What the cluster lacks: more GPUs of a type it has (``on_shapes``, the plan its
    node shapes would hold), and what nodes would do, from the same search over the
    whole catalog."""
    if inventory.gpus_per_node or inventory.unusable or inventory.unknown_products:
        have = f"the cluster's GPU nodes offer {inventory.describe()}"
    else:
        have = f"the cluster has {inventory.describe()}"
    if on_shapes is not None:
        short = inventory.shortfall(on_shapes.gpu, on_shapes.tp, on_shapes.replicas)
        have = f"{have}; on them, {short} for {on_shapes.summary}"
    p = unrestricted.plan
    if p is None:
        return f"{have}; no GPU in the catalog meets this target either"
    if on_shapes is not None and not inventory.lacks_shape(p.gpu, p.tp):
        return have  # the cheapest plan anywhere is on the cluster's own shapes
    return f"{have}; with nodes of {p.tp} {p.gpu} GPU(s) each, this would work: {p.summary}"

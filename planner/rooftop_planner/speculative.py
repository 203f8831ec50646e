"""Speculative decoding priced by the kernel model: drafters, acceptance, draft length.

A speculative step drafts K tokens per decoding sequence, then the model verifies them
in one forward pass: K + 1 query tokens per sequence (the GEMMs and the LM head run over
B · (K + 1) rows; decode attention reads each sequence's KV once for all of them,
``kernel_model.unscaled_totals_s``). With a per-token acceptance a (the chance each
draft token is accepted, given the ones before it were), a sequence advances

    E(a, K) = 1 + a + a² + … + a^K = (1 − a^(K+1)) / (1 − a)   tokens per step

(the accepted drafts plus the token the verification samples itself; Leviathan et al.,
"Fast Inference from Transformers via Speculative Decoding", 2023, eq. 1).

The drafter's own time is priced with the same kernel curves on the same GPU:
- ``draft_model``: a smaller model of the family (its catalog shape);
- ``eagle3``: an EAGLE-3 head, one decoder layer of the model's width and an LM head
  over its own vocabulary (the fused projection of three hidden states, 3 · hidden ×
  hidden, is counted in its weights but not timed: under 0.1 ms on any GPU listed).
Both draft as vLLM's proposers do: a first forward over every token the step brought
(the B · (K + 1) verified positions and any prefill chunk), then K − 1 forwards of one
token per sequence. A drafter forward pays the kernels and the per-layer overhead, not
the engine's per-step overhead (scheduling and sampling happen once per engine step).
- ``mtp``: the model's own multi-token-prediction layers (DeepSeek-V3's), one of its
  layers with a projection and an LM head, in the model's weight dtype;
- ``ngram``: vLLM's prompt lookup, no model: its host time per step, measured
  (``host_time``), no weights, no KV. It drafts only where the sequence's latest
  n-gram occurred before; its acceptance a is per decode step, a step where the lookup
  found nothing counting as one whose first draft was rejected (so E(a, K) stays the
  tokens per step), and it is priced as if every step verified K drafts (vLLM verifies
  only the drafts found: the price errs high).
- ``suffix``: suffix decoding (Arctic Inference's suffix trees over the prompt and
  earlier answers), priced as ``ngram`` is, from its own measured host time, which
  adds the building of each prompt's tree (per prompt token, paid in the step that
  carries the prompt's prefill). vLLM drafts one K at every batch with it, up to K per
  request (fewer where the trees' matches are short), so each K is an option of its
  own (``Speculation.fixed``) and the search keeps the cheapest.

So one step of B sequences costs t(B, K) = verify(B, K) + draft(B, K), and its time per
output token is t(B, K) / E(a, K). The planner picks, per batch size, the K in 0..K_max
with the least time per token (0: no speculation, t(B, 0) / 1), which vLLM takes as
``num_speculative_tokens_per_batch_size``. As the batch grows the step turns
compute-bound, verifying K extra tokens per sequence costs nearly K times more, and K
falls to 0: the break-even batch.
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, replace
from typing import Any

import numpy as np

from rooftop_planner import perf
from rooftop_planner.catalog import Catalog, ModelSpec
from rooftop_planner.drafters import (
    HOST_DRAFTERS,
    HOST_METHODS,
    MTP,
    NGRAM,
    SUFFIX,
    Drafter,
    drafter_shape,
    mtp_drafter,
    packaged_drafters,
    tokens_per_step,
)
from rooftop_planner.host_time import lookup_cost
from rooftop_planner.kernels import FloatArray
from rooftop_planner.perf import EngineShape

# The longest draft the planner considers: EAGLE-3's published acceptance figures use
# up to 7, but with a per-token acceptance under 0.8 a sixth draft token adds under
# a^6 < 0.27 expected tokens, for a full row of verification.
MAX_DRAFT_TOKENS = 5
# Weight dtypes a draft model loads as the target does; others (int4, int8, fp4 need a
# checkpoint of the draft in that format) load the draft in 16 bits.
DRAFT_WEIGHT_DTYPES = ("bf16", "fp16", "fp8")


# ---------------------------------------------------------------- a target's options


@dataclass(frozen=True)
class Speculation:
    """One way a target may speculate: the drafter, the acceptance planned with, the
    drafter's shape (a catalog model, or an EAGLE-3 head built from the model's; None
    for ``ngram`` and ``suffix``, which draft on the host). ``fixed``: the drafter
    drafts ``max_draft_tokens`` at every batch (``suffix``), not the K the schedule
    chooses per batch."""

    drafter: Drafter
    acceptance: float
    acceptance_source: str
    draft: ModelSpec | None
    max_draft_tokens: int = MAX_DRAFT_TOKENS
    fixed: bool = False

    @property
    def method(self) -> str:
        return self.drafter.method

    def runs_at(self, draft_tokens: int) -> bool:
        """Whether engines drafting ``draft_tokens`` at every batch run this option:
        any option of a drafter with a schedule, the one of that length of a drafter
        of one length (``suffix``)."""
        return not self.fixed or self.max_draft_tokens == draft_tokens


def options(
    model: ModelSpec,
    methods: Sequence[str],
    acceptance: float | None,
    catalog: Catalog,
    drafters: Mapping[str, Mapping[str, Drafter]] | None = None,
) -> tuple[list[Speculation], list[str]]:
    """The speculation options ``methods`` allow for ``model``, and why each other
    method is not one (its drafter or its acceptance is unknown)."""
    known = (drafters or packaged_drafters()).get(model.id, {})
    found: list[Speculation] = []
    problems: list[str] = []
    for method in methods:
        if method in HOST_DRAFTERS:
            _host_lookup(method, acceptance, found, problems)
            continue
        drafter = known.get(method) or (mtp_drafter(model) if method == MTP else None)
        if drafter is None:
            problems.append(_no_drafter(model, method, known))
            continue
        rate = acceptance if acceptance is not None else drafter.acceptance
        if rate is None:
            problems.append(
                f"{method}: no published acceptance for {drafter.repo} drafting {model.id}; "
                "set spec.workload.acceptanceRate to the per-token acceptance you measured"
            )
            continue
        source = (
            "spec.workload.acceptanceRate" if acceptance is not None else drafter.acceptance_source
        )
        # MTP layers are trained for their own positions: vLLM may reuse them for longer
        # drafts, at an acceptance nobody publishes, so the planner drafts no further
        longest = drafter.layers if method == MTP else MAX_DRAFT_TOKENS
        shape = drafter_shape(model, drafter, catalog)
        found.append(Speculation(drafter, rate, source, shape, max_draft_tokens=longest))
    return found, problems


def _host_lookup(
    method: str, acceptance: float | None, found: list[Speculation], problems: list[str]
) -> None:
    """Prompt lookup or suffix trees, at the target's stated acceptance: how often they
    draft right is the traffic's (code edits, retrieved documents and agents' repeated
    calls repeat earlier tokens, chat seldom does), so no figure is published per model.
    ``suffix`` takes one K at every batch: one option per K."""
    if acceptance is None:
        problems.append(
            f"{method}: how often {HOST_LOOKUP_WORDS[method]} drafts right depends on your "
            "traffic, not the model; set spec.workload.acceptanceRate to the acceptance per "
            f"decode step you measured (the loop then measures it), or leave {method} out"
        )
        return
    drafter, source = HOST_DRAFTERS[method], "spec.workload.acceptanceRate"
    if method != SUFFIX:
        found.append(Speculation(drafter, acceptance, source, None))
        return
    for k in range(1, MAX_DRAFT_TOKENS + 1):
        found.append(Speculation(drafter, acceptance, source, None, max_draft_tokens=k, fixed=True))


# How a problem or an explanation names each host-side drafter.
HOST_LOOKUP_WORDS = {NGRAM: "prompt lookup", SUFFIX: "suffix decoding"}


def _no_drafter(model: ModelSpec, method: str, known: Mapping[str, Drafter]) -> str:
    if method == MTP:
        return (
            f"mtp: {model.id} has no multi-token-prediction layers (its config.json's "
            "num_nextn_predict_layers is 0 or absent)"
        )
    others = f" (it has {', '.join(sorted(known))})" if known else ""
    return f"{method}: the drafter catalog names no {method} drafter for {model.id}{others}"


# ---------------------------------------------------------------- memory


def draft_engine(dep: EngineShape, spec: Speculation) -> EngineShape | None:
    """The drafter as an engine on the target's GPUs: the same TP (vLLM's default draft
    tensor parallelism), KV dtype and fitted kernels; a draft model or the model's
    MTP layers in the target's weight dtype where vLLM can load them so (16-bit, or fp8
    quantized at load), an EAGLE-3 head in 16 bits as published (None: ``ngram``
    drafts on the host)."""
    if spec.draft is None:
        return None
    weights = "bf16"
    if spec.method in ("draft_model", MTP) and dep.weight_dtype in DRAFT_WEIGHT_DTYPES:
        weights = dep.weight_dtype  # vLLM quantizes the MTP layers as the model's
    return replace(dep, model=spec.draft, weight_dtype=weights)


def kv_capacity_tokens(dep: EngineShape, spec: Speculation, max_num_batched_tokens: int) -> int:
    """Tokens the KV cache holds beside the drafter: vLLM gives the drafter's weights
    their memory first and caches every token in both models' layers, so
    (HBM · util − weights − drafter weights − activations) / (model + drafter KV bytes
    per token)."""
    draft = draft_engine(dep, spec)
    if draft is None:
        return perf.kv_capacity_tokens(dep, max_num_batched_tokens=max_num_batched_tokens)
    loaded = perf.weight_bytes_per_gpu(dep) + perf.weight_bytes_per_gpu(draft)
    loaded += perf.activation_reserve_bytes(dep, max_num_batched_tokens)
    free = dep.gpu.hbm_bytes * perf.DEFAULT_GPU_MEMORY_UTILIZATION - loaded
    per_token = perf.kv_bytes_per_token_per_gpu(dep.model, dep.kv_dtype, dep.tp)
    per_token += perf.kv_bytes_per_token_per_gpu(draft.model, draft.kv_dtype, draft.tp)
    return max(int(free / per_token), 0)


def drafter_bytes_per_gpu(dep: EngineShape, spec: Speculation) -> float:
    """The drafter's weights on each GPU (bytes; none for ``ngram``)."""
    draft = draft_engine(dep, spec)
    return perf.weight_bytes_per_gpu(draft) if draft is not None else 0.0


# ---------------------------------------------------------------- step times


@dataclass(frozen=True)
class SpeculativeSteps:
    """Steps of one candidate on its grid, with the draft length chosen per column.

    draft_tokens: the K chosen at each column (0: no speculation). unscaled, floor: per
    *output token* ("virtual" steps that each advance every sequence one token, s): the
    decode step t(B, K) / E, plus what a step carrying a prefill chunk adds over the
    decode step at the same batch, whole (a chunk delays one real step, whose E tokens
    per sequence it holds back). The serving model (``search``) prices these as it
    prices steps without speculation.
    """

    draft_tokens: FloatArray
    unscaled: FloatArray
    floor: FloatArray


def steps(
    dep: EngineShape,
    spec: Speculation,
    seqs: FloatArray,
    context: FloatArray,
    chunk: FloatArray,
    attended: FloatArray,
) -> SpeculativeSteps:
    """Per column (1-D arrays: the sequences decoding, their cached context, the
    prefill chunk the step carries and its attended pairs), the draft length with the
    least time per output token and the per-token steps at it (``SpeculativeSteps``)."""
    n = seqs.shape[0]
    zero = np.zeros_like(seqs)
    # every draft length at once, the decode steps beside the chunk-carrying ones
    totals, floors = _every_length(
        dep,
        draft_engine(dep, spec),
        spec.method,
        spec.max_draft_tokens,
        np.concatenate([seqs, seqs]),
        np.concatenate([context, context]),
        np.concatenate([zero, chunk]),
        np.concatenate([zero, attended]),
    )
    e = np.array([tokens_per_step(spec.acceptance, k) for k in range(totals.shape[0])])
    decode, full = totals[:, :n], totals[:, n:]
    decode_floor, full_floor = floors[:, :n], floors[:, n:]
    per_token = decode / e[:, None]
    best = np.argmin(per_token, axis=0)
    if spec.fixed:
        best = np.full(n, spec.max_draft_tokens)
    cols = np.arange(n)
    unscaled = per_token[best, cols] + (full - decode)[best, cols]
    floor = (decode_floor / e[:, None])[best, cols] + (full_floor - decode_floor)[best, cols]
    return SpeculativeSteps(draft_tokens=best.astype(np.float64), unscaled=unscaled, floor=floor)


def _every_length(
    dep: EngineShape,
    draft: EngineShape | None,
    method: str,
    longest: int,
    seqs: FloatArray,
    context: FloatArray,
    chunk: FloatArray,
    attended: FloatArray,
) -> tuple[FloatArray, FloatArray]:
    """(kernel sums, floors) of steps verifying k = 0..``longest`` draft tokens per
    sequence (row k), in three array calls: the verifications (K + 1 queries per
    sequence), the drafter's first forwards (over every token the step brought), its
    K − 1 later ones (one token per sequence), less the engine's per-step overhead of
    each drafter forward, paid once in the verification; without a drafter model
    (``ngram``, ``suffix``), the host's lookup over the batch's context instead, whatever
    K, with the trees of the prompt chunk's tokens (``suffix``), and the engine's own host
    work in every row (vLLM runs those without async scheduling)."""
    ks = np.arange(longest + 1, dtype=np.float64)[:, None]

    def rows(values: FloatArray, count: int) -> FloatArray:
        return np.repeat(values[None, :], count, axis=0)

    steps = (rows(seqs, longest + 1), rows(context, longest + 1))
    verify, floor = perf.forward_parts(
        [dep] * (longest + 1),
        *steps,
        rows(chunk, longest + 1),
        rows(attended, longest + 1),
        queries=ks + 1.0,
    )
    if method in HOST_METHODS:
        # vLLM turns async scheduling off for host drafters: its own host work per step
        # no longer hides behind the GPU's, so the step waits for it too
        verify += perf.host_step_s([dep] * (longest + 1), *steps, rows(chunk, longest + 1))
    if longest == 0:
        return verify, floor
    if draft is None:
        verify[1:] += lookup_cost(method).seconds(seqs, context, chunk)[None, :]
        return verify, floor
    drafts = (rows(seqs, longest), rows(context, longest), rows(chunk, longest))
    first, _ = perf.forward_parts(
        [draft] * longest, *drafts, rows(attended, longest), queries=ks[1:] + 1.0
    )
    zero = np.zeros((1, seqs.shape[0]))
    each, _ = perf.forward_parts([draft], seqs[None, :], context[None, :], zero, zero)
    per_step = draft.efficiency.overhead.step_s  # paid once per engine step, in verify
    verify[1:] += first + (ks[1:] - 1.0) * each - ks[1:] * per_step
    return verify, floor


def decode_tpot_s(
    dep: EngineShape, spec: Speculation, batch: float, context_per_seq: float, draft_tokens: int
) -> float:
    """Time per output token of a decode step of ``batch`` sequences at draft length
    ``draft_tokens`` (0: without speculation), the step-time factor applied (s)."""
    totals, floors = _decode_steps(dep, spec, batch, context_per_seq, draft_tokens)
    step = max(totals[draft_tokens] * dep.efficiency.time_scale, floors[draft_tokens])
    return step / tokens_per_step(spec.acceptance, draft_tokens)


def step_ratio(
    dep: EngineShape, spec: Speculation, batch: float, context_per_seq: float, draft_tokens: int
) -> float:
    """A decode step verifying ``draft_tokens`` per sequence, the drafter included, over
    the plain step at the same batch: what the loop's predicted step is multiplied by
    for a speculating engine (vLLM's inter-token latency times whole steps)."""
    if draft_tokens <= 0:
        return 1.0
    totals, _ = _decode_steps(dep, spec, max(batch, 1e-3), context_per_seq, draft_tokens)
    return totals[draft_tokens] / totals[0]


def _decode_steps(
    dep: EngineShape, spec: Speculation, batch: float, context_per_seq: float, longest: int
) -> tuple[list[float], list[float]]:
    """(kernel sums, floors) of one decode step of ``batch`` sequences at every draft
    length 0..``longest`` (s, unscaled)."""
    seqs = np.array([float(batch)])
    context = seqs * perf.cached_tokens(dep.model, context_per_seq)
    zero = np.zeros_like(seqs)
    draft = draft_engine(dep, spec)
    totals, floors = _every_length(dep, draft, spec.method, longest, seqs, context, zero, zero)
    return totals[:, 0].tolist(), floors[:, 0].tolist()


def draft_length(config: str, batch: float) -> int:
    """The draft length a --speculative-config gives a step of ``batch`` requests (its
    schedule's range holding the batch, the last range's beyond it, else
    num_speculative_tokens), as vLLM's scheduler looks it up."""
    parsed = json.loads(config)
    most = int(parsed.get("num_speculative_tokens", 0))
    ranges = parsed.get("num_speculative_tokens_per_batch_size") or [[1, 1 << 30, most]]
    return min(_length_at(ranges, batch), most)


def _length_at(ranges: Sequence[Sequence[int]], batch: float) -> int:
    """K of the (first, last, K) range holding ``batch`` (rounded; the last range's
    beyond them)."""
    at = max(int(round(batch)), 1)
    return int(next((k for first, last, k in ranges if first <= at <= last), ranges[-1][2]))


def schedule(
    dep: EngineShape, spec: Speculation, max_num_seqs: int, context_per_seq: float
) -> list[tuple[int, int, int]]:
    """vLLM's ``num_speculative_tokens_per_batch_size`` for batches 1..max_num_seqs:
    inclusive ranges (first, last, K) of the K with the least time per output token,
    judged at every batch size (the running batch is what vLLM looks up), never rising
    with the batch: a longer draft at a larger batch would win by less than the
    kernel curves' interpolation noise, since verifying costs more per token there."""
    if spec.fixed:
        return [(1, max_num_seqs, spec.max_draft_tokens)]
    seqs = np.arange(1, max_num_seqs + 1, dtype=np.float64)
    context = seqs * perf.cached_tokens(dep.model, context_per_seq)
    zero = np.zeros_like(seqs)
    best = steps(dep, spec, seqs, context, zero, zero).draft_tokens
    chosen = np.minimum.accumulate(best.astype(int))
    ranges: list[tuple[int, int, int]] = []
    for batch, k in enumerate(chosen.tolist(), start=1):
        if ranges and ranges[-1][2] == k:
            ranges[-1] = (ranges[-1][0], batch, k)
        else:
            ranges.append((batch, batch, k))
    return ranges


def break_even_batch(ranges: Sequence[tuple[int, int, int]]) -> int | None:
    """The first batch size from which speculation stays off (None: it pays up to the
    cap)."""
    if not ranges or ranges[-1][2] > 0:
        return None
    return ranges[-1][0]


def max_draft_tokens(ranges: Sequence[tuple[int, int, int]]) -> int:
    return max((k for _, _, k in ranges), default=0)


# Batches the schedule covers: the largest batch cap the search plans. vLLM carries the
# last range's K beyond it, and a schedule to the largest cap serves every smaller one,
# so the loop's cap changes leave the engine's configuration as it is.
SCHEDULE_BATCHES = 512


@dataclass(frozen=True)
class Planned:
    """A plan's speculation: ``config``, vLLM's --speculative-config JSON, and ``note``,
    its words for ``rooftop plan --explain``."""

    config: str
    note: str


_SCHEDULES: dict[tuple[int, int, int], tuple[EngineShape, Speculation, list[tuple[int, int, int]]]]
_SCHEDULES = {}
_SCHEDULES_MAX = 256


def planned(
    dep: EngineShape, spec: Speculation, context_per_seq: float, batch: float
) -> Planned | None:
    """``dep`` speculating with ``spec`` at a mean running batch ``batch`` (None when
    no batch size up to ``SCHEDULE_BATCHES`` gains from it)."""
    ranges = _cached_schedule(dep, spec, context_per_seq)
    if max_draft_tokens(ranges) == 0:
        return None
    config = json.dumps(vllm_config(spec, ranges, dep.weight_dtype), separators=(",", ":"))
    return Planned(config, _note(dep, spec, ranges, context_per_seq, batch))


def planned_fixed(
    dep: EngineShape, spec: Speculation, context_per_seq: float, batch: float
) -> Planned | None:
    """A drafter of one length at every batch (``suffix``) planned again for a running
    ``batch``: the K in 1..``MAX_DRAFT_TOKENS`` with the least time per output token
    there, t(B, K) / E(a, K), at ``spec``'s acceptance (None: none beats not drafting)."""
    at = max(int(round(batch)), 1)
    per_token = [
        decode_tpot_s(dep, spec, at, context_per_seq, k) for k in range(MAX_DRAFT_TOKENS + 1)
    ]
    best = int(np.argmin(per_token))
    if best == 0:
        return None
    return planned(dep, replace(spec, max_draft_tokens=best), context_per_seq, batch)


def _cached_schedule(
    dep: EngineShape, spec: Speculation, context_per_seq: float
) -> list[tuple[int, int, int]]:
    """``schedule`` once per engine, drafter and context (the entry keeps both alive, so
    their ids are not reused while cached)."""
    key = (id(dep), id(spec), round(context_per_seq))
    entry = _SCHEDULES.get(key)
    if entry is not None and entry[0] is dep and entry[1] is spec:
        return entry[2]
    ranges = schedule(dep, spec, SCHEDULE_BATCHES, context_per_seq)
    if len(_SCHEDULES) >= _SCHEDULES_MAX:
        _SCHEDULES.pop(next(iter(_SCHEDULES)))
    _SCHEDULES[key] = (dep, spec, ranges)
    return ranges


def _note(
    dep: EngineShape,
    spec: Speculation,
    ranges: Sequence[tuple[int, int, int]],
    context_per_seq: float,
    batch: float,
) -> str:
    """What the drafter is, the draft lengths per batch, and the decode TPOT with and
    without it at the planned batch."""
    at = max(int(round(batch)), 1)
    k = _length_at(ranges, at)
    with_ms = decode_tpot_s(dep, spec, at, context_per_seq, k) * 1e3
    without_ms = decode_tpot_s(dep, spec, at, context_per_seq, 0) * 1e3
    lengths = ", ".join(f"{k} at {a}-{b}" for a, b, k in ranges if k > 0)
    if spec.fixed:  # vLLM's suffix proposer: no schedule to show
        one = f"one length, as vLLM drafts {spec.method}"
        lengths = f"{spec.max_draft_tokens} at every batch ({one})"
    off = break_even_batch(ranges)
    stops = f"; off from batch {off}, where verifying costs more than it saves" if off else ""
    host = spec.draft is None
    drafter = f"vLLM's {HOST_LOOKUP_WORDS[spec.method]}" if host else spec.drafter.repo
    return (
        f"speculative decoding with {spec.method} ({drafter}, acceptance "
        f"{spec.acceptance:.2f} per token from {spec.acceptance_source}): draft tokens "
        f"{lengths}{stops}. At batch {at}, decode {with_ms:.1f} ms per token with it, "
        f"{without_ms:.1f} ms without; {weights_note(dep, spec)}"
    )


def vllm_config(
    spec: Speculation, ranges: Sequence[tuple[int, int, int]], weight_dtype: str
) -> dict[str, Any]:
    """``--speculative-config`` as vLLM reads it (vllm/config/speculative.py)."""
    config: dict[str, Any] = {"method": spec.method}
    # ngram and suffix load no model; mtp loads the target's own layers (vLLM points
    # it there)
    if spec.draft is not None and spec.method != MTP:
        config["model"] = spec.drafter.repo
    config["num_speculative_tokens"] = max_draft_tokens(ranges)
    if spec.method == "draft_model" and weight_dtype == "fp8":
        config["quantization"] = "fp8"  # quantized at load, as the model's own weights
    if len({k for _, _, k in ranges}) > 1:
        config["num_speculative_tokens_per_batch_size"] = [list(r) for r in ranges]
    return config


def weights_note(dep: EngineShape, spec: Speculation) -> str:
    """What the drafter adds to each GPU's memory, for the plan's explanation."""
    if spec.draft is None:
        return "no drafter weights or KV (it looks up on the host)"
    gb = drafter_bytes_per_gpu(dep, spec) / 1e9
    kv = perf.kv_bytes_per_token_per_gpu(spec.draft, dep.kv_dtype, dep.tp)
    return f"{gb:.1f} GB of drafter weights per GPU, {kv / 1024:.0f} KiB of its KV per token"


__all__ = [
    "Planned",
    "Speculation",
    "SpeculativeSteps",
    "break_even_batch",
    "decode_tpot_s",
    "draft_length",
    "step_ratio",
    "options",
    "planned",
    "planned_fixed",
    "schedule",
    "steps",
    "vllm_config",
]

"""The planner as the controller uses it: a sizing per request rate and step-time factor.

``Planner`` is what ``decide`` needs of a planner (a sizing, a predicted step time);
``PlanTargetPlanner`` is the real one, ``rooftop_planner``'s search pinned to the
running deployment's shape, with its sizings cached. This is the only module of
``rooftop_control`` that imports the planner's search, batching and efficiency model:
the decision law (``control``) sees only ``Sizing`` values, so a fake planner tests it.
"""

from __future__ import annotations

import json
import math
from collections import OrderedDict
from collections.abc import Sequence
from dataclasses import dataclass, replace
from typing import Protocol

from rooftop_api.spec import (
    HOST_METHODS,
    KvDtype,
    PrefixReuse,
    ServingTargetSpec,
    SpeculativeMethod,
    WeightDtype,
    given_speculative_config,
)
from rooftop_control.readings import Reading
from rooftop_control.traffic import Traffic, fitted_prefix
from rooftop_planner import speculative
from rooftop_planner.batching import EngineLimits, predict_continuous
from rooftop_planner.bursts import burst_rate
from rooftop_planner.catalog import ACCELERATOR_FAMILIES, Catalog, ModelSpec, load_catalog
from rooftop_planner.drafters import drafters_for, planned_acceptance
from rooftop_planner.efficiency import load_efficiency
from rooftop_planner.hf_config import resolve_model
from rooftop_planner.perf import EngineShape
from rooftop_planner.plan import Plan
from rooftop_planner.search import PreparedSearch, prepare_search

# Sizings one target keeps (rate on a 1 % grid x factor to 0.01 x lengths on a 5 %
# grid), about 1 KiB each: a tick sizes at a few of them, and a miss costs a fifth of a
# millisecond on a prepared search, so a thousand targets' caches stay small.
SIZING_CACHE_ENTRIES = 32
# The relative grid observed lengths are planned on: finer than their window-to-window
# noise would only miss the cache.
LENGTH_GRID = 0.05
# A cached sizing's key: rate (req/s, 1 % grid), factor, observed lengths or declared
# bursts as the loop scales them (None: the spec as written)
_Key = tuple[float, float, Traffic | None]
# Prepared searches one target keeps (factor x observed lengths and prompt reuse), about
# 11 KiB each, sharing one spec and the kernels' sums: a tick sizes at the factor in use
# and, when it weighs a larger batch cap, at a slower one; older factors are seldom met
# again. A new rate or burst at a known factor and lengths needs no new step-time curves.
SEARCH_CACHE_ENTRIES = 4
# A new draft-length schedule restarts every pod (a 70B pod's start-up is minutes of a
# surge pod billed beside the one it replaces), so the loop rolls one out only where
# it makes a decode step at the running batch at least this much faster per output
# token: the margin a larger batch cap must keep too (``cap_raise_margin``). On the
# speculative example's 10-minute trace a rollout for 8-9 % cost more than it saved
# (``benchmarks/bench_speculative.py --loop``); one measured acceptance moving on its
# grid must not roll the fleet back and forth either.
RESPECULATE_GAIN = 0.15


@dataclass(frozen=True, slots=True)
class Sizing:
    """The planner's answer for one request rate and calibration factor.

    Attributes:
        replicas: replicas needed, NOT limited by min/max/budget (the controller does that).
        max_num_seqs: the batch cap that keeps TPOT within the SLO at this factor.
        usd_per_replica_hour: price of one replica (all its GPUs), USD/h.
        tpot_ms: predicted TPOT at that sizing, ms (None if unknown).
        feasible: False when no batch cap meets the SLO on this deployment.
        capacity_rps: requests/s one replica serves within the SLO (None if unknown).
    """

    replicas: int
    max_num_seqs: int
    usd_per_replica_hour: float
    tpot_ms: float | None = None
    feasible: bool = True
    capacity_rps: float | None = None


@dataclass(frozen=True, slots=True)
class Respeculation:
    """The running drafter's --speculative-config planned again at the drafts' measured
    acceptance.

    Attributes:
        config: vLLM's JSON for the pods to run ("": speculation off).
        why: one line for the event and the decision's reason.
    """

    config: str
    why: str


class Planner(Protocol):
    """The planner, as the controller needs it (``PlanTargetPlanner`` is the real one)."""

    def size(
        self,
        requests_per_second: float,
        step_time_scale: float,
        max_num_seqs: int | None = None,
        traffic: Traffic | None = None,
    ) -> Sizing:
        """Replicas and batch cap for a rate (req/s) with step times scaled by a factor.

        Without ``max_num_seqs``: the cap that gives a replica the most capacity. With
        it: the replicas that cap needs (the cap the pods run), or, where that cap
        cannot keep TPOT within the SLO at this factor, the best cap's sizing.
        ``traffic``: the lengths to plan with once observed (None or declared: the
        spec's workload)."""
        ...

    def step_ms(self, batch: float, prompt_tokens: float, output_tokens: float) -> float:
        """Predicted (unscaled) mean step time, ms, of ``batch`` running requests with
        these mean prompt and output lengths (tokens), prefill chunks included."""
        ...

    def respeculate(
        self, acceptance: float, batch: float, traffic: Traffic
    ) -> Respeculation | None:
        """Speculative decoding planned again for drafts accepted at ``acceptance`` per
        token at a running ``batch`` with ``traffic``'s lengths: a new schedule or none
        (off), or None to keep what the pods run (they do not speculate, or the change
        gains too little for a rollout)."""
        ...


class PlanTargetPlanner:
    """``Planner`` backed by ``rooftop_planner``, pinned to the running deployment's shape.

    Re-planning may change replicas and the batch cap, never the GPU type, TP, dtypes or
    prefill chunk: those need new nodes or a full redeploy, which is the planner's
    (``rooftop plan``) job, not the feedback loop's. min/max replicas and the budget are
    lifted from the pinned spec so the planner reports what the SLO needs; ``decide``
    applies the limits (and says in the conditions when they bind).
    """

    def __init__(self, spec: ServingTargetSpec, plan: Plan, catalog: Catalog | None = None) -> None:
        self.catalog = catalog or load_catalog()
        self.plan = plan
        self.written = spec  # as the user wrote it: ``respeculated`` pins it again
        self.spec = pinned_spec(spec, plan)
        gpu = self.catalog.gpu(plan.gpu)
        eff = load_efficiency().lookup(gpu, "vllm")
        model = resolve_model(spec, self.catalog)
        self.deployment = EngineShape(
            model=model,
            gpu=gpu,
            tp=plan.tp,
            weight_dtype=plan.weight_dtype,
            kv_dtype=plan.kv_dtype,
            efficiency=eff,
        )
        self.speculation = _running_speculation(spec, plan, model, self.catalog)
        self.planned_acceptance = plan_acceptance(spec, plan)
        self.drafts_by_lookup = drafts_by_lookup(spec, plan)
        # the running drafter at each measured acceptance (on its grid: a few)
        self._measured: dict[float, speculative.Speculation] = {}
        self._cache: OrderedDict[_Key, tuple[Sizing, ...]] = OrderedDict()
        self._searches: OrderedDict[tuple[float, Traffic | None], PreparedSearch] = OrderedDict()
        # The lengths sizings were last planned with, most recent last (``_planned``).
        self._anchors: list[Traffic] = []
        # Plan once now, so a spec the planner rejects (say, an edit that added a price
        # for an unknown GPU) raises here, where the caller expects it, not mid-decision.
        self.size(spec.workload.requests_per_second, 1.0)

    def size(
        self,
        requests_per_second: float,
        step_time_scale: float,
        max_num_seqs: int | None = None,
        traffic: Traffic | None = None,
    ) -> Sizing:
        """Replicas and batch cap at a rate (req/s) and factor (see ``Planner.size``);
        every cap's sizing is cached on a 1 % grid of rates and a 5 % grid of lengths,
        held within a step of those last planned (``_planned``)."""
        lengths = None
        if traffic is not None and (traffic.observed or traffic.bursts is not None):
            lengths = self._planned(traffic)
        key = (quantize_rate(requests_per_second), round(step_time_scale, 2), lengths)
        if key in self._cache:
            self._cache.move_to_end(key)
            options = self._cache[key]
        else:
            options = self._cache[key] = self._options(*key)
            if len(self._cache) > SIZING_CACHE_ENTRIES:
                self._cache.popitem(last=False)  # least recently used
        if not options:
            return Sizing(0, self.plan.max_num_seqs, self._price(), None, feasible=False)
        for option in options:
            if option.max_num_seqs == max_num_seqs:
                return option
        # The cap that gives a replica the most capacity (ties: the smaller cap, lower
        # TPOT). Not simply the cheapest plan: at low rates several caps tie at one
        # replica, and the tie-break would make the cap flap with the load.
        return max(options, key=lambda o: (o.capacity_rps or 0.0, -o.max_num_seqs))

    def _planned(self, traffic: Traffic) -> Traffic:
        """The lengths to size with: those of a recent sizing while every figure stays
        within ``LENGTH_GRID`` of them, else ``traffic``'s on the grid; bursts on the
        grid either way.

        Why not the grid alone: the served lengths are a dozen figures (mean and
        quantiles of prompts and answers), and while they drift within their noise one
        of them crosses a grid line on most ticks; each crossing cost new step-time
        curves (two milliseconds), on half the ticks of a simulated hour. Held
        within a grid step of the lengths planned, as the status holds a figure within
        its noise, the curves are recomputed when the traffic changed.
        """
        rounded = traffic.rounded(LENGTH_GRID)
        for i in range(len(self._anchors) - 1, -1, -1):  # the most recent first
            anchor = self._anchors[i]
            if traffic.lengths_near(anchor, LENGTH_GRID):
                self._anchors.append(self._anchors.pop(i))
                return (
                    anchor
                    if anchor.bursts == rounded.bursts
                    else replace(anchor, bursts=rounded.bursts)
                )
        self._anchors.append(replace(rounded, bursts=None))
        del self._anchors[:-SEARCH_CACHE_ENTRIES]
        return rounded

    def _options(self, rate: float, factor: float, traffic: Traffic | None) -> tuple[Sizing, ...]:
        """One sizing per batch cap that keeps TPOT within the SLO (none: infeasible),
        with the observed lengths where given, else the spec's."""
        plans = self._search(factor, traffic).plans(rate, self._burst_rps(rate, traffic))
        # the running shape and routing: the Service's affinity is the plan's (whether
        # the engine speculates, the search's own pin: ``_search``)
        running = (self.plan.tp, self.plan.session_affinity)
        return tuple(_sizing(p) for p in plans if (p.tp, p.session_affinity) == running)

    def _search(self, factor: float, traffic: Traffic | None) -> PreparedSearch:
        """The search at this factor and these lengths, prepared once for every rate and
        burst: a tick's new rate then costs a tenth of a search, a new factor at the same
        lengths half of one (``PreparedSearch``)."""
        observed = _as_curves_see_it(traffic, self.spec.workload.prefix)
        key = (factor, observed)
        if key in self._searches:
            self._searches.move_to_end(key)
            return self._searches[key]
        same_traffic = (s for (_, t), s in self._searches.items() if t == observed)
        if (known := next(same_traffic, None)) is not None:  # a new factor, same traffic
            search = known.rescaled(factor)
        else:
            # The shape is pinned and already runs: its accelerator family had an image.
            search = prepare_search(
                self._spec_for(observed),
                catalog=self.catalog,
                step_time_scale=factor,
                engine_families=ACCELERATOR_FAMILIES,
                # the running shape's degree and prefill chunk; others' curves go unused
                tp=self.plan.tp,
                max_num_batched_tokens=self.plan.max_num_batched_tokens,
                # the engine speculates with its drafter, at the acceptance measured, or
                # does not: one kind of curve
                speculating=bool(self.plan.speculative_config),
                # a drafter of one length at every batch (suffix) keeps the running one
                draft_tokens=self._running_draft_tokens(),
            )
        self._searches[key] = search
        if len(self._searches) > SEARCH_CACHE_ENTRIES:
            self._searches.popitem(last=False)  # least recently used
        return search

    def _spec_for(self, observed: Traffic | None) -> ServingTargetSpec:
        """The pinned spec with the observed lengths and prefix reuse (None: as written)."""
        spec = self.spec
        if observed is None:
            return spec
        prefix = fitted_prefix(spec.workload.prefix, observed, bool(self.plan.session_affinity))
        workload = observed.workload(spec.workload.requests_per_second, prefix)
        if workload.acceptance_rate is None:  # not measured: as stated (or published)
            workload = workload.model_copy(
                update={"acceptance_rate": spec.workload.acceptance_rate}
            )
        return spec.model_copy(update={"workload": workload})

    def _burst_rps(self, rate: float, traffic: Traffic | None) -> float | None:
        """The rate (req/s) to hold capacity for against bursts (``bursts.burst_rate``):
        where the loop reads them, the served bursts at their reference for this rate
        (``Bursts.reference``); with none read, none; with the spec as written (None),
        the declared bursts at the declared rate."""
        if traffic is None:
            return None
        if traffic.bursts is None:
            return 0.0
        b = traffic.bursts
        return burst_rate(b.reference(rate), b.dispersion, self.spec.slo.burst_aim)

    def _price(self) -> float:
        return self.plan.usd_per_replica_hour

    def step_ms(self, batch: float, prompt_tokens: float, output_tokens: float) -> float:
        """The planner's mean step time at this running batch, ms, unscaled: what vLLM's
        inter-token latency averages, one gap per request and step. A speculating
        engine's step verifies the drafts its schedule gives the batch and runs the
        drafter, whatever they yield: so the step-time factor stays apart from the
        acceptance, which the loop measures on its own (``traffic``)."""
        limits = EngineLimits(max_num_batched_tokens=self.plan.max_num_batched_tokens)
        pred = predict_continuous(self.deployment, batch, prompt_tokens, output_tokens, limits)
        step_ms = float(pred.tpot_s) * 1e3
        if self.speculation is None:
            return step_ms
        k = speculative.draft_length(self.plan.speculative_config, batch)
        context = prompt_tokens + output_tokens / 2.0
        return step_ms * speculative.step_ratio(
            self.deployment, self.speculation, batch, context, k
        )

    def _running_draft_tokens(self) -> int | None:
        """The draft length the pods run where their drafter takes one at every batch
        (``suffix``; None: a schedule, or no speculation)."""
        if self.speculation is None or not self.speculation.fixed:
            return None
        return self.speculation.max_draft_tokens

    def respeculate(
        self, acceptance: float, batch: float, traffic: Traffic
    ) -> Respeculation | None:
        """The running drafter's schedule planned again at the measured ``acceptance``
        (``speculative.planned``, at ``traffic``'s mean context) on the running shape:

        - none where drafting pays at no batch size (off: the drafter's weights and KV go
          back to the cache);
        - a new schedule where its draft length at the running ``batch`` makes a
          step's time per output token, t(B, K) / E(a, K), at least
          ``RESPECULATE_GAIN`` shorter than the running length's;
        - else None: the pods keep what they run.
        """
        running = self.plan.speculative_config
        if self.speculation is None or not running:
            return None
        measured = self._measured.get(acceptance)
        if measured is None:  # one per acceptance, so the planner's schedule cache hits
            measured = replace(
                self.speculation, acceptance=acceptance, acceptance_source="measured"
            )
            self._measured[acceptance] = measured
        rounded = traffic.rounded(LENGTH_GRID)
        context = rounded.prompt.mean + rounded.output.mean / 2.0
        # a drafter of one length at every batch (suffix) gets the best one for this batch
        plan_again = speculative.planned_fixed if measured.fixed else speculative.planned
        found = plan_again(self.deployment, measured, context, batch)
        seen = f"drafts are accepted at {acceptance:.2f} per token"
        if found is None:
            where = f"no draft length at the running batch of {batch:.0f}"
            return Respeculation(
                "",
                f"{seen}, where drafting pays at {where if measured.fixed else 'no batch size'} "
                f"on {self.plan.tp}x "
                f"{self.plan.gpu}: speculative decoding off, its drafter's memory goes to "
                "the KV cache (edit the target to plan it again)",
            )
        if found.config == running:
            return None
        was, now = (
            speculative.draft_length(running, batch),
            speculative.draft_length(found.config, batch),
        )
        before = speculative.decode_tpot_s(self.deployment, measured, batch, context, was)
        after = speculative.decode_tpot_s(self.deployment, measured, batch, context, now)
        if after * (1.0 + RESPECULATE_GAIN) > before:
            return None
        change = f"draft length {was} -> {now}"
        if now == 0:  # the schedule still drafts for smaller batches
            change = f"speculation off at this batch (draft length {was} -> 0)"
        return Respeculation(
            found.config,
            f"{seen}: {change} at the running batch of {batch:.0f}, "
            f"{before * 1e3:.1f} -> {after * 1e3:.1f} ms per output token predicted",
        )

    def respeculated(self, config: str) -> PlanTargetPlanner:
        """This planner for the pods once they run ``config`` (vLLM's
        --speculative-config, "": none)."""
        plan = replace(self.plan, speculative_config=config, speculative_note="")
        return PlanTargetPlanner(self.written, plan, self.catalog)


# A pool's factor over the pods' mean moves this share of the way to each window's
# reading (smoothing the window-to-window noise, as the fleet's own factor is), within
# these bounds: a pool measured 3x slower than its peers is a broken pod, not a model.
RATIO_GAIN = 0.3
RATIO_BOUNDS = (0.5, 2.0)


class FleetPlanner(PlanTargetPlanner):
    """``Planner`` for a mixed fleet (``Plan.pools``): it sizes as the pool that sizes
    the fleet (the plan's own shape: every pod serves the same rate, and that pool's pods
    serve the fewest requests/s), and predicts the fleet's mean step time for the
    calibration.

    Why a fleet's step time: vLLM's inter-token latency is averaged over every pod's
    tokens, and evenly spread pods each decode the same tokens per second, so the
    observed mean weighs each pod's step time alike. Compared with the sizing pool's
    prediction alone, the faster pools' shorter steps would read as a planner too slow
    and size the fleet short; compared with the pods' own mix, the factor is the model's
    error, as for one GPU type.

    Each GPU type's own error: where the engines' series name their pool, each pool's
    factor ``φ_g`` (its pods' mean step over its prediction at their batch) is read too,
    and kept as a ratio ``r_g = φ_g / φ̄`` to the pods' mean factor (smoothed, bounded).
    The controller's factor ``f`` scales the fleet; pool ``g`` steps ``f · r_g`` times its
    prediction. The fleet's pod count is then the most any pool needs at its own factor
    and batch cap: evenly spread, every pool's pods serve the same rate.
    """

    def __init__(self, spec: ServingTargetSpec, plan: Plan, catalog: Catalog | None = None) -> None:
        catalog = catalog or load_catalog()
        # before the sizing pool's own planning (``PlanTargetPlanner.__init__`` sizes once)
        self.pools = {pool.gpu: PlanTargetPlanner(spec, pool, catalog) for pool in plan.pools}
        self.caps = {pool.gpu: pool.max_num_seqs for pool in plan.pools}
        self.pods = {pool.gpu: pool.replicas for pool in plan.pools}
        self.ratios = dict.fromkeys(self.pools, 1.0)
        super().__init__(spec, plan, catalog)

    def observed(
        self,
        steps: Sequence[tuple[str, Reading, Reading]],
        prompt_tokens: float,
        output_tokens: float,
    ) -> None:
        """Update each pool's ratio ``r_g`` from its pods' mean step (ms) and decode
        batch this window (class docstring); it needs two pools measured, and a pool
        without a reading keeps its ratio."""
        own = {}
        for gpu, step, batch in steps:
            if gpu in self.pools and step.ok and batch.ok and batch.value > 0:
                predicted = self.pools[gpu].step_ms(batch.value, prompt_tokens, output_tokens)
                if predicted > 0 and step.value > 0:
                    own[gpu] = step.value / predicted
        weights = {gpu: max(self.pods.get(gpu, 0), 1) for gpu in own}
        if len(own) < 2:
            return
        mean = sum(weights[g] * f for g, f in own.items()) / sum(weights.values())
        for gpu, factor in own.items():
            ratio = min(max(factor / mean, RATIO_BOUNDS[0]), RATIO_BOUNDS[1])
            self.ratios[gpu] += RATIO_GAIN * (ratio - self.ratios[gpu])

    def size(
        self,
        requests_per_second: float,
        step_time_scale: float,
        max_num_seqs: int | None = None,
        traffic: Traffic | None = None,
    ) -> Sizing:
        """The sizing pool's sizing (its batch cap, at its own factor), with the most pods
        any pool needs at its own factor and running cap (class docstring)."""
        lead = self.plan.gpu
        scale = step_time_scale * self.ratios.get(lead, 1.0)
        sizing = super().size(requests_per_second, scale, max_num_seqs, traffic)
        needed = [sizing]
        for gpu, planner in self.pools.items():
            if gpu == lead:
                continue
            own = planner.size(
                requests_per_second, step_time_scale * self.ratios[gpu], self.caps[gpu], traffic
            )
            if own.feasible and own.max_num_seqs == self.caps[gpu]:
                needed.append(own)
        most = max(needed, key=lambda s: s.replicas)
        return replace(sizing, replicas=most.replicas, capacity_rps=most.capacity_rps)

    def respeculate(
        self, acceptance: float, batch: float, traffic: Traffic
    ) -> Respeculation | None:
        """None: a mix's pools each run their own schedule, re-planned only with the
        whole target (``Decision.replan_acceptance``), never on their own."""
        return None

    def counted(self, pods: dict[str, int]) -> None:
        """The pods each pool runs now (GPU id -> ready pods), which weigh its step time;
        ignored while none is ready."""
        if sum(pods.values()) > 0:
            self.pods = {gpu: pods.get(gpu, 0) for gpu in self.pools}

    def step_ms(self, batch: float, prompt_tokens: float, output_tokens: float) -> float:
        """``Σ_g n_g · step_g(batch) / Σ_g n_g``, ms, unscaled: each pool's predicted
        step at the window's mean batch, weighed by its pods ``n_g`` (class docstring)."""
        total = sum(self.pods.values())
        if total <= 0:
            return super().step_ms(batch, prompt_tokens, output_tokens)
        steps = (
            n * self.ratios[gpu] * self.pools[gpu].step_ms(batch, prompt_tokens, output_tokens)
            for gpu, n in self.pods.items()
            if n > 0
        )
        return sum(steps) / total


def fleet_planner(spec: ServingTargetSpec, plan: Plan) -> PlanTargetPlanner:
    """The controller's planner for a deployed plan: its shape's, or a mixed fleet's."""
    return FleetPlanner(spec, plan) if plan.pools else PlanTargetPlanner(spec, plan)


def _as_curves_see_it(traffic: Traffic | None, stated: PrefixReuse | None) -> Traffic | None:
    """The observed traffic as far as step-time curves depend on it: lengths and prompt
    reuse, not bursts (capacity held for them is sized per rate), nor a hit count where
    ``fitted_prefix`` fits no reuse to it (no hits and none ``stated``). None: as
    declared."""
    if traffic is None or not traffic.observed:
        return None
    hits = traffic.hits
    if hits is not None and stated is None and hits.ratio <= 0.0:
        hits = None
    return replace(traffic, bursts=None, hits=hits)


def _sizing(plan: Plan) -> Sizing:
    """A candidate plan as the controller sizes with it (price and capacity per replica)."""
    per_replica = 1.0 / plan.replicas
    return Sizing(
        replicas=plan.replicas,
        max_num_seqs=plan.max_num_seqs,
        usd_per_replica_hour=plan.usd_per_hour * per_replica,
        tpot_ms=plan.tpot_ms,
        feasible=True,
        capacity_rps=plan.capacity_rps * per_replica,
    )


def quantize_rate(rate: float) -> float:
    """``rate`` rounded UP to a 1 % grid (req/s), so cached plans never under-size."""
    if rate <= 1e-3:
        return 0.0
    return round(1.01 ** math.ceil(math.log(rate) / math.log(1.01) - 1e-9), 6)


def _running_speculation(
    spec: ServingTargetSpec, plan: Plan, model: ModelSpec, catalog: Catalog
) -> speculative.Speculation | None:
    """The drafter the running engines speculate with (None: they do not, or its
    drafter is no longer in the catalog: then steps are predicted as plain ones)."""
    method = _running_method(plan)
    if method is None:
        return None
    # the acceptance does not matter to a step's time; a stated or published one will do
    found, _ = speculative.options(
        model,
        [method[0].value],
        spec.workload.acceptance_rate or 0.5,
        catalog,
        drafters_for(spec, model),
    )
    # a drafter of one length at every batch (suffix) is an option per length: the
    # running one drafts the length its config gives every batch
    running = speculative.draft_length(plan.speculative_config, 1)
    found = [s for s in found if s.runs_at(running)]
    return found[0] if found else None


def plan_acceptance(spec: ServingTargetSpec, plan: Plan) -> float | None:
    """The per-token acceptance ``plan``'s drafts were planned at: the one the loop
    measured and planned again with, else the spec's or the drafter's published one
    (None: the plan does not speculate)."""
    method = _running_method(plan)
    if method is None:
        return None
    if plan.measured_acceptance is not None:
        return plan.measured_acceptance
    return planned_acceptance(spec, method[0].value)


def drafts_by_lookup(spec: ServingTargetSpec, plan: Plan) -> bool:
    """Whether the engines draft by a lookup on the host (``ngram``, ``suffix``), which
    drafts only where it finds a match, so that the loop reads its acceptance per decode
    step (``traffic.measured_acceptance``): by ``plan``'s method, else by the
    --speculative-config ``spec.engine.extraArgs`` gives them."""
    if plan.speculative_config:
        running = _running_method(plan) or []
        return bool(running) and running[0] in HOST_METHODS
    return _extra_args_method(spec.engine.extra_args or []) in HOST_METHODS


def _extra_args_method(args: list[str]) -> str | None:
    """The method of the --speculative-config in ``args``, as vLLM reads it: "method",
    else "ngram" where "model" says so (None: no config, or not a JSON object)."""
    config = given_speculative_config(args)
    if config is None:
        return None
    lookup = SpeculativeMethod.NGRAM if config.get("model") in ("ngram", "[ngram]") else None
    method = config.get("method") or lookup
    return None if method is None else str(method).strip("[]")


def _running_method(plan: Plan) -> list[SpeculativeMethod] | None:
    """The speculative method ``plan`` deploys, as constraints.speculative lists it."""
    if not plan.speculative_config:
        return None
    return [SpeculativeMethod(json.loads(plan.speculative_config)["method"])]


def pinned_spec(spec: ServingTargetSpec, plan: Plan) -> ServingTargetSpec:
    """``spec`` restricted to ``plan``'s GPU, TP and dtypes, with limits lifted."""
    constraints = spec.constraints.model_copy(
        update={
            "gpu_types": [plan.gpu],
            "weight_dtypes": [WeightDtype(plan.weight_dtype)],
            "kv_dtypes": [KvDtype(plan.kv_dtype)],
            "max_tensor_parallel": plan.tp,
            # the running drafter only (none where the plan does not speculate)
            "speculative": _running_method(plan),
            "min_replicas": 0,
            "max_replicas": 1000,
        }
    )
    budget = spec.budget.model_copy(update={"usd_per_hour": 1e7})
    return spec.model_copy(update={"constraints": constraints, "budget": budget})

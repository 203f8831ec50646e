"""``rooftop simulate``: replay a request trace against a simulated cluster, per policy.

    rooftop simulate TARGET.yaml --trace CSV [--policy rooftop|static-peak|queue-threshold
        |oracle|oracle-instant|static-fit|mixed|rooftop-mixed|all] [--reality-factor F]
        [--startup-s S]
        [--scrape-s 15] [--diurnal] [--routing least-outstanding|random|session
        |prefix-aware] [-o text|table|wide|json|yaml] [--plot FILE.png]

``--policy mixed`` holds the planner's fleet of several GPU types at its size (where it
offers one: it costs less than the single-type plan); ``--policy rooftop-mixed`` runs the
operator's loop on that fleet, as the operator deploys it; ``all`` includes both then.
``--policy all`` ends with a table comparing the policies (SLO attainment, mean $/h,
cost against the oracle, replica-hours). On a terminal, stderr shows which policy runs
and how much of the trace it has simulated; nothing is written there otherwise.

The planner picks the deployment shape (GPU, TP, dtypes) for the target once; every
policy then runs that shape, so they differ only in how many replicas (and which batch
cap) they run when. Each replica is an ``engine_sim.core`` engine timed by the truth
model times ``--reality-factor`` (the planner does not know it: that is what online
calibration is for). Simulated time, so an hour of trace takes seconds. Each engine
caches prompt prefixes as vLLM does; a Mooncake trace names its prompts' blocks, and
``--routing`` says how requests find their pod (``cluster.ROUTINGS``), which decides how
often a prompt meets its conversation's earlier turns in its pod's cache.

Exit codes: 0 ok, 2 unusable input (target, trace, or no feasible plan).
"""

from __future__ import annotations

import argparse
import json
import math
import sys
import warnings
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field, replace
from typing import Any

import numpy as np

from rooftop_api import exit_codes
from rooftop_api.output import (
    JSON,
    TABLE,
    TEXT,
    WIDE,
    YAML,
    add_output_option,
    dumps,
    plot_path_problem,
    print_table,
)
from rooftop_api.spec import MeasuredWorkload, ServingTargetSpec
from rooftop_control import control, defaults, sizing
from rooftop_control.calibration import Calibration
from rooftop_control.traffic import with_measured
from rooftop_planner.batching import mean_step_s
from rooftop_planner.bursts import dispersion, interval_counts
from rooftop_planner.catalog import load_catalog, simulated_model_problem
from rooftop_planner.drafters import Drafter, named_drafter, planned_acceptance
from rooftop_planner.fleet import FleetPrice, MixedFleet
from rooftop_planner.inventory import GpuInventory
from rooftop_planner.plan import Plan
from rooftop_planner.pricing import ReplicaPrice, replica_price
from rooftop_planner.progress import Progress
from rooftop_sim.cluster import (
    ROUTINGS,
    Cluster,
    ClusterConfig,
    FixedPool,
    FloatArray,
    Policy,
    Replica,
    RequestStream,
    SimResult,
)
from rooftop_sim.errors import SimError
from rooftop_sim.flags import Rule, check_ranges
from rooftop_sim.oracle import OracleConfig, oracle_policy, static_fit
from rooftop_sim.policies import (
    FixedPolicy,
    QueueThresholdPolicy,
    Replanned,
    Replanner,
    RooftopPolicy,
    SchedulePolicy,
)
from rooftop_sim.report import Slo, comparison, plot, summary, text

POLICIES = ("rooftop", "static-peak", "queue-threshold", "oracle", "oracle-instant", "static-fit")
# The planner's mixed fleet, held at its size: run where the planner offers one.
MIXED = "mixed"
# The operator's loop on the planner's mixed fleet (what the operator runs where it
# deploys one): the fleet's pods sized with its slowest pool, placed on the cheapest.
MIXED_LOOP = "rooftop-mixed"
MIXES = (MIXED, MIXED_LOOP)
# Hindsight schedules: "oracle" starts each pod a start-up ahead of when it is needed
# (perfect knowledge, same physics as every other policy, start-up billed);
# "oracle-instant" gets pods ready the moment it wants them (a looser lower bound).
ORACLES = ("oracle", "oracle-instant")
FORMATS = (TEXT, TABLE, WIDE, JSON, YAML)


class InputError(SimError):
    """The target or trace cannot be simulated; the message says why."""


@dataclass(frozen=True)
class Prior:
    """What the rooftop controller knows before the first scrape (experiments:
    ``benchmarks/bench_prior.py``). The operator itself starts cold: factor 1, trim 1.

    Attributes:
        factor: step-time factor, held as a settled estimate (later windows still
            move it, as in a controller that has run for a while).
        trim: latency trim on the rate the planner sizes for.
    """

    factor: float = 1.0
    trim: float = 1.0


@dataclass(frozen=True)
class SimScenario:
    """Everything a run needs besides the policy."""

    spec: ServingTargetSpec
    plan: Plan  # the shape every policy runs
    planner: sizing.PlanTargetPlanner
    workload: RequestStream
    sim: ClusterConfig
    slo: Slo
    cache: dict[Any, Any] = field(default_factory=dict, compare=False, repr=False)
    mixed: MixedFleet | None = None  # the planner's cheaper fleet of several GPU types
    # the replicas of the plan's shape the free GPUs hold (``--nodes``); None: uncounted
    inventory_replicas: int | None = None
    gpu_inventory: GpuInventory | None = None  # the free GPUs (``--nodes``), for re-plans

    @property
    def usd_per_replica_hour(self) -> float:
        return self.plan.usd_per_replica_hour

    @property
    def price(self) -> ReplicaPrice:
        """What replica counts cost (owned GPUs first): the cluster bills them so
        (``scenario`` sets it) and the controller prices them so, as the operator does."""
        return self.sim.price or ReplicaPrice.flat(self.usd_per_replica_hour)

    def oracle_config(self) -> OracleConfig:
        """The hindsight baselines' shares: the SLO's own percentiles, what the target
        asks for (the cheapest schedule that keeps exactly that is the cost bound)."""
        slo = self.spec.slo
        return OracleConfig(
            tpot_share=slo.tpot_percentile.quantile, ttft_share=slo.ttft_percentile.quantile
        )

    def limits(self) -> tuple[int, int]:
        """(min, max) replicas allowed by the target's constraints and budget."""
        cfg = control.config_from_spec(self.spec, self.planner, self.price)
        return control.replica_limits(replace(cfg, inventory_replicas=self.inventory_replicas))


# A week of simulated time: the longest Azure LLM traces; beyond that a span is far more
# likely a unit mistake (epoch milliseconds) than a trace, and would run for hours.
MAX_TRACE_SPAN_S = 7 * 86400.0


def workload_from_trace(path: str, diurnal: bool = False) -> RequestStream:
    """Read an Azure or Mooncake trace (``traces.load_trace``); optionally day-shaped."""
    from rooftop_sim.traces import TraceError, TraceWarning, diurnal_warp, load_trace

    try:
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always", TraceWarning)
            trace = load_trace(path)
    except TraceError as err:
        raise InputError(str(err)) from err
    for warning in caught:  # rows out of order: sorted, but the user should know
        print(f"rooftop simulate: warning: {warning.message}", file=sys.stderr)
    if len(trace) < 2:
        raise InputError(f"{path}: needs at least 2 requests, has {len(trace)}")
    span_s = float(trace.arrival_s[-1])
    if not 0 < span_s <= MAX_TRACE_SPAN_S:
        raise InputError(
            f"{path}: the requests span {span_s:.6g} s; rooftop simulate replays traces "
            f"that span more than 0 s and at most {MAX_TRACE_SPAN_S / 86400:g} days "
            "(are the TIMESTAMPs milliseconds? they must be seconds or ISO date-times)"
        )
    arrivals = diurnal_warp(trace.arrival_s) if diurnal else trace.arrival_s
    name = f"{path}{' (diurnal)' if diurnal else ''}"
    return RequestStream(
        np.asarray(arrivals, dtype=np.float64),
        np.maximum(trace.prompt_tokens, 1),
        np.maximum(trace.output_tokens, 1),  # a 0-token answer still takes a step
        name,
        trace.prefix,
        trace.session,
    )


def load_spec(path: str) -> Any:
    """The ServingTarget spec from a manifest (ManifestError -> InputError)."""
    return load_manifest(path).spec


def load_manifest(path: str) -> Any:
    """The ServingTarget from a manifest (ManifestError -> InputError)."""
    from rooftop_api.manifest import ManifestError, load_target

    try:
        return load_target(path)
    except ManifestError as err:
        raise InputError(str(err)) from err


def nodes_inventory(path: str, target: Any) -> GpuInventory:
    """The GPUs the nodes in ``path`` (``kubectl get nodes,pods -A -o json``) offer
    ``target``'s pods, less what the listed pods hold (InventoryError -> InputError)."""
    from rooftop_planner.inventory import InventoryError, load_cluster, target_inventory

    own = (target.metadata.namespace or "default", target.metadata.name)
    try:
        return target_inventory(load_cluster(path), load_catalog(), target.spec.constraints, own)
    except InventoryError as err:
        raise InputError(f"--nodes: {err}") from err


def replica_of(
    model: str, plan: Plan, acceptance: float | None = None, drafter: Drafter | None = None
) -> Replica:
    """What one pod of ``plan`` runs (``Replica.of``)."""
    return Replica.of(model, plan, acceptance, drafter)


def drafting(
    spec: ServingTargetSpec, plan: Plan, acceptance: float | None
) -> tuple[float | None, Drafter | None]:
    """How ``plan``'s pods draft: the acceptance they meet (``acceptance``, else the
    one the plan was made with) and the drafter spec.engine.drafter names (None: the
    catalog's, which engine-sim finds itself); (None, None) without speculation."""
    if not plan.speculative_config:
        return None, None
    method = json.loads(plan.speculative_config)["method"]
    truth = acceptance if acceptance is not None else planned_acceptance(spec, method)
    return truth, named_drafter(spec)


def scenario(
    spec: ServingTargetSpec,
    workload: RequestStream,
    gpu_inventory: GpuInventory | None = None,
    acceptance: float | None = None,
    **sim_kw: Any,
) -> SimScenario:
    """Plan the target (its shape, at its own workload rate; within ``gpu_inventory``'s
    free GPUs when given, as the operator with ``gpuInventory: nodes``) and set up the
    cluster. Every policy then runs at most the replicas those GPUs hold. A plan that
    speculates meets ``acceptance`` (None: the one it was planned with)."""
    from rooftop_planner.errors import PlannerError
    from rooftop_planner.search import plan_target

    try:
        result = plan_target(spec, gpu_inventory=gpu_inventory)
    except PlannerError as err:  # an unknown model or a bad spec.modelConfig
        raise InputError(str(err)) from err
    if (problem := simulated_model_problem(spec.model)) is not None:
        raise InputError(problem)
    if result.plan is None:
        raise InputError("no plan meets the SLO within the budget:\n" + result.explain())
    plan = result.plan
    fit = None if gpu_inventory is None else gpu_inventory.replicas_fit(plan.gpu, plan.tp)
    sim = ClusterConfig(
        replica_of(spec.model, plan, *drafting(spec, plan, acceptance)),
        price=replica_price(spec, load_catalog(), plan.gpu, plan.tp),
        tpot_quantile=spec.slo.tpot_percentile.quantile,
        ttft_quantile=spec.slo.ttft_percentile.quantile,
        tpot_slo_ms=spec.slo.tpot_ms,
        **sim_kw,
    )
    slo = Slo(spec.slo.tpot_ms, spec.slo.ttft_ms)
    scn = SimScenario(
        spec=spec,
        plan=plan,
        planner=sizing.PlanTargetPlanner(spec, plan),
        workload=workload,
        sim=sim,
        slo=slo,
        mixed=result.mixed,
        inventory_replicas=fit,
        gpu_inventory=gpu_inventory,
    )
    # the budget, maxReplicas and the free GPUs bound the pods every policy may run
    # (billed pods: starting and draining ones included)
    return replace(scn, sim=replace(sim, max_pods=scn.limits()[1]))


def peak_rate(workload: RequestStream, window_s: float = 60.0) -> float:
    """Highest arrival rate over non-overlapping ``window_s`` windows, req/s."""
    edges = np.arange(0.0, workload.horizon_s + window_s, window_s)
    if len(edges) < 2:
        return len(workload.arrival_s) / window_s
    return float(np.histogram(workload.arrival_s, bins=edges)[0].max()) / window_s


def true_factor(scn: SimScenario, batch: float) -> float:
    """Truth mean step / planner mean step at ``batch``, x reality: what a perfectly
    calibrated controller would learn; only the oracle gets it.

    Both sides use the one serving model (``batching.mean_step_s``): a decode step of
    ``batch`` sequences plus B / (osl + 1.5) admissions per step, each carrying its
    prompt in chunks of at most the token budget beside the decodes.
    """
    from rooftop_sim.engine.truth import TruthModel

    r = scn.sim.replica
    truth = TruthModel.for_deployment(r.model, r.gpu, r.tp, r.weight_dtype, r.kv_dtype)
    isl = float(np.mean(scn.workload.prompt_tokens))
    osl = float(np.mean(scn.workload.output_tokens))
    predicted_ms = scn.planner.step_ms(batch, isl, osl)
    running, context = int(round(batch)), int(batch * (isl + osl / 2))
    chunks = max(math.ceil(isl / max(r.max_num_batched_tokens - batch, 1.0)), 1)
    chunk = isl / chunks
    decode = truth.step_s(running, context, 0, 0.0)
    carrying = truth.step_s(running, context, int(chunk), chunk * isl / 2)
    step = mean_step_s(decode, chunks * (carrying - decode), batch, osl)
    return scn.sim.reality_factor * step * 1e3 / predicted_ms


def make_policy(
    scn: SimScenario,
    name: str,
    oracle: OracleConfig | None = None,
    controller: Mapping[str, Any] | None = None,
    prior: Prior | None = None,
) -> tuple[Policy, list[str]]:
    """The named policy for this scenario, and notes on how it was sized.

    ``controller``: ``ControllerConfig`` fields to override for ``rooftop`` (tuning
    experiments, ``benchmarks/bench_targets.py``); the operator's defaults otherwise.
    ``prior``: what ``rooftop`` knows at the start (cold, as the operator, by default).
    """
    lower, upper = scn.limits()
    # Autoscalers start warm, as if they had been running before the trace: at the
    # planner's size for the first minutes' rate (not the spec's rate, which would make
    # the first scale-down window a transient of the experiment, not of the policy).
    head_s = min(300.0, scn.workload.horizon_s) or 1.0
    head_rate = np.searchsorted(scn.workload.arrival_s, head_s) / head_s
    if name == "rooftop":
        return _rooftop(scn, head_rate, (lower, upper), controller or {}, prior or Prior()), []
    first = scn.planner.size(head_rate, 1.0)
    start = control.clamp_replicas(first.replicas, lower, upper)
    if name in ("static-peak", "static-fit"):
        peak = peak_rate(scn.workload)
        size = scn.planner.size(peak, 1.0)
        n = control.clamp_replicas(size.replicas, lower, upper)
        if name == "static-peak":
            return FixedPolicy(n, size.max_num_seqs), [f"sized for peak {peak:.2f} req/s: {n}"]
        shares = oracle or scn.oracle_config()
        fixed, met = static_fit(
            scn.workload, scn.sim, scn.slo, size.max_num_seqs, n, lower, upper, shares
        )
        how = "fewest" if met else "none within the limits meet the SLO; the most"
        return fixed, [f"{how} fixed replicas meeting the SLO on this trace: {fixed.replicas}"]
    if name == "queue-threshold":
        return QueueThresholdPolicy(start, first.max_num_seqs, lower, upper), []
    if name in ORACLES:
        startup = scn.sim.startup_s if name == "oracle" else 0.0
        policy, notes = _oracle(scn, lower, upper, oracle or scn.oracle_config(), startup)
        return replace(policy, name=name), notes
    if name == MIXED and scn.mixed is not None:
        pool = scn.mixed.pools[0].plan  # the policy's pods; the other pools are fixed
        return FixedPolicy(pool.replicas, pool.max_num_seqs, name=MIXED), [scn.mixed.summary]
    if name == MIXED_LOOP and scn.mixed is not None:
        return _rooftop_mixed(scn.spec, scn.mixed, scn.sim, (lower, upper)), [scn.mixed.summary]
    if name in MIXES:
        raise InputError(f"the planner offers no mixed fleet for this target (--policy {name})")
    raise ValueError(f"unknown policy {name!r}; choose from {', '.join(POLICIES)}")


def cluster_config(scn: SimScenario, name: str) -> ClusterConfig:
    """The cluster a policy runs on: the plan's pods, or for ``mixed`` the mixed fleet's
    first pool as the policy's pods and the others fixed beside them; for
    ``rooftop-mixed`` the pool that sizes the fleet as the policy's pods, the others
    beside them, every pool's size following the loop's pod count (``spill``)."""
    if name not in MIXES or scn.mixed is None:
        return scn.sim
    catalog = load_catalog()
    if name == MIXED:
        pools = [(p.plan, p.plan.replicas) for p in scn.mixed.pools]
        first = pools[0][0]
        price = replica_price(scn.spec, catalog, first.gpu, first.tp)
        return replace(with_pools(scn.sim, scn.spec.model, pools), max_pods=None, price=price)
    fleet = scn.mixed.plan()
    ordered = sorted(fleet.pools, key=lambda p: p.gpu != fleet.gpu)  # the sizing pool first
    prices = [(p.gpu, replica_price(scn.spec, catalog, p.gpu, p.tp)) for p in ordered]
    split = FleetPrice(tuple(prices)).split
    sim = with_pools(scn.sim, scn.spec.model, [(p, p.replicas) for p in ordered])
    priced = tuple(
        replace(f, price=price) for f, (_, price) in zip(sim.fixed_pools, prices[1:], strict=True)
    )
    return replace(
        sim,
        fixed_pools=priced,
        max_pods=None,
        price=prices[0][1],
        spill=lambda pods: [split(pods)[p.gpu] for p in ordered],
    )


def _rooftop_mixed(
    spec: ServingTargetSpec, mixed: MixedFleet, sim: ClusterConfig, limits: tuple[int, int]
) -> RooftopPolicy:
    """The operator's controller on a mixed fleet as it runs it (``loop.feedback``): the
    fleet's planner and price, started at the planned fleet. The fleet's predicted step
    time weighs the pools by their planned pods, and every pool keeps the fleet's factor
    (the operator weighs them by their ready pods and learns each pool's own factor from
    its series; the simulated cluster reports neither per pool)."""
    fleet = mixed.plan()
    catalog = load_catalog()
    prices = tuple((p.gpu, replica_price(spec, catalog, p.gpu, p.tp)) for p in fleet.pools)
    cfg = control.config_from_spec(
        spec,
        sizing.FleetPlanner(spec, fleet, catalog),
        FleetPrice(prices),
        startup_s=sim.startup_s,
        metrics_window_s=sim.window_s,
    )
    start = control.clamp_replicas(fleet.replicas, *limits)
    return RooftopPolicy(cfg, start, fleet.max_num_seqs, name=MIXED_LOOP)


def with_pools(sim: ClusterConfig, model: str, pools: Sequence[tuple[Plan, int]]) -> ClusterConfig:
    """``sim`` running pools of ``(plan, pods)``: the first pool's pods are the policy's
    (its ``replica``), the others fixed beside them."""
    (first, _), others = pools[0], pools[1:]
    fixed = tuple(FixedPool(replica_of(model, p), pods, p.max_num_seqs) for p, pods in others)
    return replace(sim, replica=replica_of(model, first), fixed_pools=fixed)


def _rooftop(
    scn: SimScenario,
    head_rate: float,
    limits: tuple[int, int],
    controller: Mapping[str, Any],
    prior: Prior,
) -> RooftopPolicy:
    """The operator's controller, started at the planner's size for ``head_rate`` (within
    ``limits``, min and max replicas) with what ``prior`` says it knows."""
    cfg = control.config_from_spec(
        scn.spec,
        scn.planner,
        scn.price,
        startup_s=scn.sim.startup_s,
        metrics_window_s=scn.sim.window_s,
        **{"inventory_replicas": scn.inventory_replicas, **controller},
    )
    cfg = replace(
        cfg,
        planned_acceptance=scn.planner.planned_acceptance,
        acceptance_per_decode_step=scn.planner.drafts_by_lookup,
    )
    first = scn.planner.size(head_rate * prior.trim, prior.factor)
    start = control.clamp_replicas(first.replicas, *limits)
    policy = RooftopPolicy(cfg, start, first.max_num_seqs, replanner=_replanner(scn))
    if prior != Prior():
        settled = Calibration(prior.factor, cfg.calibration.settled_samples)
        policy.state = replace(policy.state, calibration=settled, trim=prior.trim)
    return policy


def _replanner(scn: SimScenario) -> Replanner:
    """The target planned again with a measured per-token acceptance and served lengths
    (None: the spec's) at the loop's rate (None: the spec's), as the operator's
    reconcile does (within the free GPUs where counted); None where no plan of one GPU
    type is found."""
    from rooftop_planner.search import plan_target

    def replan(
        acceptance: float | None, measured: MeasuredWorkload | None, rate: float | None
    ) -> Replanned | None:
        workload = with_measured(scn.spec.workload, measured)
        if acceptance is not None:
            workload = workload.model_copy(update={"acceptance_rate": acceptance})
        spec = scn.spec.model_copy(update={"workload": workload})
        found = plan_target(spec, requests_per_second=rate, gpu_inventory=scn.gpu_inventory)
        plan = found.deployed
        if plan is None or plan.pools:
            return None
        counted = scn.gpu_inventory
        fit = None if counted is None else counted.replicas_fit(plan.gpu, plan.tp)
        return Replanned(plan, fit)

    return replan


def _oracle(
    scn: SimScenario, lower: int, upper: int, cfg: OracleConfig, startup_s: float
) -> tuple[SchedulePolicy, list[str]]:
    """The hindsight schedule for pods that take ``startup_s`` to start (searched once
    per scenario, config and start-up: about a minute each)."""
    key = ("oracle", lower, upper, cfg, startup_s)
    if key not in scn.cache:
        scn.cache[key] = _search_oracle(scn, lower, upper, cfg, startup_s)
    cached: tuple[SchedulePolicy, list[str]] = scn.cache[key]
    return cached


def _search_oracle(
    scn: SimScenario, lower: int, upper: int, cfg: OracleConfig, startup_s: float
) -> tuple[SchedulePolicy, list[str]]:
    mean_rate = len(scn.workload.arrival_s) / max(scn.workload.horizon_s, 1e-9)
    first = scn.planner.size(mean_rate, 1.0)
    factor = true_factor(scn, first.max_num_seqs / 2)
    size = scn.planner.size(mean_rate, min(factor, 3.0))
    if not size.feasible:
        size = first
    guess = size.capacity_rps or mean_rate / max(size.replicas, 1)
    policy, capacity = oracle_policy(
        scn.workload, scn.sim, scn.slo, size.max_num_seqs, guess, lower, upper, cfg, startup_s
    )
    note = (
        f"true step-time factor {factor:.2f}, cap {size.max_num_seqs}, measured "
        f"capacity {capacity:.3f} req/s per replica"
    )
    return policy, [note]


def run(
    scn: SimScenario,
    name: str,
    oracle: OracleConfig | None = None,
    controller: Mapping[str, Any] | None = None,
    prior: Prior | None = None,
    progress: Callable[[float], None] | None = None,
) -> tuple[SimResult, dict[str, Any]]:
    """One policy over the scenario: the raw result and its JSON summary
    (``controller``, ``prior``: see ``make_policy``; ``progress``: called with the
    simulated time at each scrape of the final run)."""
    policy, notes = make_policy(scn, name, oracle, controller, prior)
    startup = 0.0 if name == "oracle-instant" else None
    res = Cluster(scn.workload, cluster_config(scn, name), startup_s=startup).run(policy, progress)
    res.notes.extend(notes)
    if isinstance(policy, RooftopPolicy):
        res.notes.append(controller_note(policy))
        res.notes.extend(engine_notes(policy))
    out = summary(res, scn.slo, scn.sim.reality_factor)
    priced = scn.mixed.usd_per_hour if name in MIXES and scn.mixed else scn.plan.usd_per_hour
    out["plan_usd_per_hour"] = round(priced, 4)
    if name not in MIXES:
        res.notes.append(spend_note(scn.plan, out))
    if scn.inventory_replicas is not None and name not in MIXES:
        shape = f"{scn.plan.tp}x {scn.plan.gpu}"
        res.notes.append(
            f"the free GPUs hold {scn.inventory_replicas} replica(s) of {shape} (--nodes)"
        )
    res.notes.append(arrivals_note(scn.workload.arrival_s, scn.spec))
    return res, out


def arrivals_note(arrival_s: FloatArray, spec: ServingTargetSpec) -> str:
    """How bursty the trace arrives, as the operator would read it from its engines, next
    to what the spec states: the figure a user replaying their own trace would declare."""
    seen = dispersion(interval_counts(arrival_s))
    stated = spec.workload.arrival_dispersion
    said = f"{stated:g}" if stated is not None else "unset (1)"
    return (
        f"the trace's arrival dispersion is {seen:.3g} (15-s counts; "
        f"spec.workload.arrivalDispersion: {said})"
    )


def spend_note(plan: Plan, summary: Mapping[str, Any]) -> str:
    """The plan's price (replicas for the declared workload) against what this run
    spent per hour of trace: where the two differ, the declared workload, the planner's
    model or the policy is off, and a user sizing a budget from the plan should know."""
    hours = max(float(summary["horizon_s"]), 1e-9) / 3600.0
    spent = float(summary["usd"]) / hours
    ratio = spent / plan.usd_per_hour if plan.usd_per_hour > 0 else math.inf
    return (
        f"the plan costs ${plan.usd_per_hour:.2f}/h ({plan.replicas} replica(s) for "
        f"spec.workload); this run spent ${spent:.2f}/h, {ratio:.2f}x the plan"
    )


def controller_note(policy: RooftopPolicy) -> str:
    """Where the loop's estimates ended: the step-time factor and the latency trim (the
    planner's capacity error it made up online; docs/benchmarks.md)."""
    st = policy.state
    return (
        f"controller ended at step-time factor {st.calibration.factor:.2f}, latency "
        f"trim {st.trim:.2f}"
    )


def engine_notes(policy: RooftopPolicy) -> list[str]:
    """When and why the loop changed what its pods run (new drafts, a re-planned
    target), and what they ran from then on."""
    notes = []
    for d in policy.decisions:
        replanned = (d.replan_acceptance, d.replan_workload) != (None, None)
        if not replanned and d.speculative_config is None:
            continue
        at = d.state.last_cap_change_s or 0.0
        what = "planned the target again" if replanned else "new drafts"
        notes.append(f"at minute {at / 60.0:.1f} the loop {what}: {d.speculation_why}")
    if policy.reshape is not None:
        plan = policy.reshape.plan
        drafts = "with drafts" if plan.speculative_config else "without speculation"
        notes.append(f"its pods then ran {plan.gpu} at TP{plan.tp} {drafts}")
    return notes


# ---------------------------------------------------------------- CLI


def register(subparsers: Any) -> None:
    """Add ``rooftop simulate`` (see rooftop_cli.main)."""
    p: argparse.ArgumentParser = subparsers.add_parser(
        "simulate",
        help="replay a trace against a simulated cluster under a scaling policy",
        description=__doc__.split("\n\n")[0] if __doc__ else None,
    )
    p.add_argument("target", help="ServingTarget manifest (YAML)")
    p.add_argument(
        "--trace", required=True, help="Azure-format trace CSV, or a Mooncake trace (.jsonl)"
    )
    p.add_argument("--policy", default="rooftop", choices=(*POLICIES, *MIXES, "all"))
    p.add_argument(
        "--reality-factor",
        type=float,
        default=1.0,
        help="true step times / the fitted truth model (default 1.0)",
    )
    p.add_argument(
        "--acceptance",
        type=float,
        help="the per-token acceptance a speculating plan's drafts truly meet (default: "
        "the one it was planned with; the loop measures it)",
    )
    p.add_argument(
        "--startup-s",
        type=float,
        default=defaults.STARTUP_S,
        help="pod start-up delay, s",
    )
    p.add_argument(
        "--scrape-s",
        type=float,
        default=defaults.TICK_S,
        help="scrape/decision interval, s",
    )
    p.add_argument(
        "--window-s",
        type=float,
        default=defaults.METRICS_WINDOW_S,
        help="rate/quantile window, s",
    )
    p.add_argument("--noise", type=float, default=0.05, help="step-time noise (lognormal sigma)")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument(
        "--diurnal",
        action="store_true",
        help="time-warp the trace into a day shape (3x peak/trough)",
    )
    p.add_argument(
        "--routing",
        default=ROUTINGS[0],
        choices=ROUTINGS,
        help="how requests find a pod: least-outstanding (a gateway; default), random (a "
        "Service), session (a Service with ClientIP affinity, one client per session) or "
        "prefix-aware (the pod caching the longest prefix of the prompt)",
    )
    p.add_argument(
        "--outage",
        action="append",
        default=[],
        metavar="START:END",
        help="seconds during which every metric is missing (repeatable)",
    )
    add_output_option(
        p,
        FORMATS,
        TEXT,
        json_alias=True,
        note="default text; json and yaml are a list for --policy all, tables one row per policy",
    )
    p.add_argument(
        "--nodes",
        metavar="FILE",
        help="plan and scale only within the GPUs these nodes offer the target's pods, "
        "after what the pods listed with them hold (`kubectl get nodes,pods -A -o json`)",
    )
    p.add_argument("--plot", metavar="FILE.png", help="plot load, TPOT and replicas")
    p.set_defaults(func=main)


def _outages(values: list[str]) -> tuple[tuple[float, float], ...]:
    out = []
    for v in values:
        try:
            a, b = (float(x) for x in v.split(":"))
        except ValueError:
            raise InputError(f"--outage {v!r}: expected START:END in seconds") from None
        if not (math.isfinite(a) and math.isfinite(b) and 0 <= a < b):
            raise InputError(f"--outage {v!r}: need 0 <= START < END, both finite seconds")
        out.append((a, b))
    return tuple(out)


def check_flags(args: argparse.Namespace) -> None:
    """Each numeric flag finite and in range, and --plot writable, before any work."""
    rules: tuple[Rule, ...] = (
        ("--reality-factor", args.reality_factor, 0.0, True),
        ("--startup-s", args.startup_s, 0.0, False),
        ("--scrape-s", args.scrape_s, 0.0, True),
        ("--window-s", args.window_s, 0.0, True),
        ("--noise", args.noise, 0.0, False),
        ("--seed", args.seed, 0, False),
    )
    try:
        check_ranges(rules)
    except ValueError as err:
        raise InputError(str(err)) from None
    if args.plot and (problem := plot_path_problem(args.plot)):
        raise InputError(problem)
    if args.acceptance is not None and not (0 < args.acceptance < 1):
        raise InputError(f"--acceptance: must be a number in (0, 1), got {args.acceptance}")


def main(args: argparse.Namespace) -> int:
    """Run the simulation(s) and print the report; 2 on unusable input."""
    try:
        check_flags(args)
        target = load_manifest(args.target)
        inventory = nodes_inventory(args.nodes, target) if args.nodes else None
        workload = workload_from_trace(args.trace, args.diurnal)
        scn = scenario(
            target.spec,
            workload,
            inventory,
            args.acceptance,
            reality_factor=args.reality_factor,
            noise=args.noise,
            seed=args.seed,
            startup_s=args.startup_s,
            scrape_s=args.scrape_s,
            window_s=args.window_s,
            outages=_outages(args.outage),
            routing=args.routing,
        )
    except InputError as err:
        print(f"rooftop simulate: {err}", file=sys.stderr)
        return exit_codes.BAD_INPUT
    if args.policy in MIXES and scn.mixed is None:
        print(
            f"rooftop simulate: --policy {args.policy}: the planner offers no fleet of several GPU "
            "types for this target (none costs less than its single-type plan)",
            file=sys.stderr,
        )
        return exit_codes.BAD_INPUT
    everything = (*POLICIES, *(MIXES if scn.mixed is not None else ()))
    names = everything if args.policy == "all" else (args.policy,)
    progress = Progress()
    results, summaries = run_policies(scn, names, progress, echo=args.output == TEXT)
    if args.output == TEXT and len(summaries) > 1:
        print("\n" + comparison(summaries, scn.slo))
    show(summaries, args.output)
    if args.plot:
        progress.status(f"rooftop simulate: drawing {args.plot}", force=True)
        plot(results, scn.slo, args.plot)
        progress.clear()
    return exit_codes.OK


def run_policies(
    scn: SimScenario, names: Sequence[str], progress: Progress, echo: bool
) -> tuple[list[SimResult], list[dict[str, Any]]]:
    """Run each named policy, showing on ``progress`` which one and how far it is;
    ``echo``: print each one's text report as it ends."""
    results, summaries = [], []
    for k, name in enumerate(names, 1):
        label = f"rooftop simulate: {name} ({k}/{len(names)})"
        progress.status(f"{label}: sizing the policy", force=True)
        res, s = run(scn, name, progress=_ticker(progress, label, scn.workload.horizon_s))
        progress.clear()
        results.append(res)
        summaries.append(s)
        if echo:
            print(text(s, scn.slo), flush=True)
    return results, summaries


def _ticker(progress: Progress, label: str, horizon_s: float) -> Callable[[float], None]:
    """A ``Cluster.run`` progress callback: simulated minutes of the trace so far."""

    def tick(now_s: float) -> None:
        progress.status(f"{label}: {now_s / 60:.1f} of {horizon_s / 60:.1f} min simulated")

    return tick


TABLE_COLUMNS = (
    ("POLICY", "policy"),
    ("TPOT-OK", "slo_attainment_tpot"),
    ("TTFT-OK", "slo_attainment_ttft"),
    ("GPU-HOURS", "gpu_hours"),
    ("USD", "usd"),
    ("MEAN-REPLICAS", "mean_replicas"),
    ("REJECTED", "rejected"),
)
WIDE_COLUMNS = (
    ("REQUESTS", "requests"),
    ("TOKENS-TPOT-OK", "token_attainment_tpot"),
    ("TOKENS-TTFT-OK", "token_attainment_ttft"),
    ("TPOT-P50(ms)", "tpot_p50_ms"),
    ("TPOT-P99(ms)", "tpot_p99_ms"),
    ("REALITY-FACTOR", "reality_factor"),
    ("HORIZON(s)", "horizon_s"),
    ("WALL(s)", "wall_s"),
)


def show(summaries: list[dict[str, Any]], fmt: str) -> None:
    """Print the runs' summaries as JSON or YAML (a list for several policies) or a
    table, one row per policy (attainments are shares 0..1). Text is printed per run."""
    if fmt in (JSON, YAML):
        print(dumps(summaries[0] if len(summaries) == 1 else summaries, fmt))
    elif fmt in (TABLE, WIDE):
        columns = TABLE_COLUMNS + (WIDE_COLUMNS if fmt == WIDE else ())
        rows = [[s[key] for _, key in columns] for s in summaries]
        print_table([name for name, _ in columns], rows)


__all__ = ["POLICIES", "InputError", "SimScenario", "main", "register", "run"]

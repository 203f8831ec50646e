"""The closed-loop controller's decisions, as pure functions.

``decide(state, obs, now_s, config) -> Decision`` is called once per scrape by the
operator's timer (``loop.py``) and, unchanged, by ``rooftop simulate``'s ``rooftop``
policy, so what the simulator measures is what the operator does. It reads an
``Observation`` (``readings.py``), re-plans through a ``Planner`` (``sizing.py``) and
projects the request rate with ``forecast.py``; this module is the law that joins them.

One decision:

1. Classify the readings (ok / missing / stale / nan). Latency percentiles may be
   absent with no traffic; the request rate, running, waiting and KV usage must be OK
   for anything but scaling up.
2. Calibrate, from OK readings only (``calibration.py``: smoothed and bounded):
   - the step-time factor = observed mean step time / the planner's predicted step
     time at the batch those steps ran (the window's decode tokens per engine step;
     running per ready replica when that is not known) and lengths;
   - the latency trim, an integral controller on the share of requests within the
     TPOT bound: up while under the aim (the SLO's percentile plus half its allowed
     misses: 95 % for p90, 99.5 % for p99), down while almost none missed and the
     percentile has room, in steps that grow with the evidence. The factor makes the
     planner's mean right; the trim its tail (prefill bursts, length mix, how fast
     TPOT grows with load), which the SLO is about. A window moves the trim only when
     it says something about the planner's capacity: one settled fleet (no pod
     became ready for ``trim.settle_windows`` windows, two by default, none
     starting), at most once per window; misses count only when the trimmed planner
     called the ready pods enough for the observed rate (not a lag or a budget cap),
     a clean window only when the fleet ran near what the trimmed planner calls its
     capacity (not a spare fleet).
3. Re-plan with the planner at the observed request rate (projected ``startup_s`` ahead
   when it is rising) times the trim, with ``step_time_scale`` = the step factor.
   The trim scales the rate, not the step time: a tail the planner gets wrong is
   fixed by more (or fewer) replicas, not by a smaller batch cap.
4. Add reactive signals: an observed TPOT/TTFT breach, TPOT close to the SLO, a
   queue, a full KV cache.
5. Stabilize: scale up at once (pods still starting count as capacity, because the
   desired count already includes them); scale down only to the highest recommendation
   of the last ``scale_down_window_s`` (180 s: a pod's start-up plus one metrics
   window, so a pod given back in a lull is not needed again before it could be
   back), and only after that many seconds of OK metrics read through windows the
   controller watched whole (from one metrics window after its first decision; the
   rate trend is fitted on those too). While the rate is clearly
   falling (its trend loses ``falling_rate_per_minute`` of the mean a minute) there is
   no lull to wait out, and the window drops its metrics window (120 s). Traffic that
   idles for longer between bursts teaches the loop its lulls (``lulls``): once a
   give-back cost the SLO when the load came back (above the rate the pods left at,
   beyond its noise), the window stretches over that lull for an hour. Never scale
   down on missing, stale or NaN metrics (hold and say so), nor below the
   recommendation plus the pods a batch-cap rollout holds out of service (one without
   surge room, at the budget or ``maxReplicas``).
6. Limit: min/max replicas and the budget (a hard limit: never exceeded, even when the
   SLO then cannot be met; the conditions say which).
7. Batch cap: adopt the planner's ``max_num_seqs`` when the calibrated factors show the
   current cap misses the TPOT SLO at a full batch (or, with margin, that a larger cap
   is safe and gives a replica more capacity) - rarely, since it restarts pods: only
   in a steady fleet, after a cooldown, and never when the rollout would stop a
   single pod with no room under the budget to start its replacement first. The
   rollout replaces every pod, so it starts what the new cap needs at the planned
   rate (fewer only after a scale-down window of OK metrics, and not while a learnt
   lull holds pods: the rollout waits until the hold lets them go).
8. Speculative decoding, where the pods speculate: once the drafts' measured
   acceptance is more than ``traffic.ACCEPTANCE_DIFFERS_BY`` from the one the plan was
   made with, ask for the whole target to be planned again with it
   (``Decision.replan_acceptance``: GPUs, TP and drafts may change); within it, plan
   only the drafts again on the running engine (``Decision.speculative_config``: off,
   or a draft length that makes the running batch's step 15 % faster per token). Both
   restart every pod: only in a steady fleet with no rollout running, the drafts also
   after a settled factor and the cap's cooldown.
9. The whole target planned again with the served lengths, in the same steady fleet:
   once the served prompt or output lengths differ beyond their noise
   (``traffic.lengths_differ``: a mean by over 25 %, a p90 by over 1.5x) from those the
   running plan was made with (the spec's, or the ones measured and planned with
   before), ask for the target to be planned with them
   (``Decision.replan_workload``: other GPUs or TP may serve the traffic for less, as a
   target declared with 24k-token prompts that serves 1k-token ones), at the rate the
   loop plans for (``Decision.replan_rps``), after a scale-down window of OK readings
   through windows the loop watched whole. The loop sizes replicas and the batch cap
   with the served lengths from their first window; only the engine's shape waits.
   A plan of another shape rolls out only where it costs ``RESHAPE_GAIN`` less than
   the running shape at that rate by the planner (``WorkloadReplan.pays``), and starts
   with the pods that carry what the ready pods serve now (within the budget and
   maxReplicas): the rolling update removes old pods down to the new count at once.
   The loop gives any extra pods back after its window.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass, field, replace
from enum import StrEnum
from typing import Any

from rooftop_api.conditions import SLO_MET, WITHIN_BUDGET, WORKLOAD_OBSERVED, Condition
from rooftop_api.spec import MeasuredWorkload, ServingTargetSpec
from rooftop_control import calibration as cal_mod
from rooftop_control import defaults
from rooftop_control import traffic as traffic_mod
from rooftop_control.calibration import Calibration, CalibrationConfig, TrimConfig
from rooftop_control.forecast import forecast_rate, rate_trend
from rooftop_control.lulls import Lulls
from rooftop_control.readings import MetricState, Observation, Reading
from rooftop_control.sizing import Planner, Respeculation, Sizing
from rooftop_control.traffic import Traffic
from rooftop_planner.pricing import PodsPrice, ReplicaPrice


@dataclass(frozen=True)
class ControllerConfig:
    """Everything ``decide`` needs besides state and observation.

    Attributes:
        planner: re-plans at a rate and factor; predicts step times.
        tpot_slo_ms / ttft_slo_ms: the SLO bounds, ms (TTFT optional).
        tpot_quantile: the share of requests the SLO keeps within ``tpot_slo_ms``
            (0.99 for p99); a window below it while pods start regrets a give-back
            (``lulls``).
        min_replicas / max_replicas: hard replica limits.
        budget_usd_per_hour: hard spend limit for all replicas, USD/h.
        price: what a replica count costs, USD/h (``pricing.ReplicaPrice``: owned GPUs
            first, then on demand; a mixed fleet's ``fleet.FleetPrice``: its cheapest
            pods over the pools, each counted as a replica).
        inventory_replicas: the most replicas the cluster's free GPUs hold (with the
            operator's ``gpuInventory: nodes``), None: not counted.
        planned_acceptance: the per-token draft acceptance the running plan was made
            with (None: it does not speculate). A measured one further than
            ``traffic.ACCEPTANCE_DIFFERS_BY`` from it plans the target again
            (``Decision.replan_acceptance``).
        acceptance_per_decode_step: the running plan drafts by prompt lookup, whose
            acceptance is read per decode step (``traffic.measured_acceptance``).
        declared: the spec's prompt and output lengths: what the planner sizes with
            until the traffic's own are measured (``traffic``).
        planned_workload: the served lengths the running plan was made with, where the
            loop planned the target again with them (None: ``declared``). Served ones
            that differ from them beyond their noise plan the target again
            (``Decision.replan_workload``).
        scale_down_window_s: a lower recommendation must hold this long, s. The
            default is the start-up (120 s) plus one metrics window (60 s): a pod
            removed in a shorter lull is back only after the rise that needs it began.
        startup_s: expected pod start-up time, s; a rising rate is projected this far.
        metrics_window_s: the window rates and percentiles are computed over, s.
        trend_window_s: how much rate history the trend is fitted on, s.
        falling_rate_per_minute: a rate trend falling faster than this share of its
            mean a minute (0.05 = 5 %, about 2.6 standard errors of the slope fitted on
            300 s of 60 s windows at a few req/s) shortens the scale-down window by one
            metrics window: the pod it gives back is not leaving in a lull the next
            minutes undo. 0 turns this off.
        headroom: extra rate planned for (0.1 = 10 %), on top of the planner's own.
        max_breach_step: at most this multiple of ready replicas per reactive step.
        tpot_margin: observed TPOT above this share of the SLO adds one replica.
        waiting_per_replica: queued requests per ready replica that count as a breach.
        kv_usage_limit: KV usage ratio above which preemptions start; a breach.
        cap_cooldown_s: minimum time between batch-cap changes (they restart pods), s.
        cap_raise_margin: a larger cap is adopted only if the planner still picks it
            with step times this much slower (0.15 = 15 %): hysteresis, so a factor
            near a boundary does not roll the fleet back and forth.
        cap_binds_at: a lower batch cap is adopted only once the pods' running batch
            reaches this share of it (0.5 = half): below, the cap never binds, and the
            rollout that sets it would restart every pod for nothing. The replicas are
            sized for the lower cap meanwhile (``_plan``), so the batch stays there.
        calibration: smoothing and bounds of the step-time factor.
        trim: dead band, gains and bounds of the latency trim.
    """

    planner: Planner
    tpot_slo_ms: float
    ttft_slo_ms: float | None
    min_replicas: int
    max_replicas: int
    budget_usd_per_hour: float
    price: PodsPrice
    declared: Traffic
    inventory_replicas: int | None = None
    planned_acceptance: float | None = None
    planned_workload: MeasuredWorkload | None = None
    acceptance_per_decode_step: bool = False
    tpot_quantile: float = 0.99
    scale_down_window_s: float = 180.0
    startup_s: float = defaults.STARTUP_S
    metrics_window_s: float = defaults.METRICS_WINDOW_S
    trend_window_s: float = 300.0
    falling_rate_per_minute: float = 0.05
    headroom: float = 0.0
    max_breach_step: float = 2.0
    tpot_margin: float = 0.9
    waiting_per_replica: float = 2.0
    kv_usage_limit: float = 0.9
    cap_cooldown_s: float = 900.0
    cap_raise_margin: float = 0.15
    cap_binds_at: float = 0.5
    calibration: CalibrationConfig = field(default_factory=CalibrationConfig)
    trim: TrimConfig = field(default_factory=TrimConfig)


@dataclass(frozen=True)
class ControllerState:
    """What the controller remembers between decisions (restartable: defaults are safe).

    Attributes:
        replicas: desired replicas now (ready + pending), as last decided.
        max_num_seqs: batch cap the pods run with now.
        calibration: the step-time factor estimate.
        history: (time s, recommended replicas) of healthy decisions in the window.
        healthy_since_s: start of the current run of healthy decisions, s (None: unhealthy).
        rates: (time s, req/s) of OK rate readings within the trend window.
        last_cap_change_s: when the batch cap last changed, s.
        trim: the latency trim on the step-time scale (1.0 = none).
        ready_seen: ready pods at the last decision (None: no decision yet).
        ready_grew_s: when the ready count last grew, s.
        trim_at_s: when the trim last moved, s (at most one move per metrics window:
            the scrapes of one window see the same requests).
        held_cap: the batch cap the planner asks for but the controller holds back
            (``sole_pod_would_go``), else None.
        traffic: the prompt and output lengths the planner sizes with, as measured
            (None: not yet, the spec's are used; see ``traffic_in_use``).
        started_s: the first decision's time, s (None: none yet). The trim waits
            ``trim.settle_windows`` windows from it, as from a pod becoming ready: a
            controller that has not watched a whole window cannot tell a model error
            from a fleet that was short before it looked (a target's first traffic).
        lulls: the give-backs of the last minutes and the lulls they taught the loop
            to ride out (``lulls``).
        engines_mixed: pods of the previous engine (other GPUs, TP or drafts) still
            serve while the new one rolls out: their steps are not the planner's, so the
            step-time factor waits until none is left (``carried_over``).
        replanned_acceptance: the measured acceptance this controller last asked the
            target to be planned with (``Decision.replan_acceptance``), compared in
            place of the plan's until the plan changes: a re-plan that kept the plan
            (or found none) is not asked again until the acceptance moves on.
        replanned_workload: the served lengths this controller last asked the target
            to be planned with (``Decision.replan_workload``), compared as
            ``replanned_acceptance`` is.
    """

    replicas: int
    max_num_seqs: int
    calibration: Calibration = Calibration()
    history: tuple[tuple[float, int], ...] = ()
    healthy_since_s: float | None = None
    rates: tuple[tuple[float, float], ...] = ()
    last_cap_change_s: float | None = None
    trim: float = 1.0
    ready_seen: int | None = None
    ready_grew_s: float | None = None
    trim_at_s: float | None = None
    held_cap: int | None = None
    traffic: Traffic | None = None
    started_s: float | None = None
    lulls: Lulls = Lulls()
    engines_mixed: bool = False
    replanned_acceptance: float | None = None
    replanned_workload: MeasuredWorkload | None = None


def traffic_in_use(state: ControllerState, config: ControllerConfig) -> Traffic:
    """The lengths the planner sizes with: the measured ones, else the spec's."""
    return state.traffic if state.traffic is not None else config.declared


class Cause(StrEnum):
    """Why a decision changed the fleet (the operator's decision metric's ``reason``)."""

    LOAD_CHANGE = "load_change"  # the planner re-sized for the observed request rate
    SLO_VIOLATION = "slo_violation"  # a TPOT/TTFT breach, a queue, a full KV cache
    OVERPROVISIONED = "overprovisioned"  # the recommendation stayed lower for a window
    CALIBRATION = "calibration"  # only the batch cap moved, with the step-time factor
    ACCEPTANCE = "acceptance"  # the drafts' measured acceptance re-planned speculation
    WORKLOAD = "workload"  # the served lengths planned the whole target again
    BUDGET = "budget"  # maxReplicas or the budget cut what the SLO needs


Signal = tuple[int, str, Cause]  # (replicas asked for, why, cause)
BREACH = Cause.SLO_VIOLATION


# A plan of another shape must cost at most this share less than the running shape at
# the same rate and lengths to roll out: twice the planner's median step-time error on
# runs it never saw (14 %), as each of the two plans compared errs by about that much,
# and the running shape's error is the one the loop has calibrated away. On the Azure
# conversation hour a 70B target re-planned from one 4-GPU B200 pod to two 2-GPU H100
# NVL pods for 12 % less by the planner, and spent 11 % more than it would have kept.
RESHAPE_GAIN = 0.3


@dataclass(frozen=True)
class WorkloadReplan:
    """The whole target planned again with the lengths it serves.

    Attributes:
        workload: the served prompt and output lengths, in place of spec.workload's.
        requests_per_second: the rate to plan at, req/s: the one the loop sizes for.
        running_usd_per_hour: what the running shape costs at that rate and those
            lengths by the planner (its own step times), USD/h.
        running_pods: the pods of the running shape the load needs now (the loop's
            sizing at the running batch cap and factor; at most the ready ones).
    """

    workload: MeasuredWorkload
    requests_per_second: float
    running_usd_per_hour: float
    running_pods: int = 0

    def pays(self, usd_per_hour: float) -> bool:
        """Whether a plan of another shape costing ``usd_per_hour`` at this rate saves
        ``RESHAPE_GAIN`` of the running shape's cost: worth a rollout that starts the
        step-time factor over."""
        return usd_per_hour <= (1.0 - RESHAPE_GAIN) * self.running_usd_per_hour

    def pods(self, replicas: int) -> int:
        """Pods of the new shape to start with: the plan's ``replicas``, or the old
        pods the load needs now where more. The rolling update removes old pods down
        to the new count at once, and the old pods left carry the load until new ones
        serve: a 70B fleet needing 3 pods at batch 8, re-planned to one larger pod, kept
        one old pod for the whole load while the new one started."""
        return max(replicas, self.running_pods)


@dataclass(frozen=True)
class Decision:
    """The outcome of one ``decide`` call.

    Attributes:
        replicas: desired replicas (write to the Deployment).
        max_num_seqs: batch cap (a change means new pod args).
        reason: one line for a Kubernetes event / log, why this decision.
        conditions: SLOMet and WithinBudget.
        state: pass to the next ``decide``.
        metrics_state: worst state of the gating readings.
        needed_replicas: what the SLO needs before min/max/budget limits.
        previous_replicas / previous_max_num_seqs: the values before this decision.
        cap_hold_began: this decision started holding back a new batch cap (worth an
            event once, not on every decision that keeps holding it).
        cause: why the fleet changed (meaningful when ``changed``).
        usd_per_hour: what ``replicas`` cost, USD/h (owned GPUs first); None: not priced.
        speculative_config: the --speculative-config the pods are to run from now on
            ("": none; a rollout, as a new batch cap), None: unchanged.
        speculation_why: why speculative_config changed or the target is planned again
            ("" when neither).
        replan_acceptance: plan the whole target again with this measured per-token
            acceptance, as with spec.workload.acceptanceRate set to it (the GPUs, TP
            and drafts may change: a rollout), None: no need.
        replan_workload: plan the whole target again with the served prompt and
            output lengths in place of spec.workload's, at the loop's rate; a plan of
            another shape rolls out only where it pays (``WorkloadReplan``). None: no
            need.
    """

    replicas: int
    max_num_seqs: int
    reason: str
    conditions: tuple[Condition, ...]
    state: ControllerState
    metrics_state: MetricState
    needed_replicas: int
    previous_replicas: int
    previous_max_num_seqs: int
    cap_hold_began: bool = False
    cause: Cause = field(kw_only=True)
    usd_per_hour: float | None = field(default=None, kw_only=True)
    speculative_config: str | None = field(default=None, kw_only=True)
    speculation_why: str = field(default="", kw_only=True)
    replan_acceptance: float | None = field(default=None, kw_only=True)
    replan_workload: WorkloadReplan | None = field(default=None, kw_only=True)

    @property
    def changed(self) -> bool:
        """Whether replicas, the batch cap or the speculative config changed."""
        return self.speculative_config is not None or (self.replicas, self.max_num_seqs) != (
            self.previous_replicas,
            self.previous_max_num_seqs,
        )

    @property
    def calibration_factor(self) -> float:
        """The smoothed step-time factor after this decision."""
        return self.state.calibration.factor


def config_from_spec(
    spec: ServingTargetSpec, planner: Planner, price: PodsPrice | float, **overrides: Any
) -> ControllerConfig:
    """Build a config from a ServingTarget spec; ``price`` what replicas cost (a float:
    every replica at that USD/h); ``overrides`` set the tuning fields."""
    return ControllerConfig(
        planner=planner,
        tpot_slo_ms=spec.slo.tpot_ms,
        tpot_quantile=spec.slo.tpot_percentile.quantile,
        ttft_slo_ms=spec.slo.ttft_ms,
        min_replicas=spec.constraints.min_replicas,
        max_replicas=spec.constraints.max_replicas,
        budget_usd_per_hour=spec.budget.usd_per_hour,
        price=ReplicaPrice.flat(price) if isinstance(price, float | int) else price,
        declared=traffic_mod.declared(spec.workload),
        **{"trim": TrimConfig.for_percentile(spec.slo.tpot_percentile.quantile), **overrides},
    )


# ---------------------------------------------------------------- the decision


def decide(
    state: ControllerState, obs: Observation, now_s: float, config: ControllerConfig
) -> Decision:
    """One control step: calibrate, re-plan, scale (see the module docstring).

    Args:
        state: what the last decision left (``initial_state`` for the first call).
        obs: readings over the last window and the Deployment's ready/pending pods.
        now_s: a monotonic clock, s (simulated or wall; only differences matter).
        config: SLO, limits, planner and tuning.
    """
    bad = obs.unhealthy()
    seen = state.ready_seen
    grew_s = now_s if seen is not None and obs.ready_replicas > seen else state.ready_grew_s
    fresh = grew_s is None or now_s - grew_s >= config.metrics_window_s
    # Every sizing below plans with the lengths this window leaves (``traffic``).
    observed = traffic_mod.update(
        traffic_in_use(state, config), obs, config.acceptance_per_decode_step
    )
    state = replace(state, traffic=observed)
    cal = calibrate(state, obs, config)
    scale = cal.factor
    rates = _remember_rate(state.rates, obs.requests_per_second, now_s, config.trend_window_s)
    sizing, plan_why = _plan(obs, scale, state, rates, config)
    trim, trim_at = _retrim(state, obs, grew_s, now_s, scale, config)
    if sizing is not None and not sizing.feasible:
        # More replicas cannot fix a too-slow step; hold (never shrink on that news)
        # and let the reactive signals add capacity for queues.
        sizing = replace(sizing, replicas=state.replicas)
    wanted, why, cause = _wanted(obs, sizing, plan_why, state.max_num_seqs, fresh, config)
    lulls = _learn_lulls(state, obs, now_s, config)
    unstretched = scale_down_window(rates, config)
    window = _held_window(unstretched, lulls.hold_s(now_s), config)
    history, since = _remember_history(state, wanted, now_s, not bad, window[0], config)
    evidence = _whole_windows_since(since, state, config)
    out = _out_of_service(state, obs, now_s, config)
    replicas, why = _stabilize(
        state.replicas, wanted, why, history, evidence, now_s, bad, out, window, config
    )
    lower, upper = replica_limits(config)
    limited = clamp_replicas(replicas, lower, upper)
    # a new cap rolls pods: only in a steady fleet, never on top of a scale-up, nor on a
    # window that still describes the fleet before its last pod became ready
    steady = not bad and fresh and limited == state.replicas and obs.pending_replicas == 0
    cap, cap_why, cap_at = _choose_cap(state, obs, sizing, cal, scale, now_s, steady, config)
    rollout = None
    if cap != state.max_num_seqs:
        rollout = _rollout_replicas(state, rates, scale, cap, evidence, now_s, config)
    rolled = limited if rollout is None else clamp_replicas(rollout[0], lower, upper)
    lull_holds = replicas > wanted and window[0] > unstretched[0]  # pods a lull keeps
    held = None
    if cap != state.max_num_seqs and sole_pod_would_go(rolled, upper):
        cap_why = (
            f"max_num_seqs held at {state.max_num_seqs}, not {cap}: the rollout would "
            "stop the only pod before its replacement serves (no room under "
            "maxReplicas and the budget for a surge pod)"
        )
        held, cap, cap_at = cap, state.max_num_seqs, state.last_cap_change_s
    elif rollout is not None and rolled < limited and lull_holds:
        # A lull the loop learnt (give-backs between bursts that cost the SLO when the
        # load came back) holds pods this window's rate no longer wants; a rollout sized
        # at that rate would give them all back at once, as such a give-back does. The
        # new cap waits until the lull's hold has let them go.
        cap_why = (
            f"max_num_seqs stays {state.max_num_seqs} for now, not {cap}: its rollout "
            f"would shrink the fleet to {rolled} while a learnt lull holds {limited}"
        )
        cap, cap_at = state.max_num_seqs, state.last_cap_change_s
    elif rollout is not None:
        (replicas, why), cause = rollout, Cause.CALIBRATION
        wanted, limited = replicas, rolled
    respec, replan, relengths = None, None, None
    if (
        cap == state.max_num_seqs
        and held is None
        and not sole_pod_would_go(limited, upper)
        and _may_roll_out(obs, steady)
    ):
        # A re-plan moves its acceptance on by a tenth each time, and the acceptance is
        # read from thousands of drafts: one is worth it as soon as the fleet is steady.
        # New drafts on the running engine gain a few per cent: they wait, as a new
        # batch cap does, for a settled factor and the cooldown.
        replan = _replan_acceptance(state, config)
        if _ok_for_a_window(evidence, now_s, config):
            relengths = _replan_workload(state, config)
        if (
            replan is None
            and relengths is None
            and _cooled_down(state.calibration, state.last_cap_change_s, now_s, config)
        ):
            respec = _respeculation(state, obs, config)
    if replan is not None:  # the cooldown covers the rollout it may start
        cap_at, cause = now_s, Cause.ACCEPTANCE
        cap_why = (
            f"drafts are accepted at {replan:.2f} per token, more than "
            f"{traffic_mod.ACCEPTANCE_DIFFERS_BY:g} from the acceptance planned with: the "
            "target is planned again with it"
        )
    elif relengths is not None:
        cap_at, cause = now_s, Cause.WORKLOAD
        cap_why = _workload_why(state.traffic)
    if respec is not None:  # a rollout as a new cap's: the cooldown covers both
        cap_why, cap_at, cause = respec.why, now_s, Cause.ACCEPTANCE
    new_state = ControllerState(
        replicas=limited,
        max_num_seqs=cap,
        calibration=cal,
        history=history,
        healthy_since_s=since,
        rates=rates,
        last_cap_change_s=cap_at,
        trim=trim,
        ready_seen=obs.ready_replicas,
        ready_grew_s=grew_s,
        trim_at_s=trim_at,
        held_cap=held,
        traffic=state.traffic,
        started_s=now_s if state.started_s is None else state.started_s,
        lulls=lulls.moved(state.replicas, limited, now_s, window[0], _rate_read(obs)),
        engines_mixed=state.engines_mixed and obs.outdated_replicas > 0,
        replanned_acceptance=state.replanned_acceptance if replan is None else replan,
        replanned_workload=state.replanned_workload if relengths is None else relengths,
    )
    return Decision(
        replicas=limited,
        max_num_seqs=cap,
        reason=_reason(state, limited, replicas, why, cap_why, config),
        conditions=(
            slo_condition(obs, max(wanted, replicas), upper, config),
            budget_condition(limited, max(wanted, replicas), config),
            workload_condition(state.traffic, config),
        ),
        state=new_state,
        metrics_state=obs.state(),
        needed_replicas=max(wanted, replicas),
        previous_replicas=state.replicas,
        previous_max_num_seqs=state.max_num_seqs,
        cap_hold_began=held is not None and held != state.held_cap,
        cause=_cause(state.replicas, limited, replicas, cause, held is not None),
        usd_per_hour=config.price.usd_per_hour(limited),
        speculative_config=None if respec is None else respec.config,
        speculation_why=cap_why if (respec, replan, relengths) != (None, None, None) else "",
        replan_acceptance=replan,
        replan_workload=_workload_replan(relengths, state, obs, sizing, rates, config),
    )


def _cause(before: int, limited: int, unlimited: int, signal: Cause, cap_held: bool) -> Cause:
    """The decision's cause: a limit that bound, else the direction and its signal."""
    if unlimited > limited or cap_held:
        return Cause.BUDGET
    if limited == before:
        # replicas held: only the batch cap, the drafts or the plan can have changed
        return signal if signal in (Cause.ACCEPTANCE, Cause.WORKLOAD) else Cause.CALIBRATION
    return signal if limited > before else Cause.OVERPROVISIONED


def initial_state(replicas: int, max_num_seqs: int, factor: float = 1.0) -> ControllerState:
    """State for a fresh (or restarted) controller: no history, so no early scale-down."""
    return ControllerState(replicas, max_num_seqs, Calibration(factor=factor))


def calibrate(state: ControllerState, obs: Observation, config: ControllerConfig) -> Calibration:
    """Update the factor from the window's mean step time (OK readings only).

    The batch it is priced at is the window's mean decode batch per iteration
    (``step_batch``), the batch of the steps the observed mean describes; without it,
    the running requests per ready replica now. The latter lags the window: when pods
    become ready the batch drops at once while the window's steps were still taken at
    the larger one, and the factor would read that as a slower engine.
    """
    cal = state.calibration
    if not obs.step_ms.ok or obs.ready_replicas <= 0:
        return cal
    if state.engines_mixed and obs.outdated_replicas > 0:
        return cal  # the window's steps are partly the previous engine's
    if obs.step_batch.ok:
        batch = obs.step_batch.value
    elif obs.running.ok:
        batch = obs.running.value / obs.ready_replicas
    else:
        return cal
    if batch < config.calibration.min_batch:
        return cal
    lengths = traffic_in_use(state, config)
    isl = obs.prompt_tokens.value if obs.prompt_tokens.ok else lengths.prompt.mean
    osl = obs.output_tokens.value if obs.output_tokens.ok else lengths.output.mean
    predicted = config.planner.step_ms(batch, isl, osl)
    return cal_mod.update(cal, obs.step_ms.value, predicted, config.calibration)


def _retrim(
    state: ControllerState,
    obs: Observation,
    grew_s: float | None,
    now_s: float,
    scale: float,
    config: ControllerConfig,
) -> tuple[float, float | None]:
    """(trim, when it last moved): at most one move per metrics window (the scrapes
    of one window see the same requests), and none until ``trim.settle_windows``
    windows after a pod became ready (a request finishing in the window may have
    started a window earlier, on the smaller fleet) or after the controller started
    (``ControllerState.started_s``)."""
    settle_s = config.trim.settle_windows * config.metrics_window_s
    since = max((t for t in (grew_s, state.started_s) if t is not None), default=None)
    settled = since is not None and now_s - since >= settle_s
    last = state.trim_at_s
    if not settled or (last is not None and now_s - last < config.metrics_window_s):
        return state.trim, last
    trim = trim_after_window(state, obs, scale, config)
    return trim, (now_s if trim != state.trim else last)


def trim_after_window(
    state: ControllerState, obs: Observation, scale: float, config: ControllerConfig
) -> float:
    """The latency trim after this window (``scale``: the step-time factor in use).

    The caller (``_retrim``) passes only windows of one settled fleet; no pod may be
    starting either: while capacity is on its way the error is being corrected
    already, so integrating it would wind up. A window then moves the trim only when
    it says something about the planner's capacity model, judged by what the trimmed
    planner wants for the OBSERVED rate (not the forecast):

    - up, on misses, only when the planner called the ready pods enough: misses in a
      fleet the planner already wants bigger (pods still to come after a steep rise,
      a budget or maxReplicas cap) are a lag or a limit, not a model error; and never
      at the replica ceiling (maxReplicas or the budget): a higher trim buys no pod
      there, it only holds the fleet up after the peak that filled it;
    - down, on a clean window, only when ``trim.tight`` more load would make the
      planner want more pods than are ready: a fast TPOT in a fleet with spare pods
      (minReplicas, the scale-down window, a forecast that overshot) says nothing
      about the planner being pessimistic.
    """
    ok = obs.tpot_ms.ok and obs.tpot_attainment.ok and obs.requests_per_second.ok
    if not (ok and obs.ready_replicas > 0 and obs.pending_replicas == 0):
        return state.trim
    new = cal_mod.update_trim(
        state.trim, obs.tpot_attainment.value, obs.tpot_ms.value, config.tpot_slo_ms, config.trim
    )
    if new == state.trim:
        return new
    rate, ready = obs.requests_per_second.value * state.trim, obs.ready_replicas
    cap = state.max_num_seqs  # the planner's claim for the cap the pods run
    if new > state.trim:
        if ready >= replica_limits(config)[1]:
            return state.trim
        needed = config.planner.size(rate, scale, cap, _trimmed(state))
        return new if needed.feasible and needed.replicas <= ready else state.trim
    tight = 1 + config.trim.tight
    needed = config.planner.size(rate * tight, scale, cap, _trimmed(state, tight))
    return new if needed.feasible and needed.replicas > ready else state.trim


def clamp_replicas(replicas: int, lower: int, upper: int) -> int:
    """``replicas`` within [lower, upper]; ``upper`` (budget, maxReplicas) wins when the
    two cross. The one clamp every policy uses: the controller and the simulator's
    baselines alike."""
    return max(0, min(max(replicas, lower), upper))


def max_billed_replicas(max_replicas: int, budget_usd_per_hour: float, price: PodsPrice) -> int:
    """The most replicas that may run (or start) at once: maxReplicas, and no more than
    the budget pays for at ``price`` (owned GPUs first, then on demand)."""
    return max(0, min(max_replicas, price.affordable(budget_usd_per_hour, max_replicas)))


def sole_pod_would_go(replicas: int, ceiling: int) -> bool:
    """Whether a rollout of ``replicas`` pods would be an outage: a single pod and no
    room under ``ceiling`` (``max_billed_replicas``) to start its replacement first, so
    the Deployment's strategy (``builders.rollout_strategy``) replaces it in place and
    nothing serves for the start-up time. A new batch cap is not worth that."""
    return replicas <= 1 and ceiling <= replicas


def replica_limits(config: ControllerConfig) -> tuple[int, int]:
    """(lowest, highest) replica count allowed; the budget wins over min_replicas, and
    the GPUs the cluster has free over both (a pod beyond them would stay Pending)."""
    upper = _budget_ceiling(config)
    if config.inventory_replicas is not None:
        upper = min(upper, config.inventory_replicas)
    return min(config.min_replicas, upper), upper


def scale_down_window(
    rates: Sequence[tuple[float, float]], config: ControllerConfig
) -> tuple[float, str]:
    """How long a lower recommendation must hold now, s, and why when it is short:
    ``scale_down_window_s``, less one metrics window while the rate trend falls faster
    than ``falling_rate_per_minute`` of its mean a minute, judged over at least that
    shorter window.

    The full window is a pod's start-up plus one metrics window, so a pod given back in
    a lull is not needed again before it could be back. A fall as steep as that, held
    over minutes, is no lull: waiting out the extra window there only pays for pods the
    load has already left (after a daily peak, about one pod of the fleet's average).
    """
    full = config.scale_down_window_s
    short = full - config.metrics_window_s
    # off, or a shorter window that would not hold one whole metrics window
    if config.falling_rate_per_minute <= 0 or short < config.metrics_window_s:
        return full, ""
    trend = rate_trend(rates, short)
    if trend is None:
        return full, ""
    _, mean_rate, slope = trend
    fall = -slope * 60.0 / mean_rate if mean_rate > 0 else 0.0
    if fall <= config.falling_rate_per_minute:
        return full, ""
    return short, f" while the rate falls {fall:.0%} a minute"


def _remember_rate(
    rates: tuple[tuple[float, float], ...], rate: Reading, now_s: float, window_s: float
) -> tuple[tuple[float, float], ...]:
    kept = tuple((t, r) for t, r in rates if t > now_s - window_s)
    return (*kept, (now_s, rate.value)) if rate.ok else kept


def _plan(
    obs: Observation,
    scale: float,
    state: ControllerState,
    rates: Sequence[tuple[float, float]],
    config: ControllerConfig,
) -> tuple[Sizing | None, str]:
    """The planner's sizing at the projected rate, or None without a usable rate.

    ``max_num_seqs`` is the cap the planner prefers (``_choose_cap`` may move to it);
    ``replicas`` are what the cap the pods RUN needs (``state.max_num_seqs``, when it
    keeps TPOT within the SLO at this factor). The two differ while a new cap waits:
    for the factor to settle (a cold start), the cap cooldown or the raise margin. A
    replica at cap 16 serves less than one at the 32 the planner would like, and
    sizing the fleet as if it ran 32 leaves it short until the rollout.
    """
    if not obs.requests_per_second.ok:
        return None, ""
    trim = state.trim
    rate = _planned_rate(state, rates, config)
    sizing = config.planner.size(rate, scale, traffic=_trimmed(state))
    if not sizing.feasible:
        why = f"no batch size meets the TPOT SLO at step-time scale {scale:.2f}"
        return sizing, why
    cap = state.max_num_seqs
    running = config.planner.size(rate, scale, cap, _trimmed(state))
    at = ""
    if running.feasible and running.max_num_seqs == cap != sizing.max_num_seqs:
        sizing = replace(
            sizing,
            replicas=running.replicas,
            tpot_ms=running.tpot_ms,
            capacity_rps=running.capacity_rps,
        )
        at = f" at the pods' max_num_seqs {cap}"
    why = (
        f"planned {sizing.replicas} for {rate:.2f} req/s{at} (trim {trim:.2f}) at "
        f"step-time factor {scale:.2f}"
    )
    return sizing, why


def _trimmed(state: ControllerState, extra: float = 1.0) -> Traffic | None:
    """The traffic the planner sizes with, its bursts' rate scaled by the latency trim
    (times ``extra``) as the window's rate is (``Traffic.trimmed``)."""
    return state.traffic.trimmed(state.trim * extra) if state.traffic else None


def _planned_rate(
    state: ControllerState, rates: Sequence[tuple[float, float]], config: ControllerConfig
) -> float:
    """The rate the planner sizes for, req/s: the forecast ``startup_s`` ahead, plus half
    a metrics window (a window's average lags by half a window), with the headroom and
    the latency trim.

    The trend is fitted on the readings of windows the controller watched whole, from
    one metrics window after its first decision: a window that reaches back before the
    target's traffic began averages in the empty part, so its readings climb over the
    first minute however flat the traffic is. Projected from them, the bundled chat
    excerpt at a steady 4.8 req/s was planned for 9.9 req/s at its first minute.
    """
    lead = config.startup_s + config.metrics_window_s / 2
    whole = _watched_whole_from(state, config)
    trend_from = math.inf if whole is None else whole
    return forecast_rate(rates, lead, trend_from) * (1 + config.headroom) * state.trim


def _rollout_replicas(
    state: ControllerState,
    rates: Sequence[tuple[float, float]],
    scale: float,
    cap: int,
    since: float | None,
    now_s: float,
    config: ControllerConfig,
) -> tuple[int, str] | None:
    """Replicas for a rollout to batch cap ``cap``, and why; None where the planner
    offers no sizing at that cap (the count then stays as decided).

    A new cap replaces every pod, so the rollout is sized for the cap it rolls to: a
    raise from 16 to 32 on 7 pods, of which cap 32 needs 4, would otherwise start 7 new
    pods (each billed ``startup_s`` before it serves) and give 3 of them back over the
    scale-down windows that follow. A lower cap that needs more pods gets them with the
    rollout. Fewer pods than now need what any scale-down needs, ``scale_down_window_s``
    of OK metrics: at start the readings cannot yet show a peak they missed.
    """
    rate = _planned_rate(state, rates, config)
    at_cap = config.planner.size(rate, scale, cap, _trimmed(state))
    if not at_cap.feasible or at_cap.max_num_seqs != cap:
        return None
    planned = at_cap.replicas
    why = (
        f"the rollout to max_num_seqs {cap}: planned {planned} for {rate:.2f} req/s "
        f"(trim {state.trim:.2f}) at step-time factor {scale:.2f}"
    )
    if planned < state.replicas and not _ok_for_a_window(since, now_s, config):
        held_s = config.scale_down_window_s
        return state.replicas, f"{why}; holding {state.replicas} until {held_s:.0f} s of OK metrics"
    return planned, why


def _wanted(
    obs: Observation,
    sizing: Sizing | None,
    plan_why: str,
    cap: int,
    fresh: bool,
    config: ControllerConfig,
) -> Signal:
    """The highest replica count any signal asks for, and why (0 when none speaks).

    ``fresh``: the latency window only covers the current set of ready pods.
    """
    signals: list[Signal] = []
    if sizing is not None:
        # a step too slow for the SLO at any batch is an SLO problem, not a load one
        cause = Cause.LOAD_CHANGE if sizing.feasible else Cause.SLO_VIOLATION
        signals.append((sizing.replicas, plan_why, cause))
    ready = obs.ready_replicas
    if ready > 0:
        signals.extend(_breaches(obs, ready, cap, fresh, config))
    if not signals:
        return 0, "", Cause.LOAD_CHANGE
    return max(signals, key=lambda s: s[0])


def _breaches(
    obs: Observation, ready: int, cap: int, fresh: bool, config: ControllerConfig
) -> list[Signal]:
    """Reactive signals, sized from READY pods: pending ones already raise the count.

    Latency percentiles cover the whole window; right after new pods became ready they
    still describe the smaller fleet, so they are only used once ``fresh`` to add pods.
    A breach in such a window still holds the ready pods: whether they are enough is
    not known yet, and giving one back before the window can tell is the unsafe side.
    """
    out: list[Signal] = []
    step = config.max_breach_step
    tpot, slo = obs.tpot_ms.value, config.tpot_slo_ms
    breached = obs.tpot_ms.ok and tpot > slo
    if breached and not fresh:
        why = f"TPOT {tpot:.0f} ms > SLO {slo:.0f} ms before the new pods' first window"
        out.append((ready, why, BREACH))
    elif breached:
        n = max(ready + 1, math.ceil(ready * min(tpot / slo, step)))
        out.append((n, f"TPOT {tpot:.0f} ms > SLO {slo:.0f} ms", BREACH))
    elif fresh and obs.tpot_ms.ok and tpot > config.tpot_margin * slo:
        # Predicted breach: a new pod takes startup_s to help, so act while there is
        # still slack. One pod at a time; pending pods already count (desired >= ready+1).
        out.append(
            (ready + 1, f"TPOT {tpot:.0f} ms is over {config.tpot_margin:.0%} of SLO", BREACH)
        )
    slo_ttft = config.ttft_slo_ms
    if fresh and slo_ttft is not None and obs.ttft_ms.ok and obs.ttft_ms.value > slo_ttft:
        # TTFT is mostly queueing, which the queue signal below sizes; TTFT itself
        # says little about how many replicas are missing (50 s of queue is not 25x).
        out.append((ready + 1, f"TTFT {obs.ttft_ms.value:.0f} ms > SLO {slo_ttft:.0f} ms", BREACH))
    if obs.waiting.ok and obs.waiting.value > config.waiting_per_replica * ready:
        # each added replica can take up to a batch cap of the queue
        extra = min(math.ceil(obs.waiting.value / max(cap, 1)), math.ceil(ready * (step - 1)))
        out.append((ready + max(extra, 1), f"{obs.waiting.value:.0f} requests waiting", BREACH))
    if obs.kv_usage_ratio.ok and obs.kv_usage_ratio.value > config.kv_usage_limit:
        out.append((ready + 1, f"KV cache {obs.kv_usage_ratio.value:.0%} full", BREACH))
    return out


def _learn_lulls(
    state: ControllerState, obs: Observation, now_s: float, config: ControllerConfig
) -> Lulls:
    """The lulls record after this window (``lulls``): a window that broke the SLO's
    percentile while pods the loop asked for still start regrets the give-backs that
    removed them. Not a window under the aim only: the aim's margin is the trim's
    business, and a lull learnt holds pods for an hour."""
    att = obs.tpot_attainment
    short = obs.ready_replicas < state.replicas
    if att.ok and att.value < config.tpot_quantile and short:
        return state.lulls.regretted(
            state.replicas, now_s, config.startup_s, config.metrics_window_s, _rate_read(obs)
        )
    return state.lulls


def _rate_read(obs: Observation) -> float | None:
    """The window's arrival rate, req/s, when it was read (for ``Lulls.moved``)."""
    return obs.requests_per_second.value if obs.requests_per_second.ok else None


def _held_window(
    window: tuple[float, str], lull_s: float, config: ControllerConfig
) -> tuple[float, str]:
    """The scale-down window (``scale_down_window``) stretched over the longest lull
    learnt (s), shortened as that window is while the rate falls; and why."""
    window_s, because = window
    held_s = lull_s - (config.scale_down_window_s - window_s)
    if held_s <= window_s:
        return window
    return held_s, f"{because}, the longest lull that cost this traffic its SLO lately"


def _remember_history(
    state: ControllerState,
    wanted: int,
    now_s: float,
    healthy: bool,
    window_s: float,
    config: ControllerConfig,
) -> tuple[tuple[tuple[float, int], ...], float | None]:
    """Recommendations of the scale-down window (``window_s``, at least
    ``scale_down_window_s``); forgotten whenever the metrics go bad, so a scale-down
    always needs a full window of trustworthy data after an outage."""
    if not healthy:
        return (), None
    cutoff = now_s - max(config.scale_down_window_s, window_s)
    kept = tuple((t, n) for t, n in state.history if t > cutoff)
    since = state.healthy_since_s if state.healthy_since_s is not None else now_s
    return (*kept, (now_s, wanted)), since


def _out_of_service(
    state: ControllerState, obs: Observation, now_s: float, config: ControllerConfig
) -> int:
    """Desired pods a batch-cap rollout holds out of service now: desired minus ready
    while one replaces pods (within the cap cooldown), else 0.

    Judged by the pods on the old template, not by pending ones: after a cap change,
    pods starting for a scale-up are no rollout. With surge room (``maxUnavailable``
    0) every desired pod stays ready and the surge pods are extra, so none is out.
    Only a rollout without surge room (``maxUnavailable`` 1, at the budget or
    ``maxReplicas``) runs pods short. Bounded by the cap cooldown, so pods that never
    schedule cannot hold pods forever.
    """
    last = state.last_cap_change_s
    recent = last is not None and now_s - last < config.cap_cooldown_s
    if not recent or obs.outdated_replicas <= 0:
        return 0
    return max(0, state.replicas - obs.ready_replicas)


def _stabilize(
    current: int,
    wanted: int,
    why: str,
    history: Sequence[tuple[float, int]],
    since: float | None,
    now_s: float,
    bad: list[str],
    out_of_service: int,
    window: tuple[float, str],
    config: ControllerConfig,
) -> tuple[int, str]:
    """Fast up, slow down, hold on bad metrics and during a batch-cap rollout.

    ``window``: how long a lower recommendation must hold, s, and why when it is short
    (``scale_down_window``); ``history`` covers at least that long. The metrics must
    have been OK for the full ``scale_down_window_s`` all the same: after an outage (or
    at start) the readings before it cannot show that a peak it hid has passed.
    ``out_of_service``: pods a batch-cap rollout holds out of service
    (``_out_of_service``). A scale-down keeps them on top of the recommendation, so the
    pods that serve never fall below it while the load may turn; the rest go, which
    also shortens the rollout (fewer pods left to replace). Holding every pod instead
    kept 7 B200 pods for the 14 minutes a one-at-a-time rollout took where the planner
    asked for 1.
    """
    if wanted > current:
        return wanted, why
    if bad:
        return current, "holding: metrics unavailable (" + ", ".join(bad) + ")"
    if not _ok_for_a_window(since, now_s, config):
        return current, why
    window_s, because = window
    highest = max(n for t, n in history if t > now_s - window_s)
    kept = highest + out_of_service
    if kept < current:
        held = f"{window_s:.0f} s{because}"
        rolling = (
            f" (+{out_of_service} the batch-cap rollout holds out of service)"
            if out_of_service
            else ""
        )
        return kept, f"recommendation stayed <= {highest} for {held}{rolling}; {why}"
    if out_of_service and highest < current:
        return current, f"{why}; holding while the batch-cap rollout starts pods"
    return current, why


def _whole_windows_since(
    since: float | None, state: ControllerState, config: ControllerConfig
) -> float | None:
    """When the OK readings that may justify fewer pods began, s: the current run of
    healthy decisions (``since``), but not before one metrics window after the
    controller's first decision. Earlier windows reach back before it watched (before
    the traffic began, for a new target) and read the load low, as the rate trend
    does (``_planned_rate``); a give-back on them came just as the first real load
    arrived (a 70B fleet went 14 -> 11 -> 15 pods in 15 s, breaching TPOT)."""
    whole = _watched_whole_from(state, config)
    if since is None or whole is None:  # no decision yet: since is now
        return since
    return max(since, whole)


def _watched_whole_from(state: ControllerState, config: ControllerConfig) -> float | None:
    """From when the controller's readings cover windows it watched whole, s: one
    metrics window after its first decision (None: it has made none yet)."""
    if state.started_s is None:
        return None
    return state.started_s + config.metrics_window_s


def _ok_for_a_window(since: float | None, now_s: float, config: ControllerConfig) -> bool:
    """Whether the metrics have been OK for ``scale_down_window_s`` (``since``: the start
    of the current run of healthy decisions, s): what any move to fewer pods needs."""
    return since is not None and now_s - since >= config.scale_down_window_s


def _choose_cap(
    state: ControllerState,
    obs: Observation,
    sizing: Sizing | None,
    cal: Calibration,
    scale: float,
    now_s: float,
    steady: bool,
    config: ControllerConfig,
) -> tuple[int, str, float | None]:
    """(batch cap, why it changed or "", time of the last change)."""
    keep = state.max_num_seqs, "", state.last_cap_change_s
    if sizing is None or not sizing.feasible or not steady:
        return keep
    if not _cooled_down(cal, state.last_cap_change_s, now_s, config):
        return keep
    cur, new = state.max_num_seqs, sizing.max_num_seqs
    if new < cur:
        if _pods_batch(obs) < config.cap_binds_at * new:
            return keep  # the lower cap would not bind: a rollout would buy nothing
        why = f"batch cap {cur} misses TPOT at step-time scale {scale:.2f}"
    elif new > cur:
        rate = obs.requests_per_second.value
        slower = config.planner.size(
            rate, scale * (1 + config.cap_raise_margin), traffic=state.traffic
        )
        if not (slower.feasible and slower.max_num_seqs > cur):
            return keep
        new = slower.max_num_seqs
        why = f"batch cap {new} is safe at step-time scale {scale:.2f} and serves more"
    else:
        return keep
    return new, f"max_num_seqs {cur} -> {new}: {why}", now_s


def _replan_acceptance(state: ControllerState, config: ControllerConfig) -> float | None:
    """The measured acceptance to plan the target again with, where it is more than
    ``ACCEPTANCE_DIFFERS_BY`` from the one the running plan was made with."""
    planned = config.planned_acceptance
    if planned is not None and state.replanned_acceptance is not None:
        planned = state.replanned_acceptance
    acceptance = None if state.traffic is None else state.traffic.acceptance
    if planned is None or acceptance is None:
        return None
    if abs(acceptance - planned) <= traffic_mod.ACCEPTANCE_DIFFERS_BY + 1e-9:
        return None
    return acceptance


def _replan_workload(state: ControllerState, config: ControllerConfig) -> MeasuredWorkload | None:
    """The served lengths to plan the target again with, where they differ beyond their
    noise from those the running plan was made with (``traffic.lengths_differ``).

    Asked for (by ``decide``) only after a scale-down window of OK readings through
    windows the loop watched whole, as any move to fewer pods: the re-plan is sized at
    the rate the loop plans for, which the first minute reads low, and a new shape
    rolls every pod."""
    traffic = state.traffic
    if traffic is None or not traffic.observed:
        return None
    planned = state.replanned_workload or config.planned_workload or config.declared
    if not traffic_mod.lengths_differ(traffic, planned):
        return None
    return traffic_mod.measured_workload(traffic)


def _workload_replan(
    workload: MeasuredWorkload | None,
    state: ControllerState,
    obs: Observation,
    sizing: Sizing | None,
    rates: Sequence[tuple[float, float]],
    config: ControllerConfig,
) -> WorkloadReplan | None:
    """The re-plan with the served lengths (``Decision.replan_workload``): at the rate
    the loop plans for, with what the running shape would cost there by the planner and
    the pods of it the load needs now."""
    if workload is None or sizing is None or not sizing.feasible:
        return None
    rate = _planned_rate(state, rates, config)
    # both shapes at the planner's own step times: the running one's calibrated factor
    # says nothing of the other's
    running = config.planner.size(rate, 1.0, traffic=_trimmed(state))
    return WorkloadReplan(
        workload=workload,
        requests_per_second=rate,
        running_usd_per_hour=config.price.usd_per_hour(running.replicas),
        running_pods=min(sizing.replicas, obs.ready_replicas),
    )


def _workload_why(traffic: Traffic | None) -> str:
    """Why the target is planned again with the served lengths."""
    if traffic is None:
        return ""
    prompt, output = traffic.prompt, traffic.output
    return (
        f"the served prompts ({prompt.mean:,.0f} tokens on average, p90 {prompt.p90:,.0f}) "
        f"and outputs ({output.mean:,.0f}, p90 {output.p90:,.0f}) differ beyond their "
        "noise from the lengths the plan was made with: the target is planned again "
        "with them"
    )


def _respeculation(
    state: ControllerState, obs: Observation, config: ControllerConfig
) -> Respeculation | None:
    """Speculative decoding planned again at the drafts' measured acceptance
    (``Planner.respeculate``), with a running batch to judge it at."""
    acceptance = None if state.traffic is None else state.traffic.acceptance
    batch = _pods_batch(obs)
    if acceptance is None or batch <= 0.0:
        return None
    return config.planner.respeculate(acceptance, batch, traffic_in_use(state, config))


def _may_roll_out(obs: Observation, steady: bool) -> bool:
    """Whether the drafts or the plan may change now, which restarts every pod: only
    in a steady fleet with no rollout still replacing pods."""
    return steady and obs.outdated_replicas == 0


def _cooled_down(
    cal: Calibration, last_s: float | None, now_s: float, config: ControllerConfig
) -> bool:
    """Whether a rollout of a new batch cap or new drafts may start: the running engine
    watched for a few windows (a settled step-time factor ``cal``) and the cooldown
    since the last rollout (at ``last_s``, None: none yet) over."""
    if not cal.settled(config.calibration):
        return False
    return last_s is None or now_s - last_s >= config.cap_cooldown_s


def plan_kept(state: ControllerState, before: ControllerState) -> ControllerState:
    """``state`` (a decision's, ``before`` the one it was decided from) once the re-plan
    it asked for kept the running engine: the new plan was the same shape, did not pay
    (``WorkloadReplan.pays``) or was not found. The batch-cap cooldown the ask started
    covered a rollout that never came, so it stands where it stood before; what the ask
    planned with (``replanned_acceptance``, ``replanned_workload``) stays, so the same
    difference is not asked again. A kept ask that restarted the cooldown held the cap
    for 15 minutes four times an hour on a trace whose p90 swings."""
    return replace(state, last_cap_change_s=before.last_cap_change_s)


def carried_over(state: ControllerState) -> ControllerState:
    """What the loop keeps when the pods' engine changes (new drafts, a re-planned
    shape): the step-time factor with its weight and the latency trim, which describe
    the model's error and the traffic; the history starts over, so no scale-down for a
    window, and the new rollout's cooldown with it. The factor then waits for the
    previous engine's pods to go (``engines_mixed``): a TP8 pod's short steps read
    against a TP2 prediction halved it and scaled the fleet down mid-rollout."""
    fresh = initial_state(state.replicas, state.max_num_seqs)
    return replace(
        fresh,
        calibration=state.calibration,
        trim=state.trim,
        last_cap_change_s=state.last_cap_change_s,
        engines_mixed=True,
    )


def _pods_batch(obs: Observation) -> float:
    """The running batch of one pod's steps: the window's decode tokens per step, else
    the running requests per ready pod now (0 when neither is known)."""
    if obs.step_batch.ok:
        return obs.step_batch.value
    if obs.running.ok and obs.ready_replicas > 0:
        return obs.running.value / obs.ready_replicas
    return 0.0


def _reason(
    state: ControllerState,
    limited: int,
    unlimited: int,
    why: str,
    cap_why: str,
    config: ControllerConfig,
) -> str:
    parts = []
    if limited != state.replicas:
        verb = "scale up" if limited > state.replicas else "scale down"
        parts.append(f"{verb} {state.replicas} -> {limited}: {why}")
    else:
        parts.append(f"hold {limited}: {why}" if why else f"hold {limited}")
    if unlimited > limited:
        inventory = config.inventory_replicas
        room = "" if inventory is None else f", room on the cluster's free GPUs for {inventory}"
        parts.append(
            f"capped at {limited} (max replicas {config.max_replicas}, budget "
            f"${config.budget_usd_per_hour:.2f}/h{room})"
        )
    if cap_why:
        parts.append(cap_why)
    return "; ".join(parts)


# ---------------------------------------------------------------- conditions


def slo_condition(obs: Observation, needed: int, upper: int, config: ControllerConfig) -> Condition:
    """SLOMet: True/False from the observed percentiles, Unknown without them."""
    capped = needed > upper
    limit_reason = _limit_reason(config)
    if not obs.tpot_ms.ok:
        rate = obs.requests_per_second
        if rate.ok and rate.value <= 0:
            return Condition(
                type=SLO_MET,
                status="Unknown",
                reason="NoTraffic",
                message="no requests in the window",
            )
        msg = "cannot judge the SLO: tpot_ms is " + obs.tpot_ms.state.value
        return Condition(type=SLO_MET, status="Unknown", reason="MetricsUnavailable", message=msg)
    tpot, slo = obs.tpot_ms.value, config.tpot_slo_ms
    ttft, slo_ttft = obs.ttft_ms, config.ttft_slo_ms
    if tpot > slo:
        reason, msg = "TPOTAboveSLO", f"observed TPOT {tpot:.1f} ms > SLO {slo:.1f} ms"
    elif slo_ttft is not None and ttft.ok and ttft.value > slo_ttft:
        reason, msg = "TTFTAboveSLO", f"observed TTFT {ttft.value:.0f} ms > SLO {slo_ttft:.0f} ms"
    else:
        msg = f"observed TPOT {tpot:.1f} ms <= SLO {slo:.1f} ms"
        if capped:
            msg += f"; the SLO needs {needed} replicas but only {upper} are allowed"
        return Condition(type=SLO_MET, status="True", reason="SLOMet", message=msg)
    if capped:
        reason = limit_reason
        msg += f"; needs {needed} replicas, limited to {upper}"
    return Condition(type=SLO_MET, status="False", reason=reason, message=msg)


def budget_condition(replicas: int, needed: int, config: ControllerConfig) -> Condition:
    """WithinBudget: always True (the budget is never exceeded); the reason says
    whether the budget is what limits the replica count."""
    price = config.price
    spend, budget = price.usd_per_hour(replicas), config.budget_usd_per_hour
    msg = f"${spend:.2f}/h of ${budget:.2f}/h ({price.describe(replicas)})"
    _, upper = replica_limits(config)
    if needed > upper and _budget_binds(config):
        msg += f"; the SLO needs {needed} replicas (${price.usd_per_hour(needed):.2f}/h)"
        return Condition(type=WITHIN_BUDGET, status="True", reason="CappedAtBudget", message=msg)
    if replicas < config.min_replicas:
        msg += f"; minReplicas {config.min_replicas} is not affordable"
        return Condition(type=WITHIN_BUDGET, status="True", reason="CappedAtBudget", message=msg)
    return Condition(type=WITHIN_BUDGET, status="True", reason="WithinBudget", message=msg)


def workload_condition(traffic: Traffic | None, config: ControllerConfig) -> Condition:
    """WorkloadObserved: whether the loop plans with the served lengths (True) or still
    with spec.workload (Unknown), and where the served ones differ from the spec's."""
    if traffic is None or not traffic.observed:
        why = (
            f"the planner uses spec.workload until {traffic_mod.MIN_REQUESTS} requests "
            f"finished within {defaults.SERVED_RANGE}"
        )
        return Condition(
            type=WORKLOAD_OBSERVED, status="Unknown", reason="TooFewRequests", message=why
        )
    seen = (
        f"served over {defaults.SERVED_RANGE}: prompts {traffic.prompt.mean:,.0f} tokens mean, "
        f"outputs {traffic.output.mean:,.0f}"
    )
    if traffic.hits is not None:
        seen += f", {traffic.hits.ratio:.0%} of prompt tokens prefix-cache hits"
    if traffic.acceptance is not None:
        seen += f", drafts accepted at {traffic.acceptance:.2f} per token"
    differences = traffic_mod.differences(traffic, config.declared)
    if not differences:
        message = f"{seen}; within {traffic_mod.DIFFERS_BY:.0%} of spec.workload"
        return Condition(
            type=WORKLOAD_OBSERVED, status="True", reason="AsDeclared", message=message
        )
    message = f"the loop plans with the served lengths ({seen}); " + "; ".join(differences)
    return Condition(
        type=WORKLOAD_OBSERVED, status="True", reason="DiffersFromSpec", message=message
    )


def _budget_ceiling(config: ControllerConfig) -> int:
    """The most replicas maxReplicas and the budget allow (``max_billed_replicas``)."""
    return max_billed_replicas(config.max_replicas, config.budget_usd_per_hour, config.price)


def _budget_binds(config: ControllerConfig) -> bool:
    """Whether the budget, not max_replicas nor the cluster's GPUs, sets the upper
    replica limit."""
    return _budget_ceiling(config) < config.max_replicas and not _inventory_binds(config)


def _inventory_binds(config: ControllerConfig) -> bool:
    """Whether the cluster's free GPUs set the upper replica limit."""
    room = config.inventory_replicas
    return room is not None and room < _budget_ceiling(config)


def _limit_reason(config: ControllerConfig) -> str:
    """What keeps the loop from adding replicas the SLO needs: SLOMet's reason."""
    if _inventory_binds(config):
        return "InventoryLimited"
    return "BudgetLimited" if _budget_binds(config) else "MaxReplicasLimited"

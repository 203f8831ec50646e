"""The feedback loop: metrics in, ``control.decide``, Deployment and status out.

Thin glue, by design: every decision is ``control.decide`` (the same function the
simulator's ``rooftop`` policy runs); this module only

1. reads one snapshot of the target's engine metrics from Prometheus
   (``metrics_client``) and turns it into a ``readings.Observation`` (every reading keeps
   its ok/missing/stale/nan state; an unreachable Prometheus is "missing");
2. keeps each target's ``ControllerState`` on the runtime (``Runtime.loop``, a
   ``loop_memory.LoopMemory``; an operator restart starts a
   fresh state seeded with the last calibration factor from ``status.observed``: no
   history means no scale-down for a full window, the safe side);
3. on a change, re-applies the engine Deployment through reconcile's own builders
   (``reconcile.apply_children``) with the decided replicas and batch cap, emits an
   event with the decision's reason and counts it in the operator's metrics;
4. writes ``status.observed``, ``status.plan`` (replicas, batch cap, cost) and the
   SLOMet / WithinBudget conditions.

One task ticks for every target at once (``run_loop``, every ``LoopSettings.interval_s``);
kopf decides which targets it ticks for through a daemon per target that only waits
(``presence``): kopf stops those on a standby replica (peering) and for a deleted target.

It imports ``reconcile`` (``apply_children``) and ``readiness``; ``wiring`` registers
its daemon and task with the configuration read once at start-up
(``OperatorConfig.loop``, a ``LoopSettings``).
"""

from __future__ import annotations

import asyncio
import copy
import logging
import math
import re
import time
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import replace
from typing import Any

import kopf

from rooftop_api import conditions as cnd
from rooftop_api.spec import (
    ConditionStatus,
    ObservedStatus,
    ServingTargetSpec,
    ServingTargetStatus,
)
from rooftop_control import control, signals
from rooftop_control.calibration import CalibrationConfig, TrimConfig, clamp
from rooftop_control.defaults import SERVED_RANGE_S
from rooftop_control.readings import SIGNALS, MetricState, Observation, Reading
from rooftop_control.sizing import (
    FleetPlanner,
    fleet_planner,
    plan_acceptance,
)
from rooftop_control.traffic import Lengths, Traffic
from rooftop_operator import children, metrics_client, readiness, reconcile
from rooftop_operator.builders import UnsupportedPlan, deployment_name, engine_deployment_names
from rooftop_operator.errors import OperatorError
from rooftop_operator.kube import KubeError
from rooftop_operator.loop_memory import (
    EngineIndex,
    FleetCache,
    LoopMemory,
    Member,
    Members,
    ParsedTarget,
    TargetMemory,
)
from rooftop_operator.runtime import Runtime, runtime
from rooftop_operator.settings import LoopSettings
from rooftop_operator.specs import SpecError, TargetRef, parse_spec
from rooftop_planner.bursts import BURST_INTERVAL_S
from rooftop_planner.catalog import Catalog
from rooftop_planner.errors import PlannerError
from rooftop_planner.explain import gpus_of
from rooftop_planner.fleet import FleetPrice
from rooftop_planner.fleet import rescaled as fleet_rescaled
from rooftop_planner.inventory import GpuInventory
from rooftop_planner.plan import Plan, without_drafts
from rooftop_planner.pricing import PodsPrice, ReplicaPrice, replica_price, with_default

log = logging.getLogger(__name__)

INF_MS = 1e9  # a +Inf quantile ("above the last bucket") as a finite, breaching value


# ---------------------------------------------------------------- pure conversions


def _scaled(r: Reading, scale: float) -> Reading:
    """``r`` in other units (s -> ms); +Inf stays a finite, breaching number."""
    if not r.ok:
        return r
    value = r.value * scale
    return Reading(INF_MS if math.isinf(value) else value, MetricState.OK)


def observation(
    snap: metrics_client.TargetMetrics, ready: int, pending: int, outdated: int = 0
) -> Observation:
    """The controller's view of one snapshot and of the Deployment's pods
    (``outdated``: pods a rollout has yet to replace, ``outdated_pods``): every
    declared signal (``readings.SIGNALS``) in the controller's units."""
    pods = Observation(ready_replicas=ready, pending_replicas=pending, outdated_replicas=outdated)
    readings: dict[str, Any] = {s.field: _signal(snap, s) for s in SIGNALS}
    return replace(pods, **readings, pool_steps=_pool_steps(snap))


def _pool_steps(snap: metrics_client.TargetMetrics) -> tuple[tuple[str, Reading, Reading], ...]:
    """A mixed fleet's pools' own mean step (ms) and decode batch (``POOL_SIGNALS``)."""
    step, batch = (next(s for s in SIGNALS if s.field == f) for f in metrics_client.POOL_SIGNALS)
    pools = sorted(snap.pools.get(step.query, {}))
    return tuple(
        (
            gpu,
            _scaled(snap.pool(step.query, gpu), step.scale),
            _scaled(snap.pool(batch.query, gpu), batch.scale),
        )
        for gpu in pools
    )


def _signal(snap: metrics_client.TargetMetrics, signal: signals.Signal) -> Reading:
    """One signal's reading: its fallback query when its own has no figure, raised to
    its least meaningful figure, scaled to its unit."""
    reading = snap.get(signal.query)
    if signal.fallback is not None and not reading.ok:
        reading = snap.get(signal.fallback.query)
    if signal.at_least is not None and reading.ok and reading.value < signal.at_least:
        reading = Reading(signal.at_least, MetricState.OK)
    return reading if signal.scale == 1.0 else _scaled(reading, signal.scale)


def pod_counts(
    deployments: Mapping[str, Any] | Sequence[Mapping[str, Any] | None] | None,
) -> tuple[int, int, int]:
    """(desired, ready, pending) pods of the engine Deployment, or summed over a mixed
    fleet's pool Deployments (0s for one that is absent)."""
    desired = ready = pending = 0
    for deployment in _each(deployments):
        want = int((deployment.get("spec") or {}).get("replicas") or 0)
        have = int((deployment.get("status") or {}).get("readyReplicas") or 0)
        desired, ready, pending = desired + want, ready + have, pending + max(want - have, 0)
    return desired, ready, pending


def outdated_pods(
    deployments: Mapping[str, Any] | Sequence[Mapping[str, Any] | None] | None,
) -> int:
    """Pods of the engine Deployment(s) still on an older pod template: a rollout (a new
    batch cap) has yet to replace them. ``status.replicas`` counts the pods of every
    ReplicaSet, ``status.updatedReplicas`` those of the newest (0 when absent)."""
    outdated = 0
    for deployment in _each(deployments):
        status = deployment.get("status") or {}
        total, updated = int(status.get("replicas") or 0), int(status.get("updatedReplicas") or 0)
        outdated += max(total - updated, 0)
    return outdated


def _each(
    deployments: Mapping[str, Any] | Sequence[Mapping[str, Any] | None] | None,
) -> list[Mapping[str, Any]]:
    if deployments is None or isinstance(deployments, Mapping):
        return [deployments] if deployments else []
    return [d for d in deployments if d]


def decision_labels(d: control.Decision) -> tuple[str, str]:
    """(direction, reason) labels for ``OperatorMetrics.record_decision``."""
    if d.replicas != d.previous_replicas:
        direction = "up" if d.replicas > d.previous_replicas else "down"
    else:
        direction = "replan"  # only the batch cap changed
    return direction, d.cause.value


def observed_status(d: control.Decision, obs: Observation, now: str) -> ObservedStatus:
    """``status.observed``: every shown signal (a reading with no figure is absent: JSON
    has no NaN) and what the loop learned."""

    def num(r: Reading) -> float | None:
        return round(r.value, 4) if r.ok else None

    shown = {s.status_key: num(getattr(obs, s.field)) for s in SIGNALS if s.status_key}
    served = obs.served_requests
    return ObservedStatus.model_validate(
        {
            **shown,
            "workload": served_workload(d.state.traffic, served.value if served.ok else None),
            "calibrationFactor": round(d.calibration_factor, 4),
            "calibrationSamples": d.state.calibration.samples,
            "latencyTrim": round(d.state.trim, 4),
            "metricsState": d.metrics_state.value,
            "time": now,
        }
    )


def served_workload(traffic: Traffic | None, requests: float | None) -> dict[str, Any] | None:
    """``status.observed.workload``: the served lengths the loop plans with, in whole
    tokens, the ``requests`` finished over the served range they are read from, and the
    arrival dispersion to two significant figures, None before any (``observed_changed``
    weighs each figure against its noise)."""
    if traffic is None or not traffic.observed:
        return None

    def lengths(of: Lengths) -> dict[str, float]:
        _, p50, p90, p99 = of.quantiles
        figures = {"mean": of.mean, "p50": p50, "p90": p90, "p99": p99}
        return {k: float(round(v)) for k, v in figures.items()}

    served: dict[str, Any] = {
        "promptTokens": lengths(traffic.prompt),
        "outputTokens": lengths(traffic.output),
    }
    if requests is not None and math.isfinite(requests):
        served["requests"] = round(requests)
    if traffic.bursts is not None:
        served["arrivalDispersion"] = float(f"{traffic.bursts.dispersion:.2g}")
    return served


# How far an observed figure must move before status is written again: window-to-window
# noise is not news, and a write per target per tick is what limits how many targets one
# operator can run. Relative, with an absolute floor for figures near zero, and wider for
# a figure drawn from few events (``_sampling_noise``).
OBSERVED_NOISE_RATIO = 0.05
OBSERVED_NOISE_FLOOR = {s.status_key: s.status_noise_floor for s in SIGNALS if s.status_key}
OBSERVED_NOISE_COUNT = {s.status_key: s.status_noise_count for s in SIGNALS if s.status_key}
OBSERVED_NOISE_COUNT["requests"] = "itself"  # the workload's served requests: a count
# How many standard deviations of the difference between two windows count as noise.
# Status shows some twenty figures, each compared on every tick: the six read over a
# metrics window decorrelate once a window (60 s), the eleven over the served range
# once a range (15 min), so a steady target makes about 6·60 + 11·4 ≈ 400 independent
# comparisons an hour. Beyond three deviations (two-sided 0.27 % each) chance alone
# rewrites its status about once an hour; at two (4.6 %) it was eighteen times.
OBSERVED_NOISE_Z = 3.0
# A variance over a mean of the served range's 60 interval counts moves by about
# √(2/59) of itself between two ranges even for Poisson counts (more for clumped ones):
# the status's burstiness is news only beyond z of that.
SERVED_INTERVALS = SERVED_RANGE_S / BURST_INTERVAL_S
OBSERVED_NOISE_RELATIVE = {
    "arrivalDispersion": OBSERVED_NOISE_Z * math.sqrt(2.0 / (SERVED_INTERVALS - 1.0)),
}
# The share of the served requests that sets each length figure (``ObservedLengths``): a
# q-quantile moves when the n·(1 − q) requests beyond it do, the mean with all n.
SERVED_LENGTH_SHARE = {"mean": 1.0, "p50": 0.5, "p90": 0.1, "p99": 0.01}
# Kept up to date only alongside a visible change: the sample count grows every tick.
OBSERVED_BOOKKEEPING = ("calibrationSamples", "time")


def observed_changed(
    old: ObservedStatus | None,
    new: ObservedStatus,
    window_s: float,
    spread: Mapping[str, float] | None = None,
) -> bool:
    """Whether ``new`` says something ``old`` does not, beyond each figure's noise;
    ``window_s``: the metrics window the figures are read over, s; ``spread``: per
    dotted path, the deviation of a figure's tick-to-tick difference measured on this
    target (``FigureSpread.noise``)."""
    return bool(observed_news(old, new, window_s, spread))


def observed_news(
    old: ObservedStatus | None,
    new: ObservedStatus,
    window_s: float,
    spread: Mapping[str, float] | None = None,
) -> list[str]:
    """The figures of ``new`` (dotted camelCase paths) that moved beyond their noise from
    ``old``, appeared, vanished or changed state: why status would be written. A figure's
    noise is the larger of its counts' (``_sampling_noise``) and its measured ``spread``,
    each ``OBSERVED_NOISE_Z`` deviations."""
    before = _figures(old)
    counts = _counts(before, window_s)
    return _figures_news(before, _figures(new), counts, spread or {}, "observed.")


def _figures(observed: ObservedStatus | None) -> dict[str, Any]:
    """``status.observed`` as stored (camelCase keys, no nulls), {} when absent."""
    if observed is None:
        return {}
    figures: dict[str, Any] = observed.model_dump(by_alias=True, exclude_none=True)
    return figures


def _counts(figures: Mapping[str, Any], window_s: float) -> dict[str, float]:
    """The event counts behind the stored figures (``signals.NoiseCount``): requests
    in the window (rate x window), requests running; absent when not shown."""
    counts = {}
    if isinstance(rate := figures.get("requestsPerSecond"), int | float):
        counts["window_requests"] = rate * window_s
    if isinstance(running := figures.get("running"), int | float):
        counts["running"] = running
    return counts


def _sampling_noise(key: str, before: float, counts: Mapping[str, float]) -> float:
    """How far ``before`` moves by chance alone, in its unit.

    A figure drawn from n independent events (a rate or a percentile of the window's
    n requests; a count of n requests running) has a relative standard deviation of
    about 1/√n (Poisson), so two windows differ by about √(2/n) of it; noise is
    ``OBSERVED_NOISE_Z`` of those: z·√(2/n)·|before|. A figure with no count, or a count
    not shown (yet), gets none.
    """
    kind = OBSERVED_NOISE_COUNT.get(key)
    n = abs(before) if kind == "itself" else counts.get(kind or "", 0.0)
    if key in SERVED_LENGTH_SHARE:  # a length figure (``_served_counts``)
        n = counts.get("served_requests", 0.0) * SERVED_LENGTH_SHARE[key]
    if n <= 0.0:
        return 0.0
    return OBSERVED_NOISE_Z * math.sqrt(2.0 / n) * abs(before)


def _served_counts(
    key: str, figures: Mapping[str, Any], counts: Mapping[str, float]
) -> Mapping[str, float]:
    """The counts behind a group of figures nested under ``key``: the workload's lengths
    rest on the requests it says were served (``SERVED_LENGTH_SHARE`` of them for a length
    figure: the count of those beyond a quantile moves by about √k, and a quantile with
    them; for tails no heavier than 1/x it moves by at most that share of itself)."""
    if key == "workload":
        n = figures.get("requests")
        return {"served_requests": float(n)} if isinstance(n, int | float) else {}
    return counts if key in ("promptTokens", "outputTokens") else {}


def _figures_news(
    old: Mapping[str, Any],
    new: Mapping[str, Any],
    counts: Mapping[str, float],
    spread: Mapping[str, float],
    path: str = "",
) -> list[str]:
    news = []
    for key in sorted((set(old) | set(new)) - set(OBSERVED_BOOKKEEPING)):
        before, after = old.get(key), new.get(key)
        if isinstance(before, Mapping) and isinstance(after, Mapping):
            # e.g. workload.promptTokens.p90
            inner = _served_counts(key, before, counts)
            news += _figures_news(before, after, inner, spread, f"{path}{key}.")
        elif isinstance(before, int | float) and isinstance(after, int | float):
            noise = max(
                OBSERVED_NOISE_RELATIVE.get(key, OBSERVED_NOISE_RATIO) * abs(before),
                OBSERVED_NOISE_FLOOR.get(key, 0.0),
                _sampling_noise(key, before, counts),
                OBSERVED_NOISE_Z * spread.get(path + key, 0.0),
            )
            if abs(after - before) > noise:
                news.append(path + key)
        elif before != after:  # appeared, vanished, or a state such as metricsState
            news.append(path + key)
    return news


def status_update(
    status: ServingTargetStatus,
    d: control.Decision,
    obs: Observation,
    plan: Plan,
    now: str,
    window_s: float,
    spread: Mapping[str, float] | None = None,
    applied: Plan | None = None,
) -> ServingTargetStatus:
    """The new status: observed, plan (replicas, cap, cost; ``applied``: a mixed fleet's
    pools as the decision was applied) and the two conditions.

    ``observed`` keeps its previous figures (and time) unless one moved beyond its
    noise (``observed_changed``, figures read over ``window_s``, with the target's
    measured ``spread``), so a quiet tick leaves status exactly as it was and nothing is
    written.
    """
    new = observed_status(d, obs, now)
    quiet = not observed_changed(status.observed, new, window_s, spread)
    update: dict[str, Any] = {"observed": status.observed if quiet else new}
    if status.plan is not None:
        cost = round(_cost(d, plan), 3)
        scale: dict[str, Any] = {
            "replicas": d.replicas,
            "max_num_seqs": d.max_num_seqs,
            "usd_per_hour": cost,
        }
        if d.speculative_config is not None:
            scale["speculative_config"] = d.speculative_config or None
        if applied is not None and applied.pools:
            scale["pools"] = applied.to_status().pools
            scale["usd_per_hour"] = round(applied.usd_per_hour, 3)
        elif status.plan.pools:  # as its pools were applied (on the free GPUs then)
            del scale["usd_per_hour"]
        update["plan"] = status.plan.model_copy(update=scale)
    conds = _same_words(status.conditions, d.conditions) if quiet else d.conditions
    update["conditions"] = cnd.merge(status.conditions, conds, now=now)
    return status.model_copy(update=update)


async def _within_inventory(
    rt: Runtime,
    ref: TargetRef,
    spec: ServingTargetSpec,
    plan: Plan,
    d: control.Decision,
    inputs: tuple[control.ControllerState, Observation, float, control.ControllerConfig],
) -> control.Decision:
    """``d``, or with the operator's ``gpuInventory: nodes``, a scale-up beyond the
    replicas the cluster's free GPUs hold decided again within them (SLOMet's reason
    then says ``InventoryLimited``): a pod beyond them would only wait, Pending. Nodes
    and pods are listed only when the loop wants more replicas than it runs, so a steady
    fleet costs no list; a failed list leaves the decision as it was (the scheduler
    then has the last word). A mixed fleet's growth is priced where its pods land: a
    type's free GPUs used up, the next pods spill onto a dearer type, and the budget
    limit counts them at that price (``FleetPrice.within``)."""
    if not reconcile.counts_gpus(rt, spec) or d.replicas <= d.previous_replicas:
        return d
    try:
        inventory = await asyncio.to_thread(reconcile.gpu_inventory, rt, spec, ref)
    except KubeError as err:
        log.warning("feedback %s/%s: GPU inventory unread: %s", ref.namespace, ref.name, err)
        return d
    fit = pods_fit(inventory, plan)
    state, obs, now_s, cfg = inputs
    if isinstance(cfg.price, FleetPrice):
        room = {p.gpu: inventory.replicas_fit(p.gpu, p.tp) for p in plan.pools}
        cfg = replace(cfg, price=cfg.price.within(room))
    elif d.replicas <= fit:
        return d
    return control.decide(state, obs, now_s, replace(cfg, inventory_replicas=fit))


def obsolete_engines(
    index: EngineIndex, ref: TargetRef, names: Sequence[str], catalog: Catalog
) -> list[str]:
    """The target's engine Deployments its plan no longer has: a mixed fleet's pool it
    dropped, the one-type Deployment after a switch to pools, or the pools after a
    switch back. Read from the index (no API call): every name a plan can give."""
    candidates = [deployment_name(ref.name), *(deployment_name(ref.name, g) for g in catalog.gpus)]
    return [
        name
        for name in candidates
        if name not in names
        and (found := readiness.indexed_deployment(index, ref.namespace, name)) is not None
        and reconcile.controlled_by(found, ref.uid)
    ]


def waits_for_gpus(status: ServingTargetStatus) -> bool:
    """Whether the target's pods wait for GPUs no node has free (Ready=False,
    Unschedulable): the ones an obsolete Deployment holds, perhaps."""
    ready = cnd.find(status.conditions, cnd.READY)
    return ready is not None and (ready.status, ready.reason) == ("False", "Unschedulable")


def prune(rt: Runtime, ref: TargetRef, names: Sequence[str]) -> None:
    """Delete engine Deployments the plan no longer has. Once every Deployment it has is
    ready (make before break: the Service keeps the planned capacity); with
    ``gpuInventory: nodes`` also where its new pods cannot be scheduled: that plan was
    made within the free GPUs, the target's own counted free, so the GPUs they wait for
    are the obsolete pods' (break before make, as a rollout with no room to surge
    replaces one pod at a time). Without counted GPUs a new pod may wait for a node that
    never comes, and the old pods keep serving meanwhile. The pods that go drain their
    requests (``engine_drain``) as any scale-down's do."""
    for name in names:
        log.info(
            "feedback %s/%s: deleting %s, which the plan no longer has",
            ref.namespace,
            ref.name,
            name,
        )
        rt.kube.delete_deployment(ref.namespace, name)


def pods_fit(inventory: GpuInventory, plan: Plan) -> int:
    """The pods the free GPUs hold for the plan's shape, or over a mixed fleet's pools
    (growth spills from a full pool onto the next: ``fleet.FleetPrice``)."""
    return sum(inventory.replicas_fit(p.gpu, p.tp) for p in plan.pools or (plan,))


def fleet_price(spec: ServingTargetSpec, catalog: Catalog, plan: Plan) -> PodsPrice:
    """What the plan's pod counts cost: its shape's replicas, or a mixed fleet's
    cheapest pods over its pools (``fleet.FleetPrice``)."""
    if not plan.pools:
        return replica_price(spec, catalog, plan.gpu, plan.tp)
    return FleetPrice(tuple((p.gpu, replica_price(spec, catalog, p.gpu, p.tp)) for p in plan.pools))


def scaled_plan(
    plan: Plan, d: control.Decision, price: PodsPrice, inventory: GpuInventory | None = None
) -> Plan:
    """The plan at the decided scale: its shape's replicas, or a mixed fleet's pods split
    over its pools, the cheapest first within the free GPUs (``inventory``)."""
    if d.speculative_config is not None:  # the drafts the loop re-planned
        plan = replace(plan, speculative_config=d.speculative_config, speculative_note="")
    if not plan.pools or not isinstance(price, FleetPrice):
        return plan.rescaled(d.replicas, d.max_num_seqs, _cost(d, plan))
    if inventory is not None:
        price = price.within({p.gpu: inventory.replicas_fit(p.gpu, p.tp) for p in plan.pools})
    return fleet_rescaled(plan, d.replicas, d.max_num_seqs, price)


class GpusTaken(OperatorError, RuntimeError):
    """Between the loop's decision and its apply, other targets took the free GPUs the
    decision's scale-up counted on."""


def _apply_scale(
    rt: Runtime,
    ref: TargetRef,
    spec: ServingTargetSpec,
    plan: Plan,
    d: control.Decision,
    price: PodsPrice,
) -> Plan:
    """Apply the decided fleet (``scaled_plan``) and return it. With ``gpuInventory:
    nodes`` the free GPUs are
    read again and the Deployment applied under ``rt.inventory_lock``, the lock reconcile
    plans under: two targets that decided in the same tick on the same free GPUs are
    applied one after the other, and the second sees the first's Deployment
    (``inventory.held_gpus``). A scale-up the free GPUs no longer hold raises
    ``GpusTaken`` and applies nothing: the next tick decides within what is left.

    The room also caps a rollout's surge, so a new batch cap's pods never wait for
    GPUs nobody frees.
    """
    if not reconcile.counts_gpus(rt, spec):
        new = scaled_plan(plan, d, price)
        reconcile.apply_children(rt, ref, spec, new)
        return new
    with rt.inventory_lock:
        inventory = reconcile.gpu_inventory(rt, spec, ref)
        room = pods_fit(inventory, plan)
        if d.replicas > max(room, d.previous_replicas):
            raise GpusTaken(
                f"{d.replicas} replicas of {gpus_of(plan)} decided, the free GPUs now hold {room}"
            )
        new = scaled_plan(plan, d, price, inventory)
        grows = d.replicas > d.previous_replicas
        if grows and new.usd_per_hour > spec.budget.usd_per_hour + 1e-6:
            raise GpusTaken(  # a mix's pods would now spill onto a dearer type
                f"{d.replicas} pods of {gpus_of(plan)} would cost ${new.usd_per_hour:.2f}/h "
                f"where the free GPUs are now, over the ${spec.budget.usd_per_hour:.2f}/h budget"
            )
        reconcile.apply_children(rt, ref, spec, new, inventory)
        return new


def _cost(d: control.Decision, plan: Plan) -> float:
    """What the decided replicas cost, USD/h: as the decision priced them (owned GPUs
    first), else the plan's cost per replica times them."""
    if d.usd_per_hour is not None:
        return d.usd_per_hour
    return d.replicas * plan.usd_per_replica_hour


def status_changes(old: ServingTargetStatus, new: ServingTargetStatus) -> list[str]:
    """The fields a status write changes, as dotted paths (``observed.tpotMs``,
    ``conditions.SLOMet.message``), for the debug log: what made a tick write."""
    before, after = _flat(old.stored()), _flat(new.stored())
    return sorted(k for k in before.keys() | after.keys() if before.get(k) != after.get(k))


def _flat(value: Any, path: str = "") -> dict[str, Any]:
    """Leaves of a stored status by dotted path; conditions keyed by their type."""
    if isinstance(value, Mapping):
        items: Iterable[tuple[str, Any]] = value.items()
    elif isinstance(value, list) and all(isinstance(v, Mapping) and "type" in v for v in value):
        items = ((str(v["type"]), v) for v in value)
    else:
        return {path: value}
    out: dict[str, Any] = {}
    for key, inner in items:
        out |= _flat(inner, f"{path}.{key}" if path else str(key))
    return out


def _same_words(
    current: Sequence[ConditionStatus] | None, updates: Sequence[cnd.Condition]
) -> list[cnd.Condition]:
    """``updates``, keeping the stored message of a condition whose status, reason and
    words are unchanged: only its figures (an observed TPOT) moved, within their noise.
    A message that gains or loses words (the prefix cache's hit ratio once the loop
    plans with it, a field to change) is news however still the figures are."""
    out = []
    for c in updates:
        old = cnd.find(current, c.type)
        same = old is not None and (old.status, old.reason) == (c.status, c.reason)
        if same and old is not None and _words(old.message) == _words(c.message):
            c = replace(c, message=old.message)
        out.append(c)
    return out


def _words(message: str | None) -> str:
    """A condition message with its numbers masked: what it says, not the figures."""
    return _NUMBER.sub("#", message or "")


_NUMBER = re.compile(r"\d[\d,.]*")


# ---------------------------------------------------------------- one decision


def _parsed(memory: LoopMemory, ref: TargetRef, body: Mapping[str, Any]) -> ParsedTarget:
    """The target's spec, status and plan as models. The spec is parsed once per
    generation and the status once per change: validating them on every tick was a third
    of a quiet tick's CPU (1,000 targets tick 67 times a second).

    Raises:
        SpecError: the spec does not validate (reconcile reports it).
    """
    stored = body.get("status") or {}
    hit = memory.parsed.get(ref.uid)
    if hit is not None and hit.generation == ref.generation and hit.stored_status == stored:
        return hit
    same_spec = hit is not None and hit.generation == ref.generation
    spec = hit.spec if hit is not None and same_spec else parse_spec(body.get("spec") or {})
    status = ServingTargetStatus.read(stored)
    plan = None if status.plan is None else Plan.from_status(status.plan)
    parsed = ParsedTarget(ref.generation, copy.deepcopy(dict(stored)), spec, status, plan)
    memory.parsed[ref.uid] = parsed
    return parsed


def _memory(
    targets: dict[str, TargetMemory],
    ref: TargetRef,
    spec: ServingTargetSpec,
    plan: Plan,
    status: ServingTargetStatus,
    replicas: int,
    catalog: Catalog,
) -> TargetMemory:
    """The target's controller memory; rebuilt when the spec or the plan's shape changed.

    Raises:
        PlannerError: the spec no longer plans (an unknown model, a checkpoint gone).
        UnsupportedPlan: its checkpoint is one vLLM cannot load.
    """
    key = (ref.generation, plan.shape)
    mem = targets.get(ref.uid)
    if mem is not None and mem.key != key and _new_drafts(mem.key, key):
        # the loop's own new drafts: what it learned stays (``control.carried_over``)
        planner = mem.planner
        if not isinstance(planner, FleetPlanner):  # a mixed fleet does not speculate
            planner = planner.respeculated(plan.speculative_config)
        mem.key, mem.planner, mem.state = key, planner, control.carried_over(mem.state)
        return mem
    if mem is None or mem.key != key:
        # an operator restart must not forget what the loop learned: the trim (at
        # reality 1.3 it stands near 1.6: starting over at 1 under-serves until it is
        # learned again), and the factor with its weight (with none, one noisy window
        # would replace it)
        observed = status.observed or ObservedStatus()
        factor = resumed(observed.calibration_factor, CalibrationConfig())
        state = control.initial_state(replicas or plan.replicas, plan.max_num_seqs, factor)
        samples = resumed_samples(observed.calibration_samples)
        state = replace(
            state,
            trim=resumed(observed.latency_trim, TrimConfig()),
            calibration=replace(state.calibration, samples=samples),
            # a new engine rolls out over the previous one's pods (``carried_over``)
            engines_mixed=mem is not None,
        )
        startup = children.pod_lifecycle(catalog, spec, plan).startup_s
        price = fleet_price(spec, catalog, plan)
        mem = TargetMemory(key, fleet_planner(spec, plan), state, startup, price)
        targets[ref.uid] = mem
    return mem


def _new_drafts(old: tuple[int, tuple[object, ...]], new: tuple[int, tuple[object, ...]]) -> bool:
    """Whether two memory keys (generation, plan shape) differ only in the drafts: the
    loop's own re-planned speculation (``control.Decision.speculative_config``)."""
    return old[0] == new[0] and without_drafts(old[1]) == without_drafts(new[1])


def resumed(value: Any, bounds: CalibrationConfig | TrimConfig) -> float:
    """A learned multiplier from ``status.observed`` (calibrationFactor, latencyTrim):
    1 when absent or not a finite number, else clamped to ``bounds`` (status is
    writable by hand, and a bad value must not stop the loop)."""
    try:
        number = float(value)
    except (TypeError, ValueError):
        return 1.0
    return clamp(number, bounds.lower, bounds.upper) if math.isfinite(number) else 1.0


def resumed_samples(value: Any) -> int:
    """``status.observed.calibrationSamples``: 0 (a fresh estimate) unless a count >= 0."""
    return value if isinstance(value, int) and not isinstance(value, bool) and value >= 0 else 0


def scrape_hint(ref: TargetRef, pod_monitor_labels: Mapping[str, str]) -> str:
    """What to check when Prometheus answers but holds no series of the target's engines.

    Why: the most common cause on a real cluster is a Prometheus Operator whose
    ``podMonitorSelector`` does not match the engine PodMonitor (a kube-prometheus-stack
    selects ``release: <its release>``), and only the chart value that labels it fixes
    that.
    """
    monitor = f"PodMonitor {ref.namespace}/{deployment_name(ref.name)}"
    if pod_monitor_labels:
        shown = ", ".join(f"{k}={v}" for k, v in sorted(pod_monitor_labels.items()))
        return f"check that this Prometheus selects the engine {monitor} (labels {shown})"
    return (
        f"the engine {monitor} has no label a Prometheus Operator selects by: set the "
        "chart value engine.podMonitor.labels to what its podMonitorSelector matches "
        "(kube-prometheus-stack: release=<its release>)"
    )


def explain_unavailable(
    d: control.Decision, errors: list[str], url: str, hint: str = ""
) -> control.Decision:
    """Say in SLOMet why the loop cannot judge, and that it holds the replicas.

    Why: "tpot_ms is missing" alone does not tell an operator whether the engines are
    silent or Prometheus is down, nor that scaling is frozen on purpose. ``hint``
    (``scrape_hint``) says what to check when Prometheus answered with no engine series.
    """
    conds = []
    for c in d.conditions:
        if c.type == cnd.SLO_MET and c.reason == "MetricsUnavailable":
            silent = "no engine series" + (f"; {hint}" if hint else "")
            cause = f"Prometheus at {url}: {errors[0]}" if errors else silent
            message = (
                f"{c.message} ({cause}); holding {d.replicas} replica(s): "
                "no scale-down without metrics"
            )
            c = replace(c, message=message[:1000])
        conds.append(c)
    return replace(d, conditions=tuple(conds))


async def _observe(
    fleet_cache: FleetCache,
    settings: LoopSettings,
    spec: ServingTargetSpec,
    ref: TargetRef,
    pods: tuple[int, int, int],
) -> tuple[Observation, list[str]]:
    """The target's readings from this tick's fleet snapshot, and Prometheus' errors
    (``pods``: ready, pending and outdated pods of the Deployment)."""
    slo = spec.slo
    shape = (
        slo.tpot_percentile.quantile,
        slo.ttft_percentile.quantile,
        metrics_client.attainment_bucket(slo.tpot_ms),
    )
    fleet = await fleet_cache.snapshot(settings, shape, slo.tpot_ms)
    snap = fleet.target(ref.namespace, ref.name)
    return observation(snap, *pods), list(snap.errors)


def _record(rt: Runtime, ref: TargetRef, d: control.Decision, obs: Observation) -> None:
    """The decision's figures in the operator's own metrics (in memory, no API call)."""
    slo = next((c for c in d.conditions if c.type == cnd.SLO_MET), None)
    rt.metrics.record_observation(
        ref.namespace,
        ref.name,
        metrics_state=d.metrics_state.value,
        tpot_s=obs.tpot_ms.value / 1e3 if obs.tpot_ms.ok else None,
        ttft_s=obs.ttft_ms.value / 1e3 if obs.ttft_ms.ok else None,
        calibration_factor=d.calibration_factor,
        latency_trim=d.state.trim,
        slo_met=None if slo is None or slo.status == "Unknown" else slo.status == "True",
    )


def _apply(
    rt: Runtime,
    body: Mapping[str, Any],
    ref: TargetRef,
    spec: ServingTargetSpec,
    plan: Plan,
    d: control.Decision,
    obs: Observation,
    spread: Mapping[str, float] | None = None,
    price: PodsPrice | None = None,
) -> None:
    """Deployment (when changed), event, status. Blocking: run in a thread, and only when
    ``_writes`` says there is something to write (``spread``: the target's measured
    figure noise, as ``_writes`` saw it; ``price``: what its pod counts cost)."""
    applied = None
    if d.changed:
        price = price or ReplicaPrice.flat(plan.usd_per_replica_hour)
        applied = _apply_scale(rt, ref, spec, plan, d, price)
        rt.emit(body, "Normal", "Scaled", d.reason)
        if d.speculative_config is not None:
            drafts = "SpeculationOff" if not d.speculative_config else "DraftLengthsChanged"
            rt.emit(body, "Normal", drafts, d.speculation_why)
        rt.metrics.record_decision(ref.namespace, ref.name, *decision_labels(d))
    elif d.cap_hold_began:
        rt.emit(body, "Normal", "BatchCapHeld", d.reason)
    now, window_s = rt.now(), rt.config.loop.window_s
    seen = ServingTargetStatus.read(body.get("status"))
    updated = status_update(seen, d, obs, plan, now, window_s, spread, applied)
    if updated == seen:
        return  # nothing a user would see changed: no read, no write
    if log.isEnabledFor(logging.DEBUG):
        changed = ", ".join(status_changes(seen, updated))
        news = observed_news(seen.observed, observed_status(d, obs, now), window_s, spread)
        because = f" (beyond their noise: {', '.join(news)})" if news else ""
        log.debug("status of %s/%s: %s changed%s", ref.namespace, ref.name, changed, because)

    def mutate(stored: dict[str, Any]) -> dict[str, Any]:
        fresh = ServingTargetStatus.read(stored)
        return status_update(fresh, d, obs, plan, now, window_s, spread, applied).stored()

    rt.kube.update_status(ref.namespace, ref.name, mutate, seen=body)


def replan(rt: Runtime, body: Mapping[str, Any], d: control.Decision) -> bool:
    """Plan the target again with the acceptance its drafts were measured at and the
    lengths it serves, as with spec.workload.acceptanceRate and its lengths set to them,
    at the rate the loop plans for (``reconcile``: a plan of another shape rolls out, a
    PlanChanged event says what, a PlanKept event why the running engine stays; the plan
    keeps what it was planned with, so an operator restart plans with it again).
    Returns whether the running engine was kept (``control.plan_kept``). Blocking: run
    in a thread."""
    rt.emit(body, "Normal", "Replanned", d.speculation_why or d.reason)
    cause = reconcile.ACCEPTANCE if d.replan_acceptance is not None else reconcile.WORKLOAD
    result = reconcile.reconcile(
        rt, body, cause=cause, acceptance=d.replan_acceptance, relengths=d.replan_workload
    )
    return result != "success"  # kept, or no plan found: the engine runs on as it was


def _writes(
    rt: Runtime,
    seen: ServingTargetStatus,
    plan: Plan,
    d: control.Decision,
    obs: Observation,
    spread: Mapping[str, float] | None = None,
) -> bool:
    """Whether this decision writes anything (a Deployment, an event, status). Most ticks
    do not, and skip the thread hop ``_apply`` takes (at 1,000 targets the hop alone
    was a third of a tick's CPU)."""
    window_s = rt.config.loop.window_s
    return (
        d.changed
        or d.cap_hold_began
        or status_update(seen, d, obs, plan, rt.now(), window_s, spread) != seen
    )


# Decisions in flight at once within a tick: most take no API call and finish at once;
# the few that write (a status change, a rescale) wait on the API server in a thread,
# and this many keep a tick of 1,000 targets within its interval when many write.
TICK_WORKERS = 8


async def presence(
    body: kopf.Body,
    memo: kopf.Memo,
    uid: str | None,
    stopped: kopf.DaemonStopped,
    engine_deployments: EngineIndex,
    **_: Any,
) -> None:
    """A target's membership in the loop, for as long as kopf runs this daemon.

    Why a daemon that only waits, not a timer per target: kopf's machinery for one
    timer tick costs about a millisecond of CPU, several times the decision itself, and
    1,000 targets tick 67 times a second. A waiting daemon costs nothing, while kopf
    still decides when a target belongs to this replica (peering, deletion).
    """
    member = Member(body, memo, engine_deployments)
    members = runtime(memo).loop.members
    members.join(str(uid), member)
    try:
        await stopped.wait()
    finally:
        members.leave(str(uid), member)


async def tick(members: Members, workers: int = TICK_WORKERS) -> int:
    """One decision (``feedback``) for every member; returns how many were made.
    A failure is logged and costs only that target's decision this tick."""
    queue = iter(members.snapshot())
    done = 0

    async def work() -> None:
        nonlocal done
        for uid, m in queue:
            if not runtime(m.memo).alive(uid):  # deleted: its daemon is stopping
                continue
            meta = m.body.get("metadata") or {}
            # A task in the daemon's context, where kopf keeps its event queue; awaiting
            # it also lets kopf's watches run between decisions (most never suspend, and
            # 1,000 in a row would hold the event loop for half a second).
            try:
                decision = feedback(m.body, m.memo, m.engine_deployments)
                await asyncio.create_task(decision, context=m.context)
            except Exception:  # a bug must not stop every other target's loop
                log.exception("feedback %s/%s failed", meta.get("namespace"), meta.get("name"))
            else:
                log.debug("feedback %s/%s: ticked", meta.get("namespace"), meta.get("name"))
            done += 1

    await asyncio.gather(*(work() for _ in range(workers)))
    return done


async def run_loop(interval_s: float, members: Members) -> None:
    """Tick every ``interval_s``, from one interval after start. A tick that overruns
    delays the next one rather than starting two at once."""
    next_at = time.monotonic() + interval_s
    while True:
        await asyncio.sleep(max(next_at - time.monotonic(), 0.0))
        await tick(members)
        next_at = max(next_at + interval_s, time.monotonic())


async def start_loop(memo: kopf.Memo, interval_s: float, **_: Any) -> None:
    """Start ``run_loop`` with the operator (kopf's startup handler)."""
    members = runtime(memo).loop.members
    memo.feedback_loop = asyncio.create_task(run_loop(interval_s, members))


async def stop_loop(memo: kopf.Memo, **_: Any) -> None:
    """Stop it with the operator (kopf's cleanup handler)."""
    task = getattr(memo, "feedback_loop", None)
    if task is not None:
        task.cancel()


async def feedback(
    body: Mapping[str, Any], memo: Any, engine_deployments: EngineIndex, **_: Any
) -> None:
    """One decision for one deployed target (skips targets with no plan yet).
    ``engine_deployments``: kopf's index of the engine Deployments."""
    if not (body.get("status") or {}).get("plan"):
        return
    rt, ref = runtime(memo), TargetRef.from_body(body)
    settings, health = rt.config.loop, rt.loop.api_health
    try:
        parsed = _parsed(rt.loop, ref, body)
    except SpecError:
        return  # reconcile reports it
    spec, status, plan = parsed.spec, parsed.status, parsed.plan
    spec = with_default(spec, rt.config.default_pricing)  # as reconcile priced the plan
    if plan is None:  # hand-edited status: reconcile writes it again
        log.warning("feedback %s/%s: holding: status.plan is not a plan", ref.namespace, ref.name)
        return
    names = engine_deployment_names(ref.name, tuple(p.gpu for p in plan.pools))
    deps = [readiness.indexed_deployment(engine_deployments, ref.namespace, n) for n in names]
    try:
        unready = next((d for d in deps if d and not readiness.deployment_ready(d)), None)
        if unready is not None:  # else no API call
            await asyncio.to_thread(readiness.refresh_readiness, rt, unready)
        # pools the plan dropped go once the ones it has serve, or, where the plan was
        # made within the free GPUs (its own pods' counted free), wait for those GPUs
        held = reconcile.counts_gpus(rt, spec) and waits_for_gpus(status)
        may_prune = (unready is None and all(deps)) or held
        if may_prune and (old := obsolete_engines(engine_deployments, ref, names, rt.catalog)):
            await asyncio.to_thread(prune, rt, ref, old)
    except KubeError as err:
        health.failed(err, f"{ref.namespace}/{ref.name}")
        return  # the next tick reads again: no back-off, no traceback
    desired, ready, pending = pod_counts(deps)
    try:
        mem = _memory(rt.loop.targets, ref, spec, plan, status, desired, rt.catalog)
    except (PlannerError, UnsupportedPlan) as err:  # an edit the planner rejects
        # Reconcile reports it (Planned=False, PlannerError) and keeps the workload; the
        # loop holds too, instead of failing on every tick.
        log.warning(
            "feedback %s/%s: holding, the spec does not plan: %s", ref.namespace, ref.name, err
        )
        return
    if isinstance(mem.planner, FleetPlanner):  # each pool's ready pods weigh its steps
        ready_pods = zip(plan.pools, map(pod_counts, deps), strict=True)
        mem.planner.counted({p.gpu: counts[1] for p, counts in ready_pods})
    # A pod of this target takes its own start-up (checkpoint size, cache) unless the
    # chart sets one figure for every target.
    startup_s, scale_down_s = settings.startup_s, settings.scale_down_window_s
    if startup_s is None:
        # The target's own start-up; a lull shorter than a pod's return trip must not
        # remove a pod the next rise needs (set both chart values to choose otherwise).
        startup_s = mem.startup_s
        scale_down_s = max(scale_down_s, startup_s + settings.window_s)
    cfg = control.config_from_spec(
        spec,
        mem.planner,
        mem.price,
        startup_s=startup_s,
        metrics_window_s=settings.window_s,
        scale_down_window_s=scale_down_s,
        # read from the plan each tick: a re-plan that kept the shape changes only it
        planned_acceptance=plan_acceptance(spec, plan),
        planned_workload=plan.measured_workload,
        # the method changes only with the drafts or the spec, which rebuild the planner
        acceptance_per_decode_step=mem.planner.drafts_by_lookup,
    )
    pods = (ready, pending, outdated_pods(deps))
    obs, errors = await _observe(rt.loop.fleet, settings, spec, ref, pods)
    if isinstance(mem.planner, FleetPlanner) and obs.prompt_tokens.ok and obs.output_tokens.ok:
        # each GPU type's own step-time factor, from its pool's own series
        mem.planner.observed(obs.pool_steps, obs.prompt_tokens.value, obs.output_tokens.value)
    now_s = time.monotonic()
    d = control.decide(mem.state, obs, now_s, cfg)
    d = await _within_inventory(rt, ref, spec, plan, d, (mem.state, obs, now_s, cfg))
    hint = scrape_hint(ref, rt.config.pod_monitor_labels)
    d = explain_unavailable(d, errors, settings.prometheus_url, hint)
    before, mem.state = mem.state, d.state
    _record(rt, ref, d, obs)
    if (d.replan_acceptance, d.replan_workload) != (None, None):
        # reconcile plans and writes it, not this tick
        try:
            kept = await asyncio.to_thread(replan, rt, dict(body), d)
        except KubeError as err:
            health.failed(err, f"{ref.namespace}/{ref.name}")
            return
        if kept:
            mem.state = control.plan_kept(mem.state, before)
        health.answered()
        return
    spread = rt.loop.spread(ref.uid, settings.window_s)
    noise = spread.noise()  # judged before this tick's figures join it
    spread.add(_figures(observed_status(d, obs, "")), time.monotonic())
    if not _writes(rt, status, plan, d, obs, noise):
        health.answered()
        return
    try:
        # kopf swaps the live body's contents on the event loop when a watch event comes;
        # the thread gets a copy taken here, on the loop, so it sees one version whole
        await asyncio.to_thread(_apply, rt, dict(body), ref, spec, plan, d, obs, noise, mem.price)
    except GpusTaken as err:  # the decision never took effect: decide again next tick
        mem.state = before
        log.info("feedback %s/%s: not scaled: %s", ref.namespace, ref.name, err)
        health.answered()
        return
    except KubeError as err:  # the next tick decides again from fresh data
        health.failed(err, f"{ref.namespace}/{ref.name}")
        return
    health.answered()

"""The operator's own Prometheus metrics, in a dedicated registry.

Names follow the Prometheus conventions: a ``rooftop_`` prefix, base units in the
name (``_seconds``), ``_total`` on counters (prometheus-client appends it), ``_ratio``
for ratios, and no colons (those are for recording rules). Labels are kept to
``namespace``, ``name`` (the ServingTarget) and ``gpu_type``, plus one bounded label
(``result``, ``direction``, ``reason``, ``state``) where a metric needs it: values
outside the bounded sets are folded into ``"other"`` so a typo can never explode
cardinality.

The controller calls the ``record_*`` helpers; ``forget`` drops every series of a
deleted target. Each helper is a bound method of ``DEFAULT`` (an ``OperatorMetrics``
on ``REGISTRY``); tests build their own ``OperatorMetrics`` on a fresh registry.
Optional values passed as ``None`` remove the series instead of leaving a stale one.
"""

from __future__ import annotations

import threading
from collections.abc import Iterable, Mapping, Sequence
from typing import Final, Literal
from wsgiref.simple_server import WSGIServer

import prometheus_client
from prometheus_client import CollectorRegistry, Counter, Gauge
from prometheus_client.metrics import MetricWrapperBase

PREFIX: Final = "rooftop_"
TARGET_LABELS: Final = ("namespace", "name")

ReconcileResult = Literal["success", "error", "retry", "skipped"]
Direction = Literal["up", "down", "replan"]
MetricsState = Literal["ok", "missing", "stale", "nan"]

RECONCILE_RESULTS: Final[tuple[str, ...]] = ("success", "error", "retry", "skipped", "other")
DIRECTIONS: Final[tuple[str, ...]] = ("up", "down", "replan", "other")
REASONS: Final[tuple[str, ...]] = (
    "slo_violation",  # observed latency above the SLO
    "overprovisioned",  # SLO met with room to spare: a cheaper plan fits
    "load_change",  # observed request rate differs from the planned one
    "calibration",  # observed/predicted step time moved the plan
    "acceptance",  # the drafts' measured acceptance re-planned speculative decoding
    "workload",  # the served prompt and output lengths planned the target again
    "spec_change",  # the user edited the ServingTarget
    "budget",  # the plan no longer fits the budget
    "infeasible",  # no plan meets SLO and budget
    "other",
)
METRICS_STATES: Final[tuple[str, ...]] = ("ok", "missing", "stale", "nan")

# Exposed sample names (counters with their _total suffix).
RECONCILES_TOTAL: Final = "rooftop_reconciles_total"
SCALING_DECISIONS_TOTAL: Final = "rooftop_scaling_decisions_total"
PREDICTED_TPOT_SECONDS: Final = "rooftop_predicted_tpot_seconds"
PREDICTED_TTFT_SECONDS: Final = "rooftop_predicted_ttft_seconds"
OBSERVED_TPOT_SECONDS: Final = "rooftop_observed_tpot_seconds"
OBSERVED_TTFT_SECONDS: Final = "rooftop_observed_ttft_seconds"
SLO_TPOT_SECONDS: Final = "rooftop_slo_tpot_seconds"
SLO_TTFT_SECONDS: Final = "rooftop_slo_ttft_seconds"
# The SLO's percentile as a quantile (p99 -> 0.99): the chart's burn-rate alerts need it
# to know each target's error budget (1 - quantile).
SLO_TPOT_QUANTILE_RATIO: Final = "rooftop_slo_tpot_quantile_ratio"
SLO_TTFT_QUANTILE_RATIO: Final = "rooftop_slo_ttft_quantile_ratio"
CALIBRATION_FACTOR_RATIO: Final = "rooftop_calibration_factor_ratio"
LATENCY_TRIM_RATIO: Final = "rooftop_latency_trim_ratio"
PLAN_COST_USD_PER_HOUR: Final = "rooftop_plan_cost_usd_per_hour"
PLAN_GPUS: Final = "rooftop_plan_gpus"
BUDGET_USD_PER_HOUR: Final = "rooftop_budget_usd_per_hour"
REPLICAS_DESIRED: Final = "rooftop_replicas_desired"
REPLICAS_READY: Final = "rooftop_replicas_ready"
TARGET_FEASIBLE: Final = "rooftop_target_feasible"
SLO_MET: Final = "rooftop_slo_met"
METRICS_STATE: Final = "rooftop_metrics_state"

METRIC_NAMES: Final[tuple[str, ...]] = (
    RECONCILES_TOTAL,
    SCALING_DECISIONS_TOTAL,
    PREDICTED_TPOT_SECONDS,
    PREDICTED_TTFT_SECONDS,
    OBSERVED_TPOT_SECONDS,
    OBSERVED_TTFT_SECONDS,
    SLO_TPOT_SECONDS,
    SLO_TTFT_SECONDS,
    SLO_TPOT_QUANTILE_RATIO,
    SLO_TTFT_QUANTILE_RATIO,
    CALIBRATION_FACTOR_RATIO,
    LATENCY_TRIM_RATIO,
    PLAN_COST_USD_PER_HOUR,
    PLAN_GPUS,
    BUDGET_USD_PER_HOUR,
    REPLICAS_DESIRED,
    REPLICAS_READY,
    TARGET_FEASIBLE,
    SLO_MET,
    METRICS_STATE,
)

_Key = tuple[str, str]  # (namespace, name)
_Series = tuple[MetricWrapperBase, tuple[str, ...]]


def _bounded(value: str, allowed: Iterable[str]) -> str:
    return value if value in allowed else "other"


def _target_gauge(registry: CollectorRegistry, name: str, doc: str, *extra: str) -> Gauge:
    return Gauge(name, doc, (*TARGET_LABELS, *extra), registry=registry)


class OperatorMetrics:
    """All operator metrics on one registry, plus the label sets each target owns."""

    def __init__(self, registry: CollectorRegistry | None = None) -> None:
        self.registry = registry if registry is not None else CollectorRegistry()
        self._lock = threading.Lock()
        self._owned: dict[_Key, set[_Series]] = {}
        self._gpu: dict[_Key, tuple[str, ...]] = {}  # the GPU types of each target's plan
        r = self.registry
        self.reconciles = Counter(
            RECONCILES_TOTAL, "Reconcile passes by result.", ("result",), registry=r
        )
        self.decisions = Counter(
            SCALING_DECISIONS_TOTAL,
            "Scaling decisions taken, by direction and reason.",
            (*TARGET_LABELS, "direction", "reason"),
            registry=r,
        )
        g = _target_gauge
        self.predicted_tpot = g(r, PREDICTED_TPOT_SECONDS, "Planner's predicted TPOT.")
        self.predicted_ttft = g(r, PREDICTED_TTFT_SECONDS, "Planner's predicted TTFT.")
        self.observed_tpot = g(r, OBSERVED_TPOT_SECONDS, "Observed TPOT at the SLO percentile.")
        self.observed_ttft = g(r, OBSERVED_TTFT_SECONDS, "Observed TTFT at the SLO percentile.")
        self.slo_tpot = g(r, SLO_TPOT_SECONDS, "TPOT bound from spec.slo.")
        self.slo_ttft = g(r, SLO_TTFT_SECONDS, "TTFT bound from spec.slo (absent if unset).")
        self.slo_tpot_q = g(r, SLO_TPOT_QUANTILE_RATIO, "Quantile the TPOT bound applies to.")
        self.slo_ttft_q = g(
            r, SLO_TTFT_QUANTILE_RATIO, "Quantile the TTFT bound applies to (absent if unset)."
        )
        self.calibration = g(
            r, CALIBRATION_FACTOR_RATIO, "Observed over predicted decode step time."
        )
        self.trim = g(r, LATENCY_TRIM_RATIO, "Multiplier on the rate the planner sizes for.")
        self.cost = g(r, PLAN_COST_USD_PER_HOUR, "Cost of the chosen plan.", "gpu_type")
        self.gpus = g(r, PLAN_GPUS, "GPUs in the chosen plan (replicas x tp).", "gpu_type")
        self.budget = g(r, BUDGET_USD_PER_HOUR, "Budget from spec.budget.")
        self.replicas_desired = g(r, REPLICAS_DESIRED, "Replicas the operator asks for.")
        self.replicas_ready = g(r, REPLICAS_READY, "Replicas that are ready.")
        self.feasible = g(r, TARGET_FEASIBLE, "1 if a plan meets SLO and budget, else 0.")
        self.slo_met = g(r, SLO_MET, "1 if observed latency meets the SLO, else 0.")
        self.metrics_state = g(
            r, METRICS_STATE, "1 for the current state of the engine metrics.", "state"
        )

    # -- bookkeeping ---------------------------------------------------------------

    def _set(self, gauge: Gauge, key: _Key, value: float | None, *extra: str) -> None:
        """Set a target's series, or remove it when ``value`` is None."""
        labels = (*key, *extra)
        with self._lock:
            if value is None:
                self._drop(gauge, labels)
                return
            gauge.labels(*labels).set(value)
            self._owned.setdefault(key, set()).add((gauge, labels))

    def _drop(self, metric: MetricWrapperBase, labels: tuple[str, ...]) -> None:
        metric.remove(*labels)
        self._owned.get((labels[0], labels[1]), set()).discard((metric, labels))

    # -- helpers for the controller ---------------------------------------------

    def record_reconcile(self, result: ReconcileResult | str) -> None:
        """Count one reconcile pass (``success``, ``error``, ``retry`` or ``skipped``)."""
        self.reconciles.labels(_bounded(result, RECONCILE_RESULTS)).inc()

    def record_decision(
        self, namespace: str, name: str, direction: Direction | str, reason: str
    ) -> None:
        """Count one scaling decision; see ``DIRECTIONS`` and ``REASONS``."""
        labels = (namespace, name, _bounded(direction, DIRECTIONS), _bounded(reason, REASONS))
        with self._lock:
            self.decisions.labels(*labels).inc()
            self._owned.setdefault((namespace, name), set()).add((self.decisions, labels))

    def record_plan(
        self,
        namespace: str,
        name: str,
        *,
        feasible: bool,
        slo_tpot_s: float,
        budget_usd_per_hour: float,
        slo_ttft_s: float | None = None,
        slo_quantiles: tuple[float, float] = (0.9, 0.9),
        gpu_type: str | None = None,
        gpus: int | None = None,
        usd_per_hour: float | None = None,
        predicted_tpot_s: float | None = None,
        predicted_ttft_s: float | None = None,
        pools: Sequence[tuple[str, int, float]] = (),
    ) -> None:
        """Publish the spec's SLO/budget and the plan chosen for it.

        Args:
            feasible: whether the planner found a plan meeting SLO and budget.
            slo_tpot_s, slo_ttft_s: SLO bounds in seconds (``ttft`` optional).
            slo_quantiles: the (TPOT, TTFT) percentiles as quantiles (p99 -> 0.99).
            budget_usd_per_hour: spend ceiling of the whole target.
            gpu_type: catalog GPU id of the plan; None removes the plan series.
            gpus: replicas x tp of the plan.
            usd_per_hour: cost of the plan.
            predicted_tpot_s, predicted_ttft_s: the planner's predictions, seconds.
            pools: a mixed fleet's (GPU id, GPUs, USD/h) per pool: one GPU and cost
                series per GPU type instead of ``gpu_type``'s one.
        """
        key = (namespace, name)
        self._set(self.feasible, key, 1.0 if feasible else 0.0)
        self._set(self.slo_tpot, key, slo_tpot_s)
        self._set(self.slo_ttft, key, slo_ttft_s)
        self._set(self.slo_tpot_q, key, slo_quantiles[0])
        self._set(self.slo_ttft_q, key, None if slo_ttft_s is None else slo_quantiles[1])
        self._set(self.budget, key, budget_usd_per_hour)
        self._set(self.predicted_tpot, key, predicted_tpot_s)
        self._set(self.predicted_ttft, key, predicted_ttft_s)
        by_type: dict[str, tuple[float | None, float | None]] = {
            g: (float(n), usd) for g, n, usd in pools
        }
        if not pools and gpu_type is not None:
            by_type = {gpu_type: (None if gpus is None else float(gpus), usd_per_hour)}
        self._set_plan_gpus(key, by_type)

    def _set_plan_gpus(
        self, key: _Key, by_type: Mapping[str, tuple[float | None, float | None]]
    ) -> None:
        """The plan's GPUs and cost, one series per GPU type (none: no plan)."""
        with self._lock:
            old = self._gpu.pop(key, ())
            if by_type:
                self._gpu[key] = tuple(by_type)
        for gone in set(old) - set(by_type):  # a re-plan onto other GPU types
            self._set(self.cost, key, None, gone)
            self._set(self.gpus, key, None, gone)
        for gpu_type, (gpus, usd_per_hour) in by_type.items():
            self._set(self.cost, key, usd_per_hour, gpu_type)
            self._set(self.gpus, key, gpus, gpu_type)

    def record_observation(
        self,
        namespace: str,
        name: str,
        *,
        metrics_state: MetricsState | str,
        tpot_s: float | None = None,
        ttft_s: float | None = None,
        calibration_factor: float | None = None,
        latency_trim: float | None = None,
        slo_met: bool | None = None,
    ) -> None:
        """Publish what the feedback loop measured; None removes a series.

        Args:
            metrics_state: ``ok``, ``missing``, ``stale`` or ``nan`` (the status field).
            tpot_s, ttft_s: observed latency at the SLO percentile, seconds.
            calibration_factor: observed over predicted decode step time.
            latency_trim: the multiplier on the rate the planner sizes for, learned
                from the share of requests within the TPOT bound.
            slo_met: whether the observation meets the SLO (None: unknown).
        """
        key = (namespace, name)
        self._set(self.observed_tpot, key, tpot_s)
        self._set(self.observed_ttft, key, ttft_s)
        self._set(self.calibration, key, calibration_factor)
        self._set(self.trim, key, latency_trim)
        self._set(self.slo_met, key, None if slo_met is None else float(slo_met))
        self.record_metrics_state(namespace, name, metrics_state)

    def record_metrics_state(self, namespace: str, name: str, state: MetricsState | str) -> None:
        """Enum-style: 1 on the current ``state`` series, 0 on the others."""
        if state not in METRICS_STATES:
            raise ValueError(f"metrics_state {state!r} not in {METRICS_STATES}")
        for each in METRICS_STATES:
            self._set(self.metrics_state, (namespace, name), float(each == state), each)

    def record_replicas(self, namespace: str, name: str, *, desired: int, ready: int) -> None:
        """Publish desired and ready replica counts."""
        self._set(self.replicas_desired, (namespace, name), float(desired))
        self._set(self.replicas_ready, (namespace, name), float(ready))

    def forget(self, namespace: str, name: str) -> None:
        """Remove every series of a deleted target."""
        with self._lock:
            for metric, labels in self._owned.pop((namespace, name), set()):
                metric.remove(*labels)
            self._gpu.pop((namespace, name), None)


REGISTRY: Final = CollectorRegistry()
DEFAULT: Final = OperatorMetrics(REGISTRY)

record_reconcile = DEFAULT.record_reconcile
record_decision = DEFAULT.record_decision
record_plan = DEFAULT.record_plan
record_observation = DEFAULT.record_observation
record_metrics_state = DEFAULT.record_metrics_state
record_replicas = DEFAULT.record_replicas
forget = DEFAULT.forget


def start_http_server(
    port: int, host: str = "0.0.0.0", registry: CollectorRegistry = REGISTRY
) -> tuple[WSGIServer, threading.Thread]:
    """Serve ``registry`` on ``http://host:port/metrics`` from a daemon thread.

    Returns the server and its thread (``server.shutdown()`` stops it; port 0 picks a
    free port, read it from ``server.server_port``).
    """
    return prometheus_client.start_http_server(port, addr=host, registry=registry)

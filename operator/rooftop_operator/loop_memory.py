"""What the feedback loop keeps between ticks, held on the operator's ``Runtime``.

One ``LoopMemory`` per operator process (``Runtime.loop``): the targets this replica
decides for (``Members``, kept by their ``presence`` daemons), one tick's Prometheus
snapshot shared by the targets of an SLO shape (``FleetCache``), the API server's health
(``ApiHealth``), and per target uid its parsed spec, status and plan (``ParsedTarget``),
its controller state (``TargetMemory``) and how far its status figures wander
(``FigureSpread``). A deleted target's entries go with its
DELETED event (``LoopMemory.forget``). Nothing here is a module global, so each test's
runtime starts empty and two operators in one process never share a target's state.
"""

from __future__ import annotations

import asyncio
import contextvars
import logging
import time
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

import kopf

from rooftop_api.spec import ServingTargetSpec, ServingTargetStatus
from rooftop_control import control, sizing
from rooftop_operator import metrics_client
from rooftop_operator.figure_spread import FigureSpread
from rooftop_operator.kube import KubeError
from rooftop_operator.metrics_client import MetricsClient
from rooftop_operator.settings import LoopSettings
from rooftop_planner.plan import Plan
from rooftop_planner.pricing import PodsPrice

log = logging.getLogger("rooftop_operator.loop")

EngineIndex = Mapping[tuple[str, str], Any]  # kopf.Index: (namespace, name) -> a Store


@dataclass(frozen=True)
class Member:
    """A target the loop decides for: kopf's live view of its body (kept current by the
    watch), its per-object memo, the engine Deployments' index, and the context kopf
    runs its handlers in (``kopf.event`` finds kopf's event queue there)."""

    body: Mapping[str, Any]
    memo: kopf.Memo
    engine_deployments: EngineIndex
    context: contextvars.Context = field(default_factory=contextvars.copy_context)


class Members:
    """The targets this replica's loop runs for: those whose ``presence`` daemon kopf
    runs now. kopf stops every daemon while peering pauses a standby replica, and a
    target's when its filter stops matching (deleted), so this is exactly the set the
    per-target timers used to tick, kept without a timer each."""

    def __init__(self) -> None:
        self._by_uid: dict[str, Member] = {}

    def join(self, uid: str, member: Member) -> None:
        if not self._by_uid:
            log.info("feedback loop: running")
        self._by_uid[uid] = member

    def leave(self, uid: str, member: Member) -> None:
        if self._by_uid.get(uid) is member:  # not a successor spawned meanwhile
            del self._by_uid[uid]
            if not self._by_uid:
                log.info("feedback loop: idle (no targets, or another replica is active)")

    def snapshot(self) -> list[tuple[str, Member]]:
        return list(self._by_uid.items())

    def __len__(self) -> int:
        return len(self._by_uid)


QueryShape = tuple[float, float, float | None]  # TPOT and TTFT quantiles, attainment bucket


class FleetCache:
    """One set of grouped PromQL queries per tick for every target that shares an SLO
    shape (percentiles and attainment bucket), instead of a set per target: what the
    loop asks Prometheus grows with the shapes in use, not with the targets. A snapshot
    serves the next half interval: one tick's targets share it."""

    def __init__(self) -> None:
        self._snapshots: dict[QueryShape, tuple[float, metrics_client.FleetMetrics]] = {}
        self._lock = asyncio.Lock()

    async def snapshot(
        self, settings: LoopSettings, shape: QueryShape, tpot_slo_ms: float
    ) -> metrics_client.FleetMetrics:
        async with self._lock:  # one refresh at a time: the others then reuse it
            now = time.monotonic()
            cached = self._snapshots.get(shape)
            if cached is not None and now - cached[0] < settings.interval_s / 2:
                return cached[1]
            queries = metrics_client.fleet_queries(settings.window, shape[0], shape[1], tpot_slo_ms)
            async with MetricsClient(
                settings.prometheus_url, settings.stale_after_s, auth=settings.prometheus_auth
            ) as client:
                by_pool = metrics_client.pool_queries(settings.window)
                fleet = await client.fleet_snapshot(queries, by_pool)
            self._snapshots[shape] = (time.monotonic(), fleet)
            return fleet


class ApiHealth:
    """One warning per API server outage, not one per target and tick: while the server
    is unreachable every target's tick fails the same way."""

    def __init__(self) -> None:
        self.down = False

    def failed(self, err: KubeError, target: str) -> None:
        """Log ``err``: a transient one once per outage, any other one per target."""
        if not err.transient:
            log.warning("feedback %s: %s", target, err)
        elif not self.down:
            self.down = True
            log.warning(
                "Kubernetes API unavailable (%s); the loop skips ticks until it answers", err
            )
        else:
            log.debug("still unavailable: %s", err)

    def answered(self) -> None:
        """A call went through: the outage, if any, is over."""
        if self.down:
            self.down = False
            log.info("Kubernetes API answers again; the loop resumes")


@dataclass
class TargetMemory:
    """One target's controller state and planner adapter (with its cache), for the spec
    generation and engine shape in ``key``."""

    key: tuple[int, tuple[object, ...]]
    planner: sizing.PlanTargetPlanner  # a mixed fleet's: ``sizing.FleetPlanner``
    state: control.ControllerState
    startup_s: float  # this target's pod start-up (rooftop_planner.lifecycle)
    # what its replica counts cost (owned GPUs first; a mixed fleet's cheapest pods)
    price: PodsPrice


@dataclass(frozen=True)
class ParsedTarget:
    """A target's spec, status and plan as models, with what they were parsed from: the
    spec generation and the stored status (compared, not parsed, on the next tick)."""

    generation: int
    stored_status: dict[str, Any]
    spec: ServingTargetSpec
    status: ServingTargetStatus
    plan: Plan | None  # None when status holds no plan (reconcile writes one)


@dataclass
class LoopMemory:
    """Everything the feedback loop keeps between ticks (see the module docstring)."""

    members: Members = field(default_factory=lambda: Members())
    fleet: FleetCache = field(default_factory=lambda: FleetCache())
    api_health: ApiHealth = field(default_factory=lambda: ApiHealth())
    targets: dict[str, TargetMemory] = field(default_factory=dict)
    parsed: dict[str, ParsedTarget] = field(default_factory=dict)
    spreads: dict[str, FigureSpread] = field(default_factory=dict)

    def spread(self, uid: str, window_s: float) -> FigureSpread:
        """How far the target's status figures move by themselves over the metrics
        window ``window_s`` (s); kept across spec edits: how much its traffic's figures
        wander does not change with the spec."""
        return self.spreads.setdefault(uid, FigureSpread(lag_s=window_s))

    def forget(self, uid: str) -> None:
        """Drop a deleted target's parsed models, controller state and figure spread."""
        self.targets.pop(uid, None)
        self.parsed.pop(uid, None)
        self.spreads.pop(uid, None)

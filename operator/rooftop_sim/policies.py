"""Scaling policies the simulator compares.

- ``rooftop``: the operator's controller: ``control.decide`` itself, not a copy.
- ``static-peak``: the planner's size for the trace's peak rate (the busiest minute),
  fixed for the whole run: what capacity planning without autoscaling buys.
- ``queue-threshold``: a KEDA/HPA-style autoscaler on vLLM gauges, as llm-d and
  vLLM production-stack configure it: target 5 waiting requests per replica or 80 % KV
  usage (HPA formula ``ceil(ready * metric / target)``, 10 % tolerance, scale-up at
  most doubles per decision, scale-down stabilized over 300 s). It knows nothing of
  the latency SLO.
- ``oracle``: hindsight; see ``sim.oracle``.
- ``static-fit``: ``static-peak``'s batch cap with the fewest fixed replicas that meet
  the SLO on the trace, found in hindsight (``sim.oracle.static_fit``): the fair
  static baseline where the planner's prior sizes ``static-peak`` too small.
"""

from __future__ import annotations

import math
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, field, replace

from rooftop_api.spec import MeasuredWorkload
from rooftop_control.control import (
    ControllerConfig,
    ControllerState,
    Decision,
    WorkloadReplan,
    carried_over,
    clamp_replicas,
    decide,
    initial_state,
    plan_kept,
    replica_limits,
)
from rooftop_control.readings import Observation
from rooftop_control.sizing import PlanTargetPlanner
from rooftop_planner.plan import Plan
from rooftop_planner.pricing import PodsPrice, replica_price


@dataclass
class FixedPolicy:
    """The same replicas and batch cap throughout."""

    replicas: int
    cap: int
    name: str = "static-peak"

    def start(self) -> tuple[int, int]:
        return self.replicas, self.cap

    def decide(self, now_s: float, obs: Observation) -> tuple[int, int]:
        return self.replicas, self.cap


@dataclass(frozen=True)
class Replanned:
    """The target planned again (a plan of one GPU type) and the replicas of its shape
    the free GPUs hold (None: not counted)."""

    plan: Plan
    inventory_replicas: int | None = None


# Plans the target again with a measured acceptance and served lengths (None: the
# spec's) at a rate (req/s; None: the spec's), as the operator's reconcile does; None
# where no plan of one GPU type is found.
Replanner = Callable[[float | None, MeasuredWorkload | None, float | None], Replanned | None]


@dataclass(frozen=True)
class Reshape:
    """What the policy's pods run from now on, when the loop changed it: a plan of the
    target (its shape; the loop scales it), what its replica counts cost and the most
    pods the budget and limits allow at that price."""

    plan: Plan
    price: PodsPrice
    max_pods: int


@dataclass
class RooftopPolicy:
    """The operator's closed loop, driven by simulated scrapes.

    ``replanner`` plans the target again at a measured acceptance and served lengths
    (the operator's reconcile with them; None: the plan stays), ``reshape`` is what the
    pods run once the loop changed their drafts or their plan (None: as started), which
    the cluster reads after each decision.
    """

    config: ControllerConfig
    replicas: int
    cap: int
    name: str = "rooftop"
    decisions: list[Decision] = field(default_factory=list)
    replanner: Replanner | None = None
    reshape: Reshape | None = None

    def __post_init__(self) -> None:
        self.state = initial_state(self.replicas, self.cap)

    def start(self) -> tuple[int, int]:
        return self.state.replicas, self.state.max_num_seqs

    def decide(self, now_s: float, obs: Observation) -> tuple[int, int]:
        before = self.state
        d = decide(self.state, obs, now_s, self.config)
        self.state = d.state
        self.decisions.append(d)
        planner = self.config.planner
        if not isinstance(planner, PlanTargetPlanner):
            return d.replicas, d.max_num_seqs
        if (d.replan_acceptance, d.replan_workload) != (None, None):
            asked = d.replan_acceptance, d.replan_workload
            if self.replanner is None or not self._replanned(planner, *asked):
                self.state = plan_kept(self.state, before)
        elif d.speculative_config is not None:
            drafts = d.speculative_config
            plan = replace(planner.plan, speculative_config=drafts, speculative_note="")
            self._run(plan, planner.respeculated(drafts), self.config.price, self.state)
        return self.state.replicas, self.state.max_num_seqs

    def _replanned(
        self,
        planner: PlanTargetPlanner,
        acceptance: float | None,
        relengths: WorkloadReplan | None,
    ) -> bool:
        """As the operator's reconcile with the measured ``acceptance`` and the served
        lengths (None: the ones planned with so far, ``planner.plan``'s), at the loop's
        rate where it re-plans with lengths (else the spec's): a plan of another shape
        is deployed at its own batch cap, with the pods that carry the load (a re-plan
        with lengths only where it pays, ``WorkloadReplan``); the same shape (or none
        found, or one that does not pay) keeps running, planned with them from now on.
        Returns whether a plan of another shape runs from now on."""
        if acceptance is None:
            acceptance = planner.plan.measured_acceptance
        workload = planner.plan.measured_workload if relengths is None else relengths.workload
        rate = None if relengths is None else relengths.requests_per_second
        found = None if self.replanner is None else self.replanner(acceptance, workload, rate)
        if (
            found is not None
            and relengths is not None
            and not relengths.pays(found.plan.usd_per_hour)
        ):
            found = None
        if found is None or found.plan.shape == planner.plan.shape:
            self.config = replace(
                self.config,
                planned_acceptance=acceptance or self.config.planned_acceptance,
                planned_workload=workload,
            )
            return False
        plan = replace(found.plan, measured_acceptance=acceptance, measured_workload=workload)
        spec = planner.written
        price = replica_price(spec, planner.catalog, plan.gpu, plan.tp)
        self.config = replace(self.config, inventory_replicas=found.inventory_replicas)
        lower, upper = replica_limits(replace(self.config, price=price))
        pods = plan.replicas
        if relengths is not None:
            pods = relengths.pods(plan.replicas)
        state = replace(
            self.state,
            replicas=clamp_replicas(pods, lower, upper),
            max_num_seqs=plan.max_num_seqs,
        )
        self._run(plan, PlanTargetPlanner(spec, plan, planner.catalog), price, state)
        return True

    def _run(
        self, plan: Plan, planner: PlanTargetPlanner, price: PodsPrice, state: ControllerState
    ) -> None:
        """Pods of ``plan`` from now on, as the operator does once the pods' engine
        changed: a planner for it, and what the loop learned carried over
        (``loop._memory``)."""
        self.config = replace(
            self.config,
            planner=planner,
            price=price,
            planned_acceptance=planner.planned_acceptance,
            planned_workload=plan.measured_workload,
            acceptance_per_decode_step=planner.drafts_by_lookup,
        )
        self.state = carried_over(state)
        self.reshape = Reshape(plan, price, replica_limits(self.config)[1])


@dataclass
class QueueThresholdPolicy:
    """HPA on ``num_requests_waiting`` (per replica) and ``kv_cache_usage_perc``.

    Attributes:
        replicas / cap: initial size and the (fixed) batch cap.
        min_replicas / max_replicas: HPA's bounds.
        waiting_target: average waiting requests per ready replica.
        kv_target: average KV usage ratio.
        tolerance: no change while metric / target is within 1 +- tolerance.
        scale_down_window_s: HPA's scale-down stabilization window, s.
    """

    replicas: int
    cap: int
    min_replicas: int = 1
    max_replicas: int = 16
    waiting_target: float = 5.0
    kv_target: float = 0.8
    tolerance: float = 0.1
    scale_down_window_s: float = 300.0
    name: str = "queue-threshold"

    def __post_init__(self) -> None:
        self.current = self.replicas
        self.history: deque[tuple[float, int]] = deque()

    def start(self) -> tuple[int, int]:
        return self.current, self.cap

    def decide(self, now_s: float, obs: Observation) -> tuple[int, int]:
        ready = obs.ready_replicas
        if ready <= 0 or not (obs.waiting.ok and obs.kv_usage_ratio.ok):
            return self.current, self.cap  # HPA skips a metric it cannot read
        ratio = max(
            obs.waiting.value / ready / self.waiting_target,
            obs.kv_usage_ratio.value / self.kv_target,
        )
        wanted = self.current
        if abs(ratio - 1.0) > self.tolerance:
            wanted = min(math.ceil(ready * ratio), 2 * max(self.current, 1))
        wanted = clamp_replicas(wanted, self.min_replicas, self.max_replicas)
        self.history.append((now_s, wanted))
        while self.history[0][0] <= now_s - self.scale_down_window_s:
            self.history.popleft()
        if wanted >= self.current:
            self.current = wanted
        else:
            self.current = min(self.current, max(n for _, n in self.history))
        return self.current, self.cap


@dataclass
class SchedulePolicy:
    """Replicas from a precomputed schedule: ``replicas[k]`` for [k*step, (k+1)*step).

    ``lead_s``: ask for each window's replicas this long before it starts (and keep the
    ones needed now): with pods that take ``lead_s`` to start, they are ready in time.
    """

    replicas: list[int]
    step_s: float
    cap: int
    name: str = "oracle"
    lead_s: float = 0.0

    def at(self, t_s: float) -> int:
        k = min(int(t_s // self.step_s), len(self.replicas) - 1)
        return self.replicas[max(k, 0)]

    def wanted(self, t_s: float) -> int:
        return max(self.at(t_s), self.at(t_s + self.lead_s)) if self.lead_s else self.at(t_s)

    def start(self) -> tuple[int, int]:
        return self.wanted(0.0), self.cap

    def decide(self, now_s: float, obs: Observation) -> tuple[int, int]:
        return self.wanted(now_s), self.cap

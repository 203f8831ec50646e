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
from dataclasses import dataclass, field, replace

from rooftop_control.control import (
    ControllerConfig,
    Decision,
    carried_over,
    clamp_replicas,
    decide,
    initial_state,
)
from rooftop_control.readings import Observation
from rooftop_control.sizing import PlanTargetPlanner


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


@dataclass
class RooftopPolicy:
    """The operator's closed loop, driven by simulated scrapes."""

    config: ControllerConfig
    replicas: int
    cap: int
    name: str = "rooftop"
    decisions: list[Decision] = field(default_factory=list)
    # the --speculative-config the loop last chose for the pods (None: as planned)
    speculative_config: str | None = None

    def __post_init__(self) -> None:
        self.state = initial_state(self.replicas, self.cap)

    def start(self) -> tuple[int, int]:
        return self.state.replicas, self.state.max_num_seqs

    def decide(self, now_s: float, obs: Observation) -> tuple[int, int]:
        d = decide(self.state, obs, now_s, self.config)
        self.state = d.state
        self.decisions.append(d)
        planner = self.config.planner
        if d.speculative_config is not None and isinstance(planner, PlanTargetPlanner):
            # as the operator does once the pods' engine changed: a planner for it, and
            # what the loop learned carried over (``loop._memory``)
            self.speculative_config = d.speculative_config
            self.config = replace(self.config, planner=planner.respeculated(d.speculative_config))
            self.state = carried_over(self.state)
        return d.replicas, d.max_num_seqs


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
